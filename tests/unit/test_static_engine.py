"""The static rollout engine against the hf engine on a tiny model (CPU, eager decode step)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.errors import ModelError
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.rollout.base import SamplingParams
from trainer.rollout.hf import HFRolloutEngine
from trainer.rollout.static import StaticRolloutEngine, _filter


def _model(arch: str = "qwen2"):
    # a wide init makes greedy decoding wander over many tokens instead of repeating one
    cfg = ModelConfig(path=f"tiny:{arch}", dtype="float32", override_config={"initializer_range": 0.2})
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    return model, tok, eos_token_ids(tok, model)


PROMPTS = ["12+30=", "what is 13*7? answer:", "hi", "a much longer prompt so the rows are left-padded: 9-4="]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_greedy_matches_hf_tokens_and_logprobs(arch: str) -> None:
    model, tok, eos = _model(arch)
    prompts = [tok.encode(p) for p in PROMPTS]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=16)
    ref = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(prompts, params)
    eng = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, prompt_bucket=8)
    out = eng.generate(prompts, params)
    assert len(set(t for r in out.response_ids for t in r)) > 4  # the model does not emit one token forever
    assert out.response_ids == ref.response_ids
    assert out.finish_reasons == ref.finish_reasons
    assert out.group_index == [0, 0, 1, 1, 2, 2, 3, 3]
    for a, b in zip(out.response_logprobs, ref.response_logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


def test_stop_token_truncates_and_marks_stop() -> None:
    model, tok, eos = _model()
    prompts = [tok.encode(p) for p in PROMPTS]
    free = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(
        prompts, SamplingParams(greedy=True, max_new_tokens=12))
    stop_tok = free.response_ids[0][3]  # make the 4th greedy token of row 0 a stop token
    out = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(
        prompts, SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=[stop_tok]))
    first = free.response_ids[0].index(stop_tok)
    assert out.response_ids[0] == free.response_ids[0][:first + 1]
    assert out.finish_reasons[0] == "stop"
    for row_free, row, fin in zip(free.response_ids, out.response_ids, out.finish_reasons):
        if stop_tok not in row_free:
            assert row == row_free and fin == "length"


def test_sampled_logprobs_are_the_temperature_scaled_logprobs_of_the_tokens() -> None:
    model, tok, eos = _model()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    eng = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, seed=1)
    out = eng.generate(prompts, SamplingParams(n=4, temperature=0.7, max_new_tokens=6))
    assert len(out) == 8 and all(len(r) == 6 for r in out.response_ids)
    assert len({tuple(r) for r in out.response_ids}) > 1  # sampling, not greedy
    # recompute with the HF forward: log_softmax(logits / T) at each sampled token
    for prompt, resp, lps in zip(out.prompt_ids, out.response_ids, out.response_logprobs):
        ids = torch.tensor([prompt + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), ref, atol=1e-5)


def test_same_seed_same_samples_and_weights_update_changes_output() -> None:
    model, tok, eos = _model()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    mk = lambda: StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, seed=7)
    assert mk().generate(prompts, params).response_ids == mk().generate(prompts, params).response_ids
    eng = mk()
    greedy = SamplingParams(greedy=True, max_new_tokens=5)
    before = eng.generate(prompts, greedy).response_logprobs
    # the fused QKV matrix must follow an in-place weight update of q_proj
    new = {k: v.clone() for k, v in model.named_parameters()}
    name = "model.layers.0.self_attn.q_proj.weight"
    new[name] = new[name] * 3.0
    eng.update_weights(new.items())
    assert eng.version == 1
    after = eng.generate(prompts, greedy)
    model2, _, _ = _model()
    model2.load_state_dict({**model2.state_dict(), name: new[name]})
    ref = HFRolloutEngine(model2, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(prompts, greedy)
    assert after.response_ids == ref.response_ids
    assert after.response_logprobs != before
    for a, b in zip(after.response_logprobs, ref.response_logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


def test_batches_larger_than_the_biggest_bucket_are_split() -> None:
    model, tok, eos = _model()
    prompts = [tok.encode(p) for p in PROMPTS]
    params = SamplingParams(n=3, greedy=True, max_new_tokens=4)
    whole = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(prompts, params)
    split = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos,
                                batch_buckets=[1, 2, 4, 5]).generate(prompts, params)
    assert len(split) == 12
    assert split.response_ids == whole.response_ids


def test_filter_keeps_top_k_and_top_p_sets() -> None:
    scaled = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda **kw: torch.isfinite(_filter(scaled, SamplingParams(**kw)))[0].tolist()
    assert keep(top_k=2) == [True, True, False, False]
    assert keep(top_p=0.7) == [True, True, False, False]  # 0.5 < 0.7, the token crossing 0.7 is kept
    assert keep(top_p=0.4) == [True, False, False, False]
    assert keep(top_p=0.85) == [True, True, True, False]


def test_non_llama_family_model_is_a_model_error() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ModelError, match="rollout.engine=hf"):
        StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[1])
