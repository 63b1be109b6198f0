"""Progress lines of a training run that the suite runner starts: step k/N, s/step, current score.

    from rlbench.run.progress import MetricsTail
    with MetricsTail(out_dir / "metrics.jsonl", total=8, label="suite [cpu] colocated", status=print):
        train(cfg)
    # suite [cpu] colocated: step 3/8, 19.2 s/step, score 0.412, val acc 0.59, ~1.6 min left

The trainer's own tqdm bar goes to stderr, which pytest captures during `pytest suites/`; this
reads the `metrics.jsonl` the trainer appends to after every step (one JSON line, flushed) from
a background thread and hands one line per new step to `status` (at most one per `every_s`
seconds, and always the last step), so a long suite run shows where it is. A log left by an
earlier run is skipped (reading starts at its end) and a log that shrinks (a fresh run truncates
it) is read again from the start. `s/step` is the step's `timing_s/step` when logged, else the
wall time since the previous line; `score` is `critic/score/mean`; `val acc` the latest
`val-core/.../acc/...` value.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any


def progress_line(label: str, step: int, total: int, data: dict[str, Any], s_per_step: float | None,
                  val_acc: float | None) -> str:
    """'label: step 3/8, 19.2 s/step, score 0.412, val acc 0.59, ~1.6 min left'."""
    parts = [f"{label}: step {step}/{total}"]
    if s_per_step is not None and math.isfinite(s_per_step):
        parts.append(f"{s_per_step:.1f} s/step")
    score = data.get("critic/score/mean")
    if isinstance(score, (int, float)) and math.isfinite(score):
        parts.append(f"score {score:.3f}")
    if val_acc is not None:
        parts.append(f"val acc {val_acc:.3g}")
    if s_per_step is not None and math.isfinite(s_per_step) and step < total:
        left = s_per_step * (total - step)
        parts.append(f"~{left / 60:.1f} min left" if left >= 90 else f"~{left:.0f} s left")
    return ", ".join(parts)


class MetricsTail:
    """Background reader of a growing metrics.jsonl that reports progress through `status`."""

    def __init__(self, path: str | Path, *, total: int, label: str, status: Callable[[str], None],
                 every_s: float = 10.0, poll_s: float = 1.0) -> None:
        self.path = Path(path)
        self.total, self.label, self.status = total, label, status
        self.every_s, self.poll_s = every_s, poll_s
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        self.partial = ""  # an incomplete last line, completed by the next read
        self.last_step: int | None = None
        self.last_data: dict[str, Any] = {}
        self.val_acc: float | None = None
        self.reported_step: int | None = None
        self.last_emit = -math.inf
        self.last_step_time = time.monotonic()
        self.s_per_step: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress {label}", daemon=True)

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.poll(final=exc_type is None)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - progress must never break a run: say so once and stop
                self.status(f"{self.label}: no progress lines ({type(e).__name__}: {e})")
                return

    def _read_new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        size = self.path.stat().st_size
        if size < self.offset:  # rewritten from scratch (a fresh run truncates the log)
            self.offset, self.partial = 0, ""
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        self.offset = size
        text = self.partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()  # "" when the chunk ended with a newline
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and isinstance(rec.get("data"), dict):
                out.append(rec)
        return out

    def poll(self, final: bool = False) -> None:
        """Read what the trainer wrote since the last poll; emit a line when due."""
        now = time.monotonic()
        for rec in self._read_new():
            step, data = rec["step"], rec["data"]
            t = data.get("timing_s/step")
            if isinstance(t, (int, float)):
                self.s_per_step = float(t)
            elif self.last_step is not None and step > self.last_step:
                self.s_per_step = (now - self.last_step_time) / (step - self.last_step)
            for k, v in data.items():
                if k.startswith("val-core/") and "/acc/" in k and isinstance(v, (int, float)):
                    self.val_acc = float(v)
            if self.last_step is None or step != self.last_step:
                self.last_step_time = now
            self.last_step, self.last_data = step, {**(self.last_data if step == self.last_step else {}), **data}
        if self.last_step is None or self.last_step == self.reported_step:
            return
        due = now - self.last_emit >= self.every_s or self.last_step >= self.total or final
        if due:
            self.status(progress_line(self.label, self.last_step, self.total, self.last_data, self.s_per_step,
                                      self.val_acc))
            self.reported_step, self.last_emit = self.last_step, now
