"""Metrics: verl's names, one JSON line per step, timing, and the per-batch data statistics.

The log is `<out_dir>/metrics.jsonl`, in the shape of verl's file logger so every tool that reads
verl logs reads ours: `{"step": N, "data": {"actor/ppo_kl": ..., ...}}`. Step 0 holds the
validation before training; training steps are 1..total_steps. Every name is documented in
docs/metrics.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from trainer.components.batch import Batch


class Timer:
    """Collects `timing_s/<name>` for one step: `with timer("gen"): ...`."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.times.items()}


def _clean(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them visible ("nan"), readers parse them back
    return v


class MetricsWriter:
    """Appends one line per step to `metrics.jsonl`; on resume, drops lines after the checkpoint."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, data: dict[str, Any]) -> None:
        line = json.dumps({"step": step, "data": {k: _clean(v) for k, v in sorted(data.items())}})
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())  # on disk before the step's checkpoint is committed (trainer/components/checkpoint.py)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a metrics.jsonl as dicts (`{"step", "data"}`), skipping a truncated last line."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def data_metrics(batch: Batch, *, max_response_length: int) -> dict[str, float]:
    """verl's `compute_data_metrics`: scores, rewards, advantages, returns, values and lengths."""
    mask = batch.response_mask.bool()
    resp_len = batch.response_mask.sum(-1)  # [N]
    prompt_len = batch.attention_mask[:, : batch.prompt_len].sum(-1)  # [N]
    m: dict[str, float] = {}
    if batch.scores is not None:
        m.update(_stats("critic/score", batch.scores))
    if batch.token_rewards is not None:
        m.update(_stats("critic/rewards", batch.token_rewards.sum(-1)))
    for name, t in (("critic/advantages", batch.advantages), ("critic/returns", batch.returns),
                    ("critic/values", batch.values)):
        if t is not None and mask.any():
            m.update(_stats(name, t[mask]))
    if batch.advantages is not None and batch.group_index is not None and mask.any():
        m["critic/advantages/group_mean_abs_max"] = group_mean_abs_max(batch.advantages, batch.response_mask,
                                                                       batch.group_index)
    m.update(_stats("response_length", resp_len))
    m["response_length/clip_ratio"] = (resp_len >= max_response_length).float().mean().item()
    m.update(_stats("prompt_length", prompt_len))
    return m


def group_mean_abs_max(advantages: torch.Tensor, response_mask: torch.Tensor, group_index: torch.Tensor) -> float:
    """max over prompt groups of |mean over the group's responses of the response's mean advantage|.

    The outcome estimators (GRPO, Dr.GRPO, RLOO) give each response one scalar advantage with
    group mean 0 by construction, so this is ~0 (float rounding) for them; GAE's are whitened over
    the batch, not per group. Responses without a valid token are left out.
    """
    mask = response_mask.float()  # [N, R]
    ntok = mask.sum(-1)  # [N]
    keep = ntok > 0
    if not bool(keep.any()):
        return float("nan")
    per_resp = (advantages.float() * mask).sum(-1)[keep] / ntok[keep]  # [N']
    _, dense = torch.unique(group_index[keep], return_inverse=True)
    num = int(dense.max()) + 1
    total = torch.zeros(num).index_add_(0, dense, per_resp)
    count = torch.zeros(num).index_add_(0, dense, torch.ones_like(per_resp))
    return float((total / count).abs().max())
