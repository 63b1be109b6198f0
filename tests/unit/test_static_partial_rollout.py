"""Partial rollout on the static engine (CPU, eager decode step): interrupt, continue, weight refresh.

What is comparable: with greedy decoding and unchanged weights, a `generate` interrupted after k
decode steps and then `continue_generation` gives the tokens of one uninterrupted call (log-probs
agree to float32 numerics: the partial tokens are prefilled instead of decoded one by one).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.engines import stop_after
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.rollout.base import InterruptibleEngine, Rollout, SamplingParams
from trainer.rollout.hf import HFRolloutEngine
from trainer.rollout.static import StaticRolloutEngine

PROMPTS = ["12+30=", "what is 13*7? answer:", "hi", "a much longer prompt so the rows are left-padded: 9-4="]


@pytest.fixture(scope="module")
def tiny():
    # a wide init makes greedy decoding wander over many tokens instead of repeating one
    cfg = ModelConfig(path="tiny:qwen2", dtype="float32", override_config={"initializer_range": 0.2})
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    return model, tok, eos_token_ids(tok, model), [tok.encode(p) for p in PROMPTS]


def _static(tiny, **kw) -> StaticRolloutEngine:
    model, tok, eos, _ = tiny
    return StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=kw.pop("eos", eos), **kw)


def _resume(engine: InterruptibleEngine, part: Rollout, params: SamplingParams, **kw) -> Rollout:
    """Continue the aborted rows of `part` (as the rollout worker does) and merge them back in."""
    where = [i for i, f in enumerate(part.finish_reasons) if f == "abort"]
    cont = engine.continue_generation([part.prompt_ids[i] for i in where], [part.response_ids[i] for i in where],
                                      [part.response_logprobs[i] for i in where], params, **kw)
    ids, lps, fin = list(part.response_ids), list(part.response_logprobs), list(part.finish_reasons)
    for row, i in enumerate(where):
        ids[i], lps[i], fin[i] = cont.response_ids[row], cont.response_logprobs[row], cont.finish_reasons[row]
    return Rollout(part.prompt_ids, ids, lps, fin, part.group_index)


def _assert_same(a: Rollout, b: Rollout) -> None:
    assert a.response_ids == b.response_ids
    assert a.finish_reasons == b.finish_reasons
    for x, y in zip(a.response_logprobs, b.response_logprobs):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-4, rtol=0)


def test_both_builtin_engines_share_the_interruptible_interface() -> None:
    assert issubclass(HFRolloutEngine, InterruptibleEngine) and issubclass(StaticRolloutEngine, InterruptibleEngine)
    assert StaticRolloutEngine.continue_generation is HFRolloutEngine.continue_generation  # one shared implementation


def test_interrupted_then_continued_greedy_equals_uninterrupted(tiny) -> None:
    prompts = tiny[3]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=12)
    full = _static(tiny).generate(prompts, params)
    # make row 2's 3rd greedy token a stop token, so that row finishes before the interrupt
    stop_tok = full.response_ids[2][2]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=12, stop_token_ids=[stop_tok])
    full = _static(tiny).generate(prompts, params)
    assert full.finish_reasons[2] == "stop" and len(full.response_ids[2]) <= 3
    eng = _static(tiny)
    part = eng.generate(prompts, params, should_stop=stop_after(5))
    for i, (ids, fin) in enumerate(zip(part.response_ids, part.finish_reasons)):
        if full.finish_reasons[i] == "stop" and len(full.response_ids[i]) <= 5:
            assert fin == "stop" and ids == full.response_ids[i]  # finished before the interrupt
        else:
            assert fin == "abort" and ids == full.response_ids[i][:5]  # 5 tokens, then interrupted
            assert len(part.response_logprobs[i]) == 5
    assert part.finish_reasons.count("abort") >= 4
    _assert_same(_resume(eng, part, params), full)


def test_static_and_hf_agree_on_an_interrupted_and_continued_batch(tiny) -> None:
    model, tok, eos, prompts = tiny
    params = SamplingParams(n=1, greedy=True, max_new_tokens=10)
    hf = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos)
    st = _static(tiny)
    got = [_resume(e, e.generate(prompts, params, should_stop=stop_after(4)), params) for e in (hf, st)]
    _assert_same(got[1], got[0])
    assert all(len(r) == 10 or f == "stop" for r, f in zip(got[1].response_ids, got[1].finish_reasons))


def test_interrupt_before_the_first_token_and_across_bucket_chunks(tiny) -> None:
    prompts = tiny[3]
    params = SamplingParams(n=1, greedy=True, max_new_tokens=6)
    full = _static(tiny).generate(prompts, params)
    eng = _static(tiny)
    none = eng.generate(prompts, params, should_stop=lambda: True)
    assert none.response_ids == [[]] * 4 and none.finish_reasons == ["abort"] * 4
    _assert_same(_resume(eng, none, params), full)
    # buckets of at most 2 rows: the interrupt lands in the first chunk, the second never starts
    chunked = _static(tiny, batch_buckets=[1, 2])
    part = chunked.generate(prompts, params, should_stop=stop_after(3))
    assert [len(r) for r in part.response_ids] == [3, 3, 0, 0]
    assert part.finish_reasons == ["abort"] * 4
    _assert_same(_resume(chunked, part, params), full)


def test_continuation_uses_new_weights_and_keeps_old_logprobs(tiny) -> None:
    model, _, _, prompts = tiny
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=7)
    eng = _static(tiny, eos=[], seed=5)
    part = eng.generate(prompts[:2], params, should_stop=stop_after(3))
    assert [len(r) for r in part.response_ids] == [3] * 4 and part.policy_version == [0] * 4
    new = {k: v.detach() * 1.3 for k, v in model.named_parameters()}  # every weight, fused ones included
    eng.update_weights(new.items())
    done = eng.continue_generation(part.prompt_ids, part.response_ids, part.response_logprobs, params)
    assert done.policy_version == [1] * 4 and done.finish_reasons == ["length"] * 4
    model2, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2", dtype="float32",
                                                     override_config={"initializer_range": 0.2}), seed=3)
    model2.load_state_dict({**model2.state_dict(), **new})
    for prompt, old_ids, old_lp, ids, lp in zip(done.prompt_ids, part.response_ids, part.response_logprobs,
                                                done.response_ids, done.response_logprobs):
        assert len(ids) == 7 and ids[:3] == old_ids and lp[:3] == old_lp  # the partial part is not re-scored
        with torch.no_grad():  # the new tokens carry log_softmax(logits / T) of the *new* weights
            logits = model2(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float() / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(lp[3:]), ref[3:], atol=1e-5, rtol=0)
        assert not torch.allclose(torch.tensor(old_lp), ref[:3], atol=1e-3)  # the old ones came from other weights


def test_update_weights_refreshes_the_fused_qkv_and_gate_up_matrices(tiny) -> None:
    model = tiny[0]
    eng = _static(tiny)
    ptrs = [(lw.w_qkv.data_ptr(), lw.w_gu.data_ptr()) for lw in eng.layers]
    gen = torch.Generator().manual_seed(0)
    new = {k: v.detach() + 0.01 * torch.randn(v.shape, generator=gen) for k, v in model.named_parameters()}
    eng.update_weights(new.items())
    for i, lw in enumerate(eng.layers):
        pre = f"model.layers.{i}."
        qkv = torch.cat([new[pre + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        gu = torch.cat([new[pre + "mlp.gate_proj.weight"], new[pre + "mlp.up_proj.weight"]])
        assert torch.equal(lw.w_qkv, qkv) and torch.equal(lw.w_gu, gu)
        assert (lw.w_qkv.data_ptr(), lw.w_gu.data_ptr()) == ptrs[i]  # updated in place (graphs keep reading them)
        if lw.b_qkv is not None:
            assert torch.equal(lw.b_qkv, torch.cat([new[pre + f"self_attn.{p}_proj.bias"] for p in "qkv"]))


def test_buffers_are_kept_per_shape_up_to_max_slots_and_freed_on_sleep(tiny) -> None:
    prompts = tiny[3]
    eng = _static(tiny, max_slots=2)
    for n in (1, 2, 3):  # three batch sizes -> three (batch, length) shapes
        eng.generate(prompts[:1], SamplingParams(n=n, greedy=True, max_new_tokens=3))
    assert [k[0] for k in eng._slots] == [2, 4]  # batch buckets 2 and 4 kept; bucket 1 dropped first
    eng.sleep()
    assert not eng._slots
    keep = _static(tiny, free_on_sleep=False)
    keep.generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=3))
    keep.sleep()
    assert len(keep._slots) == 1
