"""`python -m trainer.bench.moe_backends --bench ...` with a fuller profile of the step named in `--profile`.

    PROF_OUT=prof.txt [PROF_TRACE=trace.json.gz] python3 tools/sm90/moe_profile.py --bench --variants "megatron actor" \
        --profile "megatron actor" --batch 8 --seq 1024 --accum 1 --out res.json

The bench's own `--profile` lists the top CUDA kernels of one step. Here the profiled step (one more step after
the timed ones) records CPU and CUDA activity, with `record_function` ranges around the actor's phases (decoder
forward, LM head, loss, router statistics, backward, gradient finish + optimizer), and appends to `PROF_OUT`:
the top 30 of `key_averages()` by self device time (kernels), the top 30 by total device time (ops and ranges,
children included) and the top 30 by self CPU time; `PROF_TRACE` also gets the Chrome trace (gzipped). The
bench's JSON keeps its kernel list (`profile`). Timing and everything else are the bench's.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import trainer.bench.moe_backends as mb


def _wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "_profiled", False):
        return

    def wrapped(*a, **k):
        with record_function(label):
            return fn(*a, **k)

    wrapped._profiled = True
    setattr(owner, name, wrapped)


def _ranges() -> None:
    """record_function ranges around the actor's phases (both backends); a module not found is skipped."""
    import importlib

    targets = [("trainer.backends.actor", "Actor", "micro_batch_loss", "phase:loss"),
               ("trainer.backends.actor", "Actor", "finish_grads_and_clip", "phase:grads_finish+clip(+megatron step)"),
               ("trainer.ops.logprobs", None, "response_hidden_states", "phase:decoder_forward"),
               ("trainer.ops.logprobs", None, "lm_head_logprobs", "phase:lm_head_forward"),
               ("trainer.models.moe", "RouterRecorder", "pop", "phase:router_stats"),
               ("trainer.backends.megatron.backend", "MegatronActor", "_decoder_forward", "phase:decoder_forward"),
               ("trainer.backends.megatron.backend", None, "lm_head_logprobs", "phase:lm_head_forward"),
               ("trainer.backends.megatron.gpu", None, "megatron_step", "phase:megatron_grad_sync+clip+step"),
               ("trainer.backends.megatron.gpu", "_Steps", "zero_grad", "phase:megatron_zero_grad"),
               ("trainer.backends.mixed_precision", "BF16Params", "sync_to_model", "phase:master_to_bf16_copy")]
    for module, cls, name, label in targets:
        try:
            owner = importlib.import_module(module)
        except ImportError as e:
            print(f"moe_profile: no range {label} ({e})")
            continue
        _wrap(getattr(owner, cls) if cls else owner, name, label)
    _wrap(torch.Tensor, "backward", "phase:backward")
    _wrap(torch.optim.Optimizer, "zero_grad", "phase:zero_grad")


def _table(prof, sort: str, rows: int = 30) -> str:
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=90)


def rich_profile(step, rows: int = 30) -> list[dict]:
    try:
        return _rich_profile(step, rows)
    except Exception as e:  # noqa: BLE001 - a failed profile must not lose the timed steps
        import traceback

        traceback.print_exc()
        return [{"profile_error": f"{type(e).__name__}: {e}"}]


def _rich_profile(step, rows: int) -> list[dict]:
    _ranges()
    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        with record_function("phase:step"):
            step()
        if cuda:
            torch.cuda.synchronize()
    out = os.environ.get("PROF_OUT")
    if out:
        with open(out, "a") as f:
            f.write(f"\n##### {' '.join(sys.argv[1:])}\n")
            f.writelines(f"\n=== key_averages top {rows} by {sort}\n{_table(prof, sort, rows)}\n"
                         for sort in ("self_cuda_time_total", "cuda_time_total", "self_cpu_time_total"))
    trace = os.environ.get("PROF_TRACE")
    if trace:
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            prof.export_chrome_trace(tmp.name)
            with open(tmp.name, "rb") as src, gzip.open(trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events)
    print(f"profile: device time {total / 1e3:.1f} ms (self, all ops); top {rows} kernels/ops:")
    top = []
    for e in events[:rows]:
        top.append({"kernel": e.key[:120], "ms": e.self_device_time_total / 1e3, "calls": e.count})
        print(f"  {e.self_device_time_total / 1e3:8.2f} ms {e.count:6d}x  {e.key[:110]}")
    return [{"total_ms": total / 1e3}] + top


if __name__ == "__main__":
    import trainer
    from trainer.config import ActorConfig

    print(f"moe_profile: trainer from {trainer.__file__}, actor.lm_head_compile "
          f"{getattr(ActorConfig(), 'lm_head_compile', 'absent')}", flush=True)
    mb._profile = rich_profile
    with contextlib.suppress(SystemExit):
        mb.main()
