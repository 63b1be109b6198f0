"""The `vllm` rollout engine: offline `vllm.LLM` in the trainer's process, weights synced in place.

Written against vllm==0.11.0 (the `vllm` extra in pyproject.toml). NOT run in this project yet: no
GPU machine with vLLM installed was available (see docs/hardware.md). What was checked, and how:
the calls below were read from vLLM's `vllm/entrypoints/llm.py` (`LLM(...)`, `generate`, `sleep`,
`wake_up`, `reset_prefix_cache`), `vllm/sampling_params.py`, `vllm/outputs.py` and the V1 sampler
(`vllm/v1/sample/sampler.py`), and from how verl's colocated vLLM rollout of the same vLLM series
drives them (`verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py`). The pure functions here
(sampling params, output conversion, weight-name mapping, the weight-load call) are unit-tested
on CPU with fake objects shaped like vLLM's (`tests/unit/test_engine_adapters.py`); the `LLM`
construction itself is not.

How it is driven:
- `LLM(model=<HF folder>, distributed_executor_backend="external_launcher", enable_sleep_mode=True,
  logprobs_mode="processed_logprobs", ...)`. `external_launcher` keeps the engine core in this
  process (vLLM turns V1 multiprocessing off for it), so the model object is reachable and weights
  can be loaded without serializing them; with tensor_parallel_size > 1 every rank of a
  torchrun/Ray group builds its own `LLM` and vLLM shards from the full tensors each rank loads.
- Prompts go in as `TokensPrompt(prompt_token_ids=...)`; `SamplingParams(n, temperature, top_p,
  top_k, max_tokens, stop_token_ids=eos + stop ids, logprobs=0, detokenize=False)`. `logprobs=0`
  returns, per step, a dict holding only the sampled token's `Logprob`.
- Greedy: temperature 0 and n=1 per request, the prompt repeated n times (vLLM treats
  temperature < 1e-5 as greedy).
- `update_weights`: `llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
  .load_weights(iter of (name, tensor))` with HF checkpoint names (vLLM's own loader fuses q/k/v
  and gate/up), then `llm.reset_prefix_cache()` so no KV block computed with old weights is reused.
- `sleep`: `llm.sleep(level=1)` (weights offloaded to CPU, KV cache dropped); `wake_up`:
  `llm.wake_up()`.

Log-probabilities: vLLM 0.11's `logprobs_mode` picks what `logprobs` reports. "raw_logprobs" (its
default) is `log_softmax(logits)` before temperature, which equals the trainer's
`log_softmax(logits / T)` only at T=1. "processed_logprobs" is taken after temperature and after
the top-k/top-p mask, so with top_k=-1 and top_p=1 (the defaults) it is exactly the trainer's
definition; we use it (verl does too). Remaining differences: (1) with top-k/top-p on, vLLM
renormalizes over the kept tokens, so its log-prob exceeds the trainer's by -log(kept mass) (the
`hf` engine reports the unfiltered value); (2) greedy requests skip temperature, so the value is
`log_softmax(logits)`, the same convention as the `hf` engine; (3) kernels and dtypes differ from
the trainer's forward, which is the mismatch `training/rollout_probs_diff_*` is there to measure.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigError
from trainer.models import resolve_dtype
from trainer.rollout.base import Rollout, RolloutEngine, SamplingParams

# Prefixes wrappers add to parameter names (torch.compile, DDP, FSDP1, activation checkpointing);
# the engines' loaders expect the bare HF checkpoint names.
_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


def missing_engine_error(engine: str, err: ImportError) -> ConfigError:
    """The one-line error for `rollout.engine=<engine>` when the package is not installed."""
    return ConfigError(f"rollout.engine={engine}: the '{engine}' package is not importable ({err}) "
                       f"(fix: pip install 'rlbench[{engine}]' on a GPU machine, or set rollout.engine=hf)")


def require_cuda(engine: str, device: torch.device) -> None:
    """The one-line error for a server engine on a trainer device that is not a GPU."""
    if device.type != "cuda":
        raise ConfigError(f"rollout.engine={engine} needs a GPU, the trainer device is {device} "
                          f"(fix: run on a GPU machine, or set rollout.engine=hf)")


def hf_weight_name(name: str) -> str:
    """The HF checkpoint name of a trainer parameter: wrapper prefixes removed anywhere in the path."""
    parts = [p for p in name.split(".") if p not in {w.rstrip(".") for w in _WRAPPER_PREFIXES}]
    return ".".join(parts)


def engine_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs for an engine's `load_weights`, cast to `dtype` when given (lazy)."""
    for name, tensor in named_tensors:
        t = tensor.detach()
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        yield hf_weight_name(name), t


def model_dir_for_engine(model_path: str, load_format: str, model: torch.nn.Module, tokenizer: Any,
                         out_root: Path | None = None) -> str:
    """A HF folder the engine can load: `model.path` itself when it is one, else a saved copy of `model`.

    `tiny:`, `embedded:` and `.gguf` models (and `load_format=dummy`) have no HF folder the engines
    can read, so the trainer's in-memory model and tokenizer are saved with `save_pretrained`.
    """
    p = Path(model_path)
    if load_format == "auto" and p.is_dir() and (p / "config.json").is_file():
        return str(p)
    out = Path(tempfile.mkdtemp(prefix="rlbench-engine-model-", dir=out_root))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


def launcher_env(environ: Mapping[str, str], port: int, local_rank: int = 0) -> dict[str, str]:
    """torch.distributed variables `external_launcher` reads that a single-process run lacks
    (vLLM picks the GPU from LOCAL_RANK)."""
    defaults = {"RANK": "0", "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port)}
    return {k: v for k, v in defaults.items() if k not in environ}


def vllm_sampling_kwargs(params: SamplingParams, eos_ids: list[int]) -> tuple[dict[str, Any], int]:
    """Keyword arguments of `vllm.SamplingParams` and how many times to repeat each prompt.

    Sampling sends each prompt once with `n`; greedy sends it `n` times with n=1 (identical outputs,
    and vLLM's greedy path needs no n > 1).
    """
    greedy = params.greedy
    kwargs: dict[str, Any] = {
        "n": 1 if greedy else params.n,
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k <= 0 else int(params.top_k),
        "max_tokens": int(params.max_new_tokens),
        "stop_token_ids": sorted(set(eos_ids) | set(params.stop_token_ids)),
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,
    }
    return kwargs, params.n if greedy else 1


def normalize_finish_reason(reason: Any, where: str) -> str:
    out = _FINISH_REASONS.get(str(reason)) if reason is not None else None
    if out is None:
        raise ValueError(f"{where}: unexpected finish reason {reason!r}")
    return out


def rollout_from_vllm(prompts: list[list[int]], outputs: list[Any], n: int, version: int) -> Rollout:
    """Our `Rollout` from vLLM `RequestOutput`s, in request order (one per prompt, or n per prompt
    when prompts were repeated for greedy decoding); responses of prompt i at [i*n, (i+1)*n)."""
    completions = [c for req in outputs for c in sorted(req.outputs, key=lambda c: c.index)]  # prompt-major
    if len(completions) != len(prompts) * n:
        raise ValueError(f"vllm returned {len(completions)} completions for {len(prompts)} prompts x n={n}")
    prompt_ids, response_ids, logps, finish = [], [], [], []
    for j, c in enumerate(completions):
        ids = list(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise ValueError(f"vllm completion {j}: logprobs missing or of the wrong length (needs logprobs=0)")
        prompt_ids.append(list(prompts[j // n]))
        response_ids.append(ids)
        logps.append([float(step[tok].logprob) for step, tok in zip(c.logprobs, ids)])
        finish.append(normalize_finish_reason(c.finish_reason, f"vllm completion {j}"))
    return Rollout(prompt_ids=prompt_ids, response_ids=response_ids, response_logprobs=logps,
                   finish_reasons=finish, group_index=[j // n for j in range(len(completions))],
                   policy_version=[version] * len(completions))


def vllm_model(llm: Any) -> Any:
    """The `torch.nn.Module` an in-process (`external_launcher`) vLLM 0.11 `LLM` runs."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.model


def load_weights_into(model: Any, named_tensors: Iterable[tuple[str, torch.Tensor]],
                      dtype: torch.dtype | None = None) -> set[str]:
    """Feed (HF name, tensor) pairs to a vLLM model's `load_weights`; returns the names it loaded."""
    loaded = model.load_weights(engine_weights(named_tensors, dtype))
    return set(loaded) if loaded is not None else set()


class VLLMRolloutEngine(RolloutEngine):
    """Wraps a `vllm.LLM`; see the module docstring for the calls it makes."""

    name = "vllm"

    def __init__(self, llm: Any, *, eos_token_ids: list[int], dtype: torch.dtype | None = None,
                 tokens_prompt: Any = None, sampling_params_cls: Any = None):
        self.llm = llm
        self.eos_token_ids = list(eos_token_ids)
        self.dtype = dtype
        self._tokens_prompt = tokens_prompt if tokens_prompt is not None else (lambda **kw: kw)
        self._sampling_params_cls = sampling_params_cls if sampling_params_cls is not None else dict
        self.version = 0
        self._asleep = False

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        kwargs, repeat = vllm_sampling_kwargs(params, self.eos_token_ids)
        requests = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prompts for _ in range(repeat)]
        outputs = self.llm.generate(requests, self._sampling_params_cls(**kwargs), use_tqdm=False)
        return rollout_from_vllm(prompts, outputs, params.n, self.version)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._asleep:
            self.wake_up()
        load_weights_into(vllm_model(self.llm), named_tensors, self.dtype)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.version += 1

    def sleep(self) -> None:
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llm_kwargs(cfg: Any, model_dir: str) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` from the trainer config (`rollout.engine_kwargs` win)."""
    r = cfg.rollout
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": cfg.model.dtype,
        "tensor_parallel_size": r.tensor_parallel_size,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "max_model_len": cfg.data.max_prompt_length + cfg.data.max_response_length,
        "seed": cfg.trainer.seed,
        "distributed_executor_backend": "external_launcher",
        "enable_sleep_mode": True,
        "logprobs_mode": "processed_logprobs",
        "skip_tokenizer_init": False,
        "disable_log_stats": True,
    }
    if r.max_num_seqs is not None:
        kwargs["max_num_seqs"] = r.max_num_seqs
    kwargs.update(r.engine_kwargs)
    return kwargs


def build(cfg: Any, model: torch.nn.Module, tokenizer: Any, eos_ids: list[int], device: torch.device,
          environ: MutableMapping[str, str] | None = None) -> VLLMRolloutEngine:
    """A `VLLMRolloutEngine` loaded from `model.path` (or a saved copy of `model`) on `device`."""
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise missing_engine_error("vllm", e) from None
    require_cuda("vllm", device)
    env = os.environ if environ is None else environ
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        env.update(launcher_env(env, _free_port(), device.index or 0))
    model_dir = model_dir_for_engine(cfg.model.path, cfg.model.load_format, model, tokenizer)
    llm = vllm.LLM(**llm_kwargs(cfg, model_dir))
    return VLLMRolloutEngine(llm, eos_token_ids=eos_ids, dtype=resolve_dtype(cfg.model.dtype),
                             tokens_prompt=TokensPrompt, sampling_params_cls=vllm.SamplingParams)
