"""The `sglang` rollout engine: an offline `sglang.Engine` (SGLang 0.5.23), token ids in and out.

Written against sglang==0.5.23 (the `sglang` extra in pyproject.toml); `build` refuses any other
version. NOT run in this project: SGLang's CPU backend needs a CPU build of sgl-kernel, which PyPI
does not ship (only CUDA wheels, no sources), and no GPU machine here can install it
(docs/hardware.md). The calls below were read from the 0.5.23 wheel
(`sglang/srt/entrypoints/engine.py`: `Engine(**server_args)`, `generate`,
`update_weights_from_tensor`, `update_weights_from_distributed`, `release_memory_occupation`,
`resume_memory_occupation`; `sglang/srt/managers/tokenizer_manager.py`: `abort_request`, batch
streaming with `index`; `sglang/srt/sampling/sampling_params.py`: `sampling_seed`,
`no_stop_trim`, top_k=-1 meaning the whole vocabulary; `sglang/srt/layers/sampler.py`:
`SGLANG_RETURN_ORIGINAL_LOGPROB`). tests/unit/test_engine_adapters.py drives this adapter with a
fake Engine of those signatures.

How it is driven:
- `sglang.Engine(model_path=<HF folder>, tp_size, mem_fraction_static, max_running_requests,
  context_length, random_seed, skip_tokenizer_init=True, enable_memory_saver=True, base_gpu_id)`.
  The engine runs its scheduler in subprocesses; this process holds the tokenizer manager.
- `engine.generate(input_ids=[row, ...], sampling_params=[{..., "n": 1, "sampling_seed": s}, ...],
  return_logprob=True, rid=[id, ...])`: one request per response row (each prompt repeated n
  times), each with its own seed drawn from the engine's `generator`. Each output dict carries
  `output_ids`, `meta_info["output_token_logprobs"]` = [(logprob, token_id, text|None), ...] and
  `meta_info["finish_reason"]` = {"type": "stop" | "length" | "abort", ...}.
- Partial rollout (`generate(..., should_stop=fn)`, `continue_generation`): the same call with
  `stream=True`; SGLang yields cumulative chunks tagged with the request's `index`. `fn()` is
  checked between chunks; when it returns True every unfinished request is aborted with
  `engine.tokenizer_manager.abort_request(rid=...)` (SGLang's own abort, the one its HTTP
  `/abort_request` calls) and the stream is drained, so each row keeps the tokens and log-probs
  it had, with finish reason "abort". `continue_generation` submits prompt + partial tokens as new
  requests under the current weights, with the remaining budget.
- `update_weights`: tensors (HF checkpoint names: transformers' in-memory names from either training
  backend turned into the checkpoint layout by `trainer/rollout/checkpoint_layout.py`, per-expert MoE
  tensors included; on this GPU, in the engine dtype) sent in buckets of about `_BUCKET_BYTES`
  through `engine.update_weights_from_tensor(named_tensors=..., flush_cache=<last bucket>)`;
  SGLang serializes them once per TP rank (CUDA IPC handles) and its loader maps HF names (fused
  q/k/v, gate/up) itself. A `(False, message)` result raises. The fully-async rollout
  worker receives the trainer's weights over the project's broadcast group first
  (trainer/rollout/weight_sync.py) and then calls this same method;
  `update_weights_from_distributed` (SGLang joining the trainer's NCCL group) is not used.
- Images (a vision-language policy; not run, like the rest of this adapter): `generate(prompts,
  params, multi_modal_inputs=[...])` sends the trainer's expanded prompt ids with SGLang's
  "processor_output" image format, `image_data=[[{"format": "processor_output", "pixel_values",
  "image_grid_thw"}], ...]` (one list per request; SGLang's VLM query docs: that format needs
  `input_ids`, which then already hold every image token), so SGLang embeds the trainer's own
  pixels and does not expand the prompt again. Each image request's
  `meta_info["prompt_tokens"]` must equal the trainer's prompt length (a second expansion would
  change it). `continue_generation` takes no images (a partial rollout of image prompts is
  refused at start).
- `sleep`: `release_memory_occupation()` frees KV cache and weights (their content is lost);
  `wake_up`: `resume_memory_occupation()`. The trainer re-syncs weights after waking, so
  `generate` refuses to run on released weights until `update_weights` has run.

Log-probabilities: SGLang 0.5.23 returns `log_softmax(logits / T)` of the sampled token (or
`log(softmax(logits / T))`), taken before the top-k/top-p filters: the trainer's definition.
`SGLANG_RETURN_ORIGINAL_LOGPROB` makes it return the pre-temperature `log_softmax(logits)`, so
`build` refuses to start with it on. Greedy requests (all greedy in a batch) report
`log_softmax(logits)`, the `hf` engine's greedy convention.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from trainer.errors import ConfigError
from trainer.models.specs import resolve_dtype
from trainer.rollout.base import InterruptibleEngine, Rollout, SamplingParams
from trainer.rollout.vllm_engine import (
    engine_weights,
    missing_engine_error,
    model_dir_for_engine,
    normalize_finish_reason,
    require_cuda,
)

SUPPORTED_VERSION = "0.5.23"
_BUCKET_BYTES = 512 << 20
_ORIGINAL_LOGPROB_VARS = ("SGLANG_RETURN_ORIGINAL_LOGPROB", "RETURN_ORIGINAL_LOGPROB")


def check_version(version: str) -> None:
    """Refuse an SGLang other than the release this adapter is written against."""
    if version.split("+")[0] != SUPPORTED_VERSION and not version.startswith(SUPPORTED_VERSION + ".post"):
        raise ConfigError(f"rollout.engine=sglang: sglang {version} is installed, this adapter is written against "
                          f"sglang {SUPPORTED_VERSION} (fix: pip install 'rlbench[sglang]')")


def sglang_sampling_params(params: SamplingParams, eos_ids: list[int], max_new_tokens: int | None = None,
                           seed: int | None = None) -> dict[str, Any]:
    """SGLang's `sampling_params` dict for one request row (n=1: prompts are repeated instead)."""
    greedy = params.greedy
    out: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k <= 0 else int(params.top_k),
        "max_new_tokens": int(params.max_new_tokens if max_new_tokens is None else max_new_tokens),
        "stop_token_ids": sorted(set(eos_ids) | set(params.stop_token_ids)),
        "ignore_eos": False,
        "no_stop_trim": True,  # keep the stop token in the output, as the other engines do
    }
    if seed is not None:
        out["sampling_seed"] = int(seed)
    return out


def check_logprob_env(environ: Mapping[str, str]) -> None:
    """Refuse the SGLang switch that reports pre-temperature log-probs (see the module docstring)."""
    for var in _ORIGINAL_LOGPROB_VARS:
        if environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise ConfigError(f"rollout.engine=sglang: environment variable {var}={environ[var]} makes SGLang "
                              f"report log-probs before temperature (fix: unset {var})")


def parse_output(out: dict[str, Any], where: str) -> tuple[list[int], list[float], str | None]:
    """(token ids, log-probs, finish reason or None while streaming) of one SGLang output dict."""
    meta = out["meta_info"]
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise ValueError(f"{where}: no meta_info.output_token_logprobs (needs return_logprob=True)")
    ids = [int(t[1]) for t in triples]
    got = out.get("output_ids")
    if got is not None and list(got) != ids:
        raise ValueError(f"{where}: output_ids disagree with the token ids of output_token_logprobs")
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return ids, [float(t[0]) for t in triples], None if kind is None else normalize_finish_reason(kind, where)


def image_data(multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None) -> dict[str, Any]:
    """`{"image_data": [...]}` for `engine.generate` (one list of "processor_output" items per request, None
    for a text row), or {} when no row has images."""
    if not multi_modal_inputs or all(m is None for m in multi_modal_inputs):
        return {}
    return {"image_data": [None if m is None else [{"format": "processor_output", "pixel_values": m["pixel_values"],
                                                    "image_grid_thw": m["image_grid_thw"]}]
                           for m in multi_modal_inputs]}


def check_image_prompts(rows: list[list[int]], multi_modal_inputs: list[Any] | None, outputs: list[Any]) -> None:
    """ValueError when SGLang counted an image request's prompt differently from the trainer (it expanded
    the image tokens again, or dropped some)."""
    for j, (row, m, out) in enumerate(zip(rows, multi_modal_inputs or [], outputs)):
        got = (out or {}).get("meta_info", {}).get("prompt_tokens") if m is not None else None
        if got is not None and int(got) != len(row):
            raise ValueError(f"sglang output {j}: the image prompt is {got} tokens in the engine, {len(row)} in the "
                             f"trainer (fix: the engine must take the trainer's expanded ids with image_data in "
                             f"'processor_output' format)")


def rollout_from_sglang(prompts: list[list[int]], outputs: list[dict[str, Any]], n: int, version: int) -> Rollout:
    """Our `Rollout` from SGLang output dicts for `prompts` each repeated `n` times (prompt-major)."""
    if len(outputs) != len(prompts) * n:
        raise ValueError(f"sglang returned {len(outputs)} outputs for {len(prompts)} prompts x n={n}")
    prompt_ids, response_ids, logps, finish = [], [], [], []
    for j, out in enumerate(outputs):
        ids, lps, reason = parse_output(out, f"sglang output {j}")
        if reason is None:
            raise ValueError(f"sglang output {j}: no finish reason")
        prompt_ids.append(list(prompts[j // n]))
        response_ids.append(ids)
        logps.append(lps)
        finish.append(reason)
    return Rollout(prompt_ids=prompt_ids, response_ids=response_ids, response_logprobs=logps,
                   finish_reasons=finish, group_index=[j // n for j in range(len(outputs))],
                   policy_version=[version] * len(outputs), token_versions=[[version] * len(t) for t in response_ids])


def weight_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                   dtype: torch.dtype | None = None, device: torch.device | None = None,
                   layout: Callable[..., Iterable[tuple[str, torch.Tensor]]] | None = None
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Lists of (HF checkpoint name, tensor) of about `bucket_bytes` each (a larger tensor gets its own
    list); `layout`: in-memory names to the checkpoint layout (`trainer/rollout/checkpoint_layout.py`)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in engine_weights(named_tensors, dtype, layout):
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
                 dtype: torch.dtype | None = None, device: torch.device | None = None,
                 layout: Callable[..., Iterable[tuple[str, torch.Tensor]]] | None = None) -> int:
    """Push weights through `engine.update_weights_from_tensor`, flushing the cache after the last
    bucket only. Returns the number of calls made."""
    calls = 0
    pending: list[tuple[str, torch.Tensor]] | None = None
    for bucket in weight_buckets(named_tensors, bucket_bytes, dtype, device, layout):
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


class SGLangRolloutEngine(InterruptibleEngine):
    """Wraps a `sglang.Engine`; see the module docstring for the calls it makes."""

    name = "sglang"

    def __init__(self, engine: Any, *, eos_token_ids: list[int], dtype: torch.dtype | None = None,
                 device: torch.device | None = None, bucket_bytes: int = _BUCKET_BYTES, seed: int = 0,
                 layout: Callable[..., Iterable[tuple[str, torch.Tensor]]] | None = None):
        self.engine = engine
        self.layout = layout  # in-memory HF names -> the checkpoint layout SGLang loads (None: sent as they come)
        self.eos_token_ids = list(eos_token_ids)
        self.dtype = dtype
        self.device = device
        self.bucket_bytes = bucket_bytes
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0
        self._asleep = False
        self._weights_released = False
        self._calls = 0

    def _check_awake(self) -> None:
        if self._asleep:
            raise RuntimeError("sglang engine is asleep: call wake_up() before generate()")
        if self._weights_released:
            raise RuntimeError("sglang engine weights were released by sleep(): call update_weights() first")

    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 should_stop: Callable[[], bool] | None = None,
                 multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None) -> Rollout:
        """`InterruptibleEngine.generate`, plus each prompt's `multi_modal_inputs` (module docstring)."""
        return super().generate(prompts, params, should_stop=should_stop, multi_modal_inputs=multi_modal_inputs)

    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                    should_stop: Callable[[], bool] | None = None,
                    multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None
                    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Continue each token row by at most `budgets[i]` tokens (one request each); "abort" rows were
        interrupted by `should_stop`. `multi_modal_inputs[i]`: row i's processed images."""
        self._check_awake()
        images = image_data(multi_modal_inputs)
        self._calls += 1
        rids = [f"rlbench-{self._calls}-{i}" for i in range(len(rows))]
        sps = [sglang_sampling_params(params, self.eos_token_ids, b,
                                      seed=int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator)))
               for b in budgets]
        if should_stop is None:
            outputs = list(self.engine.generate(input_ids=rows, sampling_params=sps, return_logprob=True, rid=rids,
                                                **images))
            parsed = [parse_output(o, f"sglang output {j}") for j, o in enumerate(outputs)]
            check_image_prompts(rows, multi_modal_inputs, outputs)
        else:
            latest: list[dict[str, Any] | None] = [None] * len(rows)
            done = [False] * len(rows)
            aborted = False
            for chunk in self.engine.generate(input_ids=rows, sampling_params=sps, return_logprob=True, rid=rids,
                                              stream=True, **images):
                i = int(chunk["index"])
                latest[i] = chunk
                done[i] = parse_output(chunk, f"sglang output {i}")[2] is not None
                if not aborted and not all(done) and should_stop():
                    for j, rid in enumerate(rids):
                        if not done[j]:
                            self.engine.tokenizer_manager.abort_request(rid=rid)
                    aborted = True  # keep reading: aborted requests end with finish reason "abort"
            parsed = [parse_output(o, f"sglang output {j}") if o is not None else ([], [], "abort")
                      for j, o in enumerate(latest)]
            check_image_prompts(rows, multi_modal_inputs, latest)
        if len(parsed) != len(rows):
            raise ValueError(f"sglang returned {len(parsed)} outputs for {len(rows)} requests")
        for j, (_, _, reason) in enumerate(parsed):
            if reason is None:
                raise ValueError(f"sglang output {j}: no finish reason")
        return [p[0] for p in parsed], [p[1] for p in parsed], [str(p[2]) for p in parsed]

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self._asleep:
            self.wake_up()
        send_weights(self.engine, named_tensors, bucket_bytes=self.bucket_bytes, dtype=self.dtype, device=self.device,
                     layout=self.layout)
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
    if cfg.model.override_config:  # SGLang's --json-model-override-args: a JSON object merged into the HF config
        kwargs["json_model_override_args"] = json.dumps(cfg.model.override_config)
    kwargs.update(r.engine_kwargs)
    return kwargs


def build(cfg: Any, model: torch.nn.Module, tokenizer: Any, eos_ids: list[int], device: torch.device,
          environ: Mapping[str, str] | None = None) -> SGLangRolloutEngine:
    """An `SGLangRolloutEngine` loaded from `model.path` (or a saved copy of `model`) on `device`."""
    try:
        import sglang
    except ImportError as e:
        raise missing_engine_error("sglang", e) from None
    check_version(str(getattr(sglang, "__version__", "unknown")))
    require_cuda("sglang", device)
    check_logprob_env(os.environ if environ is None else environ)
    from trainer.rollout.vllm_engine import check_tensor_parallel

    check_tensor_parallel(cfg.rollout.tensor_parallel_size, device)
    from trainer.models.vlm import is_vlm, load_vision_processor

    vision = load_vision_processor(cfg.model.path, tokenizer, model) if is_vlm(model) else None
    model_dir = model_dir_for_engine(cfg.model.path, cfg.model.load_format, model, tokenizer,
                                     image_processor=vision.image_processor if vision is not None else None)
    from trainer.rollout.checkpoint_layout import CheckpointLayout

    layout = CheckpointLayout(model)
    engine = sglang.Engine(**engine_kwargs(cfg, model_dir, device))
    return SGLangRolloutEngine(engine, eos_token_ids=eos_ids, dtype=resolve_dtype(cfg.model.dtype), device=device,
                               seed=cfg.trainer.seed, layout=layout)
