"""The hf engine's interrupt/continue path that partial rollouts rely on (tiny model, CPU, seconds)."""

from __future__ import annotations

import torch

from tests.helpers.engines import stop_after
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.rollout.base import SamplingParams
from trainer.rollout.hf import HFRolloutEngine


def _engine() -> tuple[HFRolloutEngine, list[list[int]]]:
    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    prompts = [tok.encode("1+2="), tok.encode("what is 3+4?")]
    return engine, prompts


def test_interrupted_then_continued_greedy_equals_uninterrupted():
    engine, prompts = _engine()
    params = SamplingParams(n=1, greedy=True, max_new_tokens=8)
    full = engine.generate(prompts, params)
    part = engine.generate(prompts, params, should_stop=stop_after(3))
    assert part.finish_reasons == ["abort", "abort"]
    assert [len(r) for r in part.response_ids] == [3, 3]
    done = engine.continue_generation(part.prompt_ids, part.response_ids, part.response_logprobs, params)
    assert done.response_ids == full.response_ids
    assert done.finish_reasons == ["length", "length"]
    for a, b in zip(done.response_logprobs, full.response_logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-4)


def test_continued_tokens_keep_the_logprobs_of_the_version_that_sampled_them():
    engine, prompts = _engine()
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6)
    part = engine.generate(prompts, params, should_stop=stop_after(2))
    assert all(len(r) == 2 for r in part.response_ids) and part.policy_version == [0] * 4
    # new weights: scale every parameter so the continuation's distribution changes
    engine.update_weights((k, v * 1.5) for k, v in engine.model.named_parameters())
    done = engine.continue_generation(part.prompt_ids, part.response_ids, part.response_logprobs, params)
    assert done.policy_version == [1] * 4
    for old_ids, old_lp, ids, lp in zip(part.response_ids, part.response_logprobs, done.response_ids,
                                        done.response_logprobs):
        assert ids[:2] == old_ids and lp[:2] == old_lp  # the first two tokens were not re-scored
        assert len(ids) == 6 and len(lp) == 6
