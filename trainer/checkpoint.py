"""Save and resume: everything a run needs to continue exactly as if it had not stopped.

A checkpoint is `<out_dir>/checkpoints/step_<N>/state.pt` holding the actor (weights, optimizer,
scheduler), the critic when there is one, the data sampler's position, and every random state
(python, torch, the rollout engine's sampling generator). It is written to a temporary folder and
renamed, so a run killed mid-save leaves the previous checkpoint intact. Runs on several workers
(`trainer/distributed/`) add their own files to the same folder before the rename (`write_files`:
trainer rank 0 writes `actor.pt`), so a checkpoint is complete exactly when `state.pt` exists. Resuming loads the newest
complete checkpoint and truncates `metrics.jsonl` to the steps it covers, so no metric line is lost
or duplicated.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / "state.pt").is_file()]
    return max(found)[1] if found else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(out_dir: str | Path, step: int, state: dict[str, Any], *, keep: int = 2,
                    write_files: Callable[[Path], dict[str, Any]] | None = None) -> Path:
    """Write `state` as checkpoint `step`; keep the newest `keep` checkpoints.

    `write_files(folder)` (optional) writes more files into the not-yet-renamed folder and returns
    entries to add to `state.pt` (e.g. each worker's random state)."""
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    extra = write_files(tmp) if write_files is not None else {}
    torch.save({"step": step, **state, **extra, "rng": rng_state()}, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    done = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)))
    for _, old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint folder's state (and restore the global random states)."""
    state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    set_rng_state(state["rng"])
    return state
