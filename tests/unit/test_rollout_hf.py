"""The hf rollout engine: sampling controls, stops, and log-probs that match the trainer's."""

from __future__ import annotations

import pytest
import torch

from trainer.components.batch import batch_from_rollout, concat_batches
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.ops.logprobs import response_logprobs
from trainer.rollout.base import SamplingParams
from trainer.rollout.hf import HFRolloutEngine, sample_next


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    return model, tok


def _prompts(tok):
    return [tok.encode("What is 3 + 5?"), tok.encode("What is 12 + 1? Answer with just the number.")]


def test_shapes_groups_and_logprobs_match_trainer(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], seed=0)
    out = eng.generate(_prompts(tok), SamplingParams(n=3, temperature=0.8, max_new_tokens=7))
    assert len(out) == 6 and out.group_index == [0, 0, 0, 1, 1, 1]
    assert all(len(r) == len(lp) <= 7 for r, lp in zip(out.response_ids, out.response_logprobs))
    batch = batch_from_rollout(out, pad_token_id=tok.pad_token_id)
    for share in (True, False):
        with torch.no_grad():
            lp, _ = response_logprobs(model, batch, temperature=0.8, share_prompts=share)
        diff = ((lp - batch.rollout_logprobs) * batch.response_mask).abs().max().item()
        assert diff < 1e-5, (share, diff)


def test_identical_rows_prefilled_once_decode_as_if_each_had_its_own(tiny):
    """A prompt's samples share one prefill whose cache is copied to each row: interleaved copies of two
    prompts (of different lengths, so the padding differs) decode greedily exactly as each prompt alone."""
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    p, q = _prompts(tok)
    greedy = SamplingParams(greedy=True, max_new_tokens=6)
    alone = {name: eng.decode_rows([row], [6], greedy, None) for name, row in (("p", p), ("q", q))}
    toks, logps, finish = eng.decode_rows([p, q, p, p, q], [6, 6, 3, 6, 6], greedy, None)
    for i, name in enumerate("pqppq"):
        n = 3 if i == 2 else 6  # a row's own budget still holds after its cache was copied
        assert toks[i] == alone[name][0][0][:n]
        assert logps[i] == pytest.approx(alone[name][1][0][:n], abs=1e-5)
    assert finish == ["length"] * 5


def test_greedy_is_deterministic_and_topk1_equals_greedy(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], seed=0)
    g1 = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=6))
    g2 = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=6))
    k1 = eng.generate(_prompts(tok), SamplingParams(top_k=1, temperature=1.0, max_new_tokens=6))
    assert g1.response_ids == g2.response_ids == k1.response_ids


def test_same_seed_same_samples(tiny):
    model, tok = tiny
    runs = [HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=7).generate(
        _prompts(tok), SamplingParams(n=2, max_new_tokens=5)).response_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_stop_tokens_end_responses(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    free = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=6))
    stop_tok = free.response_ids[0][2]  # make the third greedy token of prompt 0 a stop token
    out = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=[stop_tok]))
    first = free.response_ids[0].index(stop_tok)
    assert out.response_ids[0] == free.response_ids[0][:first + 1] and out.finish_reasons[0] == "stop"
    assert all(f in ("stop", "length") for f in out.finish_reasons)
    assert free.finish_reasons == ["length", "length"]


def test_top_p_filters_unlikely_tokens():
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 4.0, -5.0, -5.0]]).repeat(2000, 1)
    toks, lps = sample_next(logits, SamplingParams(top_p=0.5), torch.Generator().manual_seed(0))
    assert set(toks.tolist()) == {0}  # token 0 alone holds > 0.5 of the mass
    assert torch.allclose(lps, torch.log_softmax(logits, -1)[:, 0])  # reported under the unfiltered distribution
    toks, _ = sample_next(logits, SamplingParams(top_k=2), torch.Generator().manual_seed(0))
    assert set(toks.tolist()) == {0, 1}


def test_update_weights_changes_samples(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    before = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=4)).response_logprobs
    new = [(n, p.detach() * 0.5) for n, p in model.named_parameters()]
    eng.update_weights(new)
    assert eng.version == 1
    after = eng.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=4)).response_logprobs
    assert before != after
    assert torch.equal(next(model.parameters()), new[0][1] * 2)  # the trainer's copy is untouched


def test_concat_keeps_groups_distinct(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    a = batch_from_rollout(eng.generate(_prompts(tok)[:1], SamplingParams(n=2, max_new_tokens=3)), pad_token_id=0)
    b = batch_from_rollout(eng.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=5)), pad_token_id=0)
    c = concat_batches([a, b], pad_token_id=0)
    assert c.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert c.responses.shape == (6, 5) and c.prompt_len == b.prompt_len
    # prompts stay left-aligned to column P and responses start at P
    assert torch.equal(c.responses[:2, :3], a.responses)
    assert torch.equal(c.input_ids[:2, c.prompt_len:c.prompt_len + 3], a.responses)
