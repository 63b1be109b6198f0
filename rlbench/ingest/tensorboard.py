"""Read a TensorBoard log directory (event files) with TensorBoard's own reader, as a metrics log.

    from rlbench.ingest.tensorboard import read_tensorboard
    frame, warnings = read_tensorboard("runs/tb")   # one column per scalar tag, indexed by step
    rlbench check runs/tb --suite SUITE --profile cpu --arch cpu    # rlbench.ingest.load reads a TB folder

`tensorboard.backend.event_processing.event_accumulator.EventAccumulator` reads every scalar event of
the folder's event files (`size_guidance` 0: all of them, not TensorBoard's default sample of 10,000):
`add_scalar` events (torch.utils.tensorboard, tensorboardX, verl's `trainer.logger: tensorboard`) and
TF2 `tf.summary.scalar` tensors of one value. TensorBoard stores scalars as 32-bit floats: a value
reads back as the float32 it was written as. A step logged twice for one tag (a resumed run) keeps the
last value, with a warning. Refused with one line: a folder with no event file (naming the
sub-folders that have some: pass one of them, each is one run), or with no scalar at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from trainer.errors import DataError

EVENT_GLOB = "events.out.tfevents.*"


def is_tensorboard_dir(path: Path) -> bool:
    return path.is_dir() and any(path.glob(EVENT_GLOB))


def read_tensorboard(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """(frame [steps, tags] of float, warnings) of the event files in `path`; DataError when none can be read."""
    p = Path(path)
    if not any(p.glob(EVENT_GLOB)):
        subs = sorted({str(e.parent.relative_to(p)) for e in p.rglob(EVENT_GLOB)})
        hint = (f"its sub-folders {', '.join(subs[:5])} have event files: pass one of them (one run each)"
                if subs else "pass the folder that holds events.out.tfevents.* files")
        raise DataError(f"{p}: no TensorBoard event file in this folder; {hint}")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise DataError(f"{p}: a TensorBoard log folder, and tensorboard is not installed: "
                        "pip install 'rlbench[loggers]' (or pip install tensorboard)") from None
    acc = EventAccumulator(str(p), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    cols: dict[str, dict[int, float]] = {}
    warnings: list[str] = []

    def put(tag: str, step: int, value: float) -> None:
        col = cols.setdefault(tag, {})
        if step in col and tag not in dup:
            dup.add(tag)
            warnings.append(f"{tag}: step {step} logged more than once (a resumed run?); the last value is kept")
        col[step] = value

    dup: set[str] = set()
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            put(tag, int(ev.step), float(ev.value))
    for tag in tags.get("tensors", []):
        for ev in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(ev.tensor_proto)
            if arr.size == 1 and np.issubdtype(arr.dtype, np.number):
                put(tag, int(ev.step), float(arr.reshape(())))
    if not cols:
        raise DataError(f"{p}: TensorBoard events with no scalar (tags: "
                        f"{', '.join(f'{k} {len(v)}' for k, v in tags.items() if v) or 'none'}); rlbench reads "
                        "scalars (add_scalar / tf.summary.scalar)")
    frame = pd.DataFrame(cols).sort_index()
    frame.index = frame.index.astype(int)
    frame.index.name = "step"
    return frame.astype(float), warnings
