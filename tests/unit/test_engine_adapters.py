"""The vLLM / SGLang adapters' pure logic, driven with fakes shaped like vllm 0.11.0 / sglang 0.5.3 objects.

Neither engine is installed here; these tests pin what the adapters send (sampling params, weight
names and buckets) and how they read what comes back (token ids, log-probs, finish reasons, order).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.config import TrainerConfig
from trainer.errors import ConfigError
from trainer.rollout import sglang_engine, vllm_engine
from trainer.rollout.base import SamplingParams
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
    VLLMRolloutEngine,
    hf_weight_name,
    launcher_env,
    llm_kwargs,
    model_dir_for_engine,
    rollout_from_vllm,
    vllm_sampling_kwargs,
)


# ---------------------------------------------------------------- vLLM-shaped fakes
@dataclass
class Logprob:  # vllm.sequence.Logprob
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    outputs: list[CompletionOutput]


def completion(index: int, ids: list[int], lps: list[float], reason: str) -> CompletionOutput:
    # logprobs=0 gives the sampled token; a decoy entry checks the adapter picks by token id
    steps = [{tok: Logprob(lp), tok + 1000: Logprob(-99.0)} for tok, lp in zip(ids, lps)]
    return CompletionOutput(index=index, token_ids=ids, logprobs=steps, finish_reason=reason)


class FakeVLLMModel:
    def __init__(self) -> None:
        self.received: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Any) -> set[str]:
        self.received.extend(weights)
        return {n for n, _ in self.received}


class FakeLLM:
    def __init__(self, outputs: list[RequestOutput]) -> None:
        self.outputs = outputs
        self.calls: list[str] = []
        self.requests: list[Any] = []
        self.sampling: Any = None
        self.model = FakeVLLMModel()
        runner = SimpleNamespace(model=self.model)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner))))

    def generate(self, requests: list[Any], sampling_params: Any, use_tqdm: bool = True) -> list[RequestOutput]:
        self.requests, self.sampling = requests, sampling_params
        return self.outputs

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep{level}")

    def wake_up(self) -> None:
        self.calls.append("wake_up")


def test_vllm_sampling_kwargs_sampled():
    p = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=16, stop_token_ids=[7, 2])
    kwargs, repeat = vllm_sampling_kwargs(p, eos_ids=[2, 5])
    assert repeat == 1
    assert kwargs == {"n": 4, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 16,
                      "stop_token_ids": [2, 5, 7], "logprobs": 0, "detokenize": False}
    kwargs, _ = vllm_sampling_kwargs(SamplingParams(top_k=20), eos_ids=[])
    assert kwargs["top_k"] == 20


def test_vllm_sampling_kwargs_greedy_repeats_prompts():
    p = SamplingParams(n=3, temperature=0.7, top_p=0.5, top_k=10, greedy=True)
    kwargs, repeat = vllm_sampling_kwargs(p, eos_ids=[2])
    assert (kwargs["n"], kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], repeat) == (1, 0.0, 1.0, -1, 3)


def test_rollout_from_vllm_orders_and_picks_sampled_logprobs():
    prompts = [[1, 2], [3]]
    outputs = [  # completions of a request may come in any index order
        RequestOutput([completion(1, [9, 2], [-0.5, -0.25], "stop"), completion(0, [8], [-1.0], "length")]),
        RequestOutput([completion(0, [4, 4, 2], [-0.1, -0.2, -0.3], "stop"), completion(1, [6], [-2.0], "abort")]),
    ]
    r = rollout_from_vllm(prompts, outputs, n=2, version=5)
    assert r.prompt_ids == [[1, 2], [1, 2], [3], [3]]
    assert r.response_ids == [[8], [9, 2], [4, 4, 2], [6]]
    assert r.response_logprobs == [[-1.0], [-0.5, -0.25], [-0.1, -0.2, -0.3], [-2.0]]
    assert r.finish_reasons == ["length", "stop", "stop", "abort"]
    assert r.group_index == [0, 0, 1, 1]
    assert r.policy_version == [5, 5, 5, 5]


def test_rollout_from_vllm_rejects_bad_outputs():
    with pytest.raises(ValueError, match="logprobs"):
        rollout_from_vllm([[1]], [RequestOutput([CompletionOutput(0, [3], None, "stop")])], n=1, version=0)
    with pytest.raises(ValueError, match="finish reason"):
        rollout_from_vllm([[1]], [RequestOutput([completion(0, [3], [-1.0], "tool")])], n=1, version=0)
    with pytest.raises(ValueError, match="2 prompts x n=1"):
        rollout_from_vllm([[1], [2]], [RequestOutput([completion(0, [3], [-1.0], "stop")])], n=1, version=0)


def test_vllm_engine_greedy_generate_repeats_prompts():
    outs = [RequestOutput([completion(0, [5], [-0.1], "stop")]) for _ in range(4)]
    llm = FakeLLM(outs)
    engine = VLLMRolloutEngine(llm, eos_token_ids=[2])
    r = engine.generate([[1], [7, 8]], SamplingParams(n=2, greedy=True, max_new_tokens=4))
    assert llm.requests == [{"prompt_token_ids": [1]}] * 2 + [{"prompt_token_ids": [7, 8]}] * 2
    assert llm.sampling["n"] == 1 and llm.sampling["temperature"] == 0.0 and llm.sampling["max_tokens"] == 4
    assert r.group_index == [0, 0, 1, 1] and r.prompt_ids[2] == [7, 8]


def test_vllm_engine_weight_update_names_dtype_cache_and_sleep():
    llm = FakeLLM([])
    engine = VLLMRolloutEngine(llm, eos_token_ids=[2], dtype=torch.bfloat16)
    engine.sleep()
    engine.sleep()  # idempotent
    w = torch.tensor([1.5, -2.0])
    engine.update_weights([("_orig_mod.model.layers.0.mlp.up_proj.weight", w), ("lm_head.weight", w)])
    assert llm.calls == ["sleep1", "wake_up", "reset_prefix_cache"]  # woken before loading
    names = [n for n, _ in llm.model.received]
    assert names == ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]
    assert all(t.dtype == torch.bfloat16 for _, t in llm.model.received)
    assert torch.equal(llm.model.received[0][1].float(), w)
    assert engine.version == 1
    r = VLLMRolloutEngine(FakeLLM([RequestOutput([completion(0, [3], [-1.0], "stop")])]), eos_token_ids=[2])
    r.update_weights([])
    assert r.generate([[1]], SamplingParams()).policy_version == [1]


def test_hf_weight_name_strips_wrappers_only():
    assert hf_weight_name("module._fsdp_wrapped_module.model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert hf_weight_name("model.layers.3._checkpoint_wrapped_module.self_attn.q_proj.bias") == \
        "model.layers.3.self_attn.q_proj.bias"
    assert hf_weight_name("model.norm.weight") == "model.norm.weight"


def test_launcher_env_keeps_what_is_set():
    env = launcher_env({"MASTER_PORT": "1234", "RANK": "3"}, port=999, local_rank=1)
    assert env == {"LOCAL_RANK": "1", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def test_llm_kwargs_from_config():
    cfg = TrainerConfig.model_validate({
        "model": {"dtype": "bfloat16"}, "data": {"max_prompt_length": 100, "max_response_length": 28},
        "trainer": {"seed": 3},
        "rollout": {"engine": "vllm", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4, "max_num_seqs": 64,
                    "engine_kwargs": {"enforce_eager": True, "gpu_memory_utilization": 0.6}}})
    kw = llm_kwargs(cfg, "/m")
    assert kw["model"] == "/m" and kw["dtype"] == "bfloat16" and kw["tensor_parallel_size"] == 2
    assert kw["max_model_len"] == 128 and kw["seed"] == 3 and kw["max_num_seqs"] == 64
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is True
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["enforce_eager"] is True and kw["gpu_memory_utilization"] == 0.6  # engine_kwargs win


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


# ---------------------------------------------------------------- SGLang-shaped fakes
def sgl_out(ids: list[int], lps: list[float], reason: dict[str, Any], output_ids: list[int] | None = None) -> dict:
    return {"text": None, "output_ids": ids if output_ids is None else output_ids,
            "meta_info": {"output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)],
                          "finish_reason": reason, "completion_tokens": len(ids)}}


@dataclass
class FakeSGLangEngine:
    outputs: list[dict] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)
    result: Any = (True, "ok")

    def generate(self, input_ids: list[list[int]], sampling_params: dict, return_logprob: bool = False) -> list[dict]:
        self.calls.append(("generate", input_ids, sampling_params, return_logprob))
        return self.outputs

    def update_weights_from_tensor(self, named_tensors: list, load_format: str | None = None,
                                   flush_cache: bool = True) -> Any:
        self.calls.append(("update", [n for n, _ in named_tensors], flush_cache))
        return self.result

    def release_memory_occupation(self) -> None:
        self.calls.append("release")

    def resume_memory_occupation(self) -> None:
        self.calls.append("resume")


def test_sglang_sampling_params():
    sp = sglang_sampling_params(SamplingParams(n=8, temperature=0.6, top_p=0.95, top_k=-1, max_new_tokens=32,
                                               stop_token_ids=[9]), eos_ids=[2])
    assert sp == {"n": 1, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_new_tokens": 32,
                  "stop_token_ids": [2, 9], "ignore_eos": False, "no_stop_trim": True}
    g = sglang_sampling_params(SamplingParams(temperature=0.6, top_k=5, greedy=True), eos_ids=[2])
    assert (g["temperature"], g["top_k"], g["top_p"]) == (0.0, -1, 1.0)


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


def test_check_logprob_env():
    check_logprob_env({})
    check_logprob_env({"SGLANG_RETURN_ORIGINAL_LOGPROB": "false"})
    with pytest.raises(ConfigError, match="fix: unset SGLANG_RETURN_ORIGINAL_LOGPROB"):
        check_logprob_env({"SGLANG_RETURN_ORIGINAL_LOGPROB": "True"})
    with pytest.raises(ConfigError, match="RETURN_ORIGINAL_LOGPROB=1"):
        check_logprob_env({"RETURN_ORIGINAL_LOGPROB": "1"})


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
    outs = [sgl_out([4], [-0.5], {"type": "length"}) for _ in range(4)]
    fake = FakeSGLangEngine(outputs=outs)
    engine = SGLangRolloutEngine(fake, eos_token_ids=[2])
    r = engine.generate([[1], [3]], SamplingParams(n=2, max_new_tokens=1))
    _, rows, sp, want_lp = fake.calls[0]
    assert rows == [[1], [1], [3], [3]] and sp["n"] == 1 and want_lp is True
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
        assert f"rollout.engine={name}" in msg and f"pip install 'rlbench[{name}]'" in msg
        assert "rollout.engine=hf" in msg
