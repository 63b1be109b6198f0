"""The `sglang` rollout engine: an offline `sglang.Engine`, token ids in and out, weights sent by CUDA IPC.

Written against sglang==0.5.3 (the `sglang` extra in pyproject.toml). NOT run in this project yet:
no GPU machine with SGLang installed was available (see docs/hardware.md). What was checked, and
how: the calls below were read from SGLang's `python/sglang/srt/entrypoints/engine.py`
(`Engine(**server_args)`, `generate`, `update_weights_from_tensor`, `release_memory_occupation`,
`resume_memory_occupation`, `flush_cache`), its sampler (`python/sglang/srt/layers/sampler.py`,
`SGLANG_RETURN_ORIGINAL_LOGPROB`), `SamplingParams` (temperature < eps becomes top_k=1,
top_k=-1 means no limit) and from verl's SGLang rollout of the same series
(`verl/workers/rollout/sglang_rollout/sglang_rollout.py`). The pure functions here are unit-tested
on CPU with fake engines and SGLang-shaped output dicts (`tests/unit/test_engine_adapters.py`);
the `Engine` construction itself is not.

How it is driven:
- `sglang.Engine(model_path=<HF folder>, tp_size, mem_fraction_static, max_running_requests,
  context_length, random_seed, skip_tokenizer_init=True, enable_memory_saver=True, base_gpu_id)`.
  The engine runs its scheduler in subprocesses; this process holds the tokenizer manager.
- `engine.generate(input_ids=[...], sampling_params={...}, return_logprob=True)` with each prompt
  repeated n times and `"n": 1` (as verl does: the order of a batched n > 1 request is not part of
  SGLang's documented output), so output k belongs to prompt k // n. Each output dict carries
  `output_ids`, `meta_info["output_token_logprobs"]` = [(logprob, token_id, text|None), ...] and
  `meta_info["finish_reason"]` = {"type": "stop" | "length" | "abort", ...}.
- `update_weights`: tensors (HF names, moved to this GPU, cast to the engine dtype) sent in
  buckets of about `_BUCKET_BYTES` through `engine.update_weights_from_tensor(named_tensors=...,
  flush_cache=<last bucket>)`; SGLang serializes them as CUDA IPC handles, one copy per TP rank,
  and its model loader maps HF names (fused q/k/v, gate/up) itself.
- `sleep`: `release_memory_occupation()` frees KV cache and weights (their content is lost);
  `wake_up`: `resume_memory_occupation()`. The trainer re-syncs weights after waking, so
  `generate` refuses to run on released weights until `update_weights` has run.

Log-probabilities: SGLang 0.5.3 returns, by default, `log(softmax(logits / T))` of the sampled
token, taken before the top-k/top-p filters: the trainer's definition. Setting the environment
variable `SGLANG_RETURN_ORIGINAL_LOGPROB` (older name `RETURN_ORIGINAL_LOGPROB`) makes it return
the pre-temperature `log_softmax(logits)`, so `build` refuses to start with it on. Greedy requests
become top_k=1 at temperature 1, so the value is `log_softmax(logits)`, the `hf` engine's greedy
convention. What remains is numerics (kernels, dtypes), measured by `training/rollout_probs_diff_*`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from trainer.errors import ConfigError
from trainer.models import resolve_dtype
from trainer.rollout.base import Rollout, RolloutEngine, SamplingParams
from trainer.rollout.vllm_engine import (
    engine_weights,
    missing_engine_error,
    model_dir_for_engine,
    normalize_finish_reason,
    require_cuda,
)

_BUCKET_BYTES = 512 << 20
_ORIGINAL_LOGPROB_VARS = ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RETURN_ORIGINAL_LOGPROB")


def sglang_sampling_params(params: SamplingParams, eos_ids: list[int]) -> dict[str, Any]:
    """SGLang's `sampling_params` dict for one request (n=1: prompts are repeated instead)."""
    greedy = params.greedy
    return {
        "n": 1,
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k <= 0 else int(params.top_k),
        "max_new_tokens": int(params.max_new_tokens),
        "stop_token_ids": sorted(set(eos_ids) | set(params.stop_token_ids)),
        "ignore_eos": False,
        "no_stop_trim": True,  # keep the stop token in the output, as the other engines do
    }


def check_logprob_env(environ: Mapping[str, str]) -> None:
    """Refuse the SGLang switch that reports pre-temperature log-probs (see the module docstring)."""
    for var in _ORIGINAL_LOGPROB_VARS:
        if environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise ConfigError(f"rollout.engine=sglang: environment variable {var}={environ[var]} makes SGLang "
                              f"report log-probs before temperature (fix: unset {var})")


def rollout_from_sglang(prompts: list[list[int]], outputs: list[dict[str, Any]], n: int, version: int) -> Rollout:
    """Our `Rollout` from SGLang output dicts for `prompts` each repeated `n` times (prompt-major)."""
    if len(outputs) != len(prompts) * n:
        raise ValueError(f"sglang returned {len(outputs)} outputs for {len(prompts)} prompts x n={n}")
    prompt_ids, response_ids, logps, finish = [], [], [], []
    for j, out in enumerate(outputs):
        meta = out["meta_info"]
        triples = meta.get("output_token_logprobs")
        if triples is None:
            raise ValueError(f"sglang output {j}: no meta_info.output_token_logprobs (needs return_logprob=True)")
        ids = [int(t[1]) for t in triples]
        got = out.get("output_ids")
        if got is not None and list(got) != ids:
            raise ValueError(f"sglang output {j}: output_ids disagree with the token ids of output_token_logprobs")
        reason = meta.get("finish_reason")
        prompt_ids.append(list(prompts[j // n]))
        response_ids.append(ids)
        logps.append([float(t[0]) for t in triples])
        kind = reason.get("type") if isinstance(reason, dict) else reason
        finish.append(normalize_finish_reason(kind, f"sglang output {j}"))
    return Rollout(prompt_ids=prompt_ids, response_ids=response_ids, response_logprobs=logps,
                   finish_reasons=finish, group_index=[j // n for j in range(len(outputs))],
                   policy_version=[version] * len(outputs))


def weight_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                   dtype: torch.dtype | None = None, device: torch.device | None = None
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Lists of (HF name, tensor) of about `bucket_bytes` each (a larger tensor gets its own list)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in engine_weights(named_tensors, dtype):
        if device is not None and t.device != device:
            t = t.to(device)
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def send_weights(engine: Any, named_tensors: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int = _BUCKET_BYTES,
                 dtype: torch.dtype | None = None, device: torch.device | None = None) -> int:
    """Push weights through `engine.update_weights_from_tensor`, flushing the cache after the last
    bucket only. Returns the number of calls made."""
    calls = 0
    pending: list[tuple[str, torch.Tensor]] | None = None
    for bucket in weight_buckets(named_tensors, bucket_bytes, dtype, device):
        if pending is not None:
            _update(engine, pending, flush_cache=False)
            calls += 1
        pending = bucket
    if pending is not None:
        _update(engine, pending, flush_cache=True)
        calls += 1
    return calls


def _update(engine: Any, bucket: list[tuple[str, torch.Tensor]], *, flush_cache: bool) -> None:
    result = engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=flush_cache)
    if isinstance(result, tuple) and result and result[0] is False:
        raise RuntimeError(f"sglang update_weights_from_tensor failed: {result[1] if len(result) > 1 else ''}")


class SGLangRolloutEngine(RolloutEngine):
    """Wraps a `sglang.Engine`; see the module docstring for the calls it makes."""

    name = "sglang"

    def __init__(self, engine: Any, *, eos_token_ids: list[int], dtype: torch.dtype | None = None,
                 device: torch.device | None = None, bucket_bytes: int = _BUCKET_BYTES):
        self.engine = engine
        self.eos_token_ids = list(eos_token_ids)
        self.dtype = dtype
        self.device = device
        self.bucket_bytes = bucket_bytes
        self.version = 0
        self._asleep = False
        self._weights_released = False

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        if self._asleep:
            raise RuntimeError("sglang engine is asleep: call wake_up() before generate()")
        if self._weights_released:
            raise RuntimeError("sglang engine weights were released by sleep(): call update_weights() first")
        rows = [list(p) for p in prompts for _ in range(params.n)]
        outputs = self.engine.generate(input_ids=rows, sampling_params=sglang_sampling_params(params, self.eos_token_ids),
                                       return_logprob=True)
        return rollout_from_sglang(prompts, list(outputs), params.n, self.version)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._asleep:
            self.wake_up()
        send_weights(self.engine, named_tensors, bucket_bytes=self.bucket_bytes, dtype=self.dtype, device=self.device)
        self._weights_released = False
        self.version += 1

    def sleep(self) -> None:
        if not self._asleep:
            self.engine.release_memory_occupation()
            self._asleep = True
            self._weights_released = True

    def wake_up(self) -> None:
        if self._asleep:
            self.engine.resume_memory_occupation()
            self._asleep = False


def engine_kwargs(cfg: Any, model_dir: str, device: torch.device) -> dict[str, Any]:
    """Keyword arguments of `sglang.Engine` from the trainer config (`rollout.engine_kwargs` win)."""
    r = cfg.rollout
    kwargs: dict[str, Any] = {
        "model_path": model_dir,
        "dtype": cfg.model.dtype,
        "tp_size": r.tensor_parallel_size,
        "mem_fraction_static": r.gpu_memory_utilization,
        "context_length": cfg.data.max_prompt_length + cfg.data.max_response_length,
        "random_seed": cfg.trainer.seed,
        "skip_tokenizer_init": True,
        "enable_memory_saver": True,
        "base_gpu_id": device.index or 0,
        "log_level": "error",
    }
    if r.max_num_seqs is not None:
        kwargs["max_running_requests"] = r.max_num_seqs
    kwargs.update(r.engine_kwargs)
    return kwargs


def build(cfg: Any, model: torch.nn.Module, tokenizer: Any, eos_ids: list[int], device: torch.device,
          environ: Mapping[str, str] | None = None) -> SGLangRolloutEngine:
    """An `SGLangRolloutEngine` loaded from `model.path` (or a saved copy of `model`) on `device`."""
    try:
        import sglang
    except ImportError as e:
        raise missing_engine_error("sglang", e) from None
    require_cuda("sglang", device)
    check_logprob_env(os.environ if environ is None else environ)
    model_dir = model_dir_for_engine(cfg.model.path, cfg.model.load_format, model, tokenizer)
    engine = sglang.Engine(**engine_kwargs(cfg, model_dir, device))
    return SGLangRolloutEngine(engine, eos_token_ids=eos_ids, dtype=resolve_dtype(cfg.model.dtype), device=device)
