"""Save and resume: everything a run needs to continue exactly as if it had not stopped, under kill -9.

A checkpoint is `<out_dir>/checkpoints/step_<N>/` holding `state.pt` (the actor's weights,
optimizer and scheduler, the critic when there is one, the data sampler's position, every random
state), any files the Ray workers add (`actor.pt`, `critic.pt`), `metrics.jsonl` (a copy of the
log up to step N) and `manifest.json` (step, and each file's size and CRC-32), written last.

One step is committed in this order (`prepare_checkpoint`, then `finish_step`):

    1. the files go into `.tmp_step_<N>/` (a kill here leaves the previous checkpoint the newest)
    2. the step's metrics line is appended to `metrics.jsonl` and fsynced
    3. the log copy and the manifest go into the folder, which is renamed to `step_<N>/`: the commit

Resuming (`resume_checkpoint`) takes the newest checkpoint whose manifest matches its files (a
damaged one, e.g. a truncated `state.pt`, is moved to `.damaged_step_<N>/` and the previous one
used, with a warning naming both) and cuts `metrics.jsonl` to the lines of steps <= N (replacing
it atomically). Every line of a step <= N was written before the commit of N, and every line of
a later step is written again by the resumed run, so a kill at any instant loses or duplicates
no line; on CPU the rewritten lines are the same numbers. A log that lost lines (deleted by hand)
is restored from the checkpoint's copy.

`RLBENCH_FAULT_AT=<phase>:<step>` (test-only, `trainer/components/faults.py`) kills the process at a phase of
a step, to test exactly this.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.components.faults import fault_point
from trainer.errors import RLBenchError

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
LOG_COPY = "metrics.jsonl"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _step_dirs(out_dir: str | Path) -> list[tuple[int, Path]]:
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir())


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest committed checkpoint folder (not verified; see `resume_checkpoint`), or None."""
    found = [(s, p) for s, p in _step_dirs(out_dir) if (p / "state.pt").is_file()]
    return found[-1][1] if found else None


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


def _crc32(path: Path) -> str:
    """CRC-32 of a file, read in 8 MiB chunks (zlib: ~3 GB/s; it detects torn writes and flipped bytes,
    which is what it is for, not tampering)."""
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _CRCWriter:
    """A file wrapper that keeps the CRC-32 and size of what goes through it (no read-back for the manifest)."""

    def __init__(self, f: Any) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, data: Any) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(memoryview(data).cast("B"))
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


@dataclass
class PendingCheckpoint:
    """A checkpoint written to its temporary folder, not yet committed (see the module docstring)."""

    tmp: Path
    final: Path
    step: int
    keep: int
    known: dict[str, dict[str, Any]] = field(default_factory=dict)  # files whose crc32 was taken while writing

    def commit(self, log_path: Path | None = None) -> Path:
        """Copy the log (lines of steps <= step), write the manifest, rename into place, prune old ones."""
        if log_path is not None and log_path.exists():
            lines = [ln for ln in _log_lines(log_path) if _line_step(ln) is not None and _line_step(ln) <= self.step]
            (self.tmp / LOG_COPY).write_text("".join(ln + "\n" for ln in lines))
        files = {p.name: self.known.get(p.name) or {"size": p.stat().st_size, "crc32": _crc32(p)}
                 for p in sorted(self.tmp.iterdir()) if p.is_file() and p.name != MANIFEST}
        (self.tmp / MANIFEST).write_text(json.dumps({"step": self.step, "files": files}, indent=1))
        for name in (MANIFEST, LOG_COPY):  # the small files; a large one torn by a power loss fails its crc32
            if (self.tmp / name).exists():
                _fsync(self.tmp / name)
        shutil.rmtree(self.final, ignore_errors=True)
        self.tmp.rename(self.final)
        _fsync(self.final.parent)
        fault_point("commit", self.step)
        for _, old in _step_dirs(self.final.parent.parent)[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return self.final


def prepare_checkpoint(out_dir: str | Path, step: int, state: dict[str, Any], *, keep: int = 2,
                       write_files: Callable[[Path], dict[str, Any]] | None = None) -> PendingCheckpoint:
    """Write `state` (and `write_files(folder)`'s files; it returns entries to add to `state.pt`, e.g.
    each worker's random state) into checkpoint `step`'s temporary folder; `commit()` makes it count."""
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    extra = write_files(tmp) if write_files is not None else {}
    fault_point("checkpoint", step)
    with (tmp / "state.pt").open("wb") as f:
        out = _CRCWriter(f)
        torch.save({"step": step, **state, **extra, "rng": rng_state()}, out)
    known = {"state.pt": {"size": out.size, "crc32": f"{out.crc:08x}"}}
    return PendingCheckpoint(tmp, root / f"step_{step:06d}", step, keep, known)


def save_checkpoint(out_dir: str | Path, step: int, state: dict[str, Any], *, keep: int = 2,
                    write_files: Callable[[Path], dict[str, Any]] | None = None) -> Path:
    """`prepare_checkpoint` and commit at once (for callers that log no line for the step)."""
    return prepare_checkpoint(out_dir, step, state, keep=keep, write_files=write_files).commit()


def finish_step(writer: Any, step: int, metrics: dict[str, Any], pending: PendingCheckpoint | None) -> None:
    """Append the step's metrics line, then commit its checkpoint (the order that makes a kill safe)."""
    writer.write(step, metrics)
    fault_point("line", step)
    if pending is not None:
        pending.commit(writer.path)


# --------------------------------------------------------------------------- resuming

def _log_lines(path: Path) -> list[str]:
    """The complete lines of a log (a last line cut by a kill, without its newline, is left out)."""
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    return [ln for ln in lines[:-1] if ln.strip()]  # text after the last newline is an unfinished write


def _line_step(line: str) -> int | None:
    try:
        step = json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


_VERIFIED: set[tuple[str, int, tuple[int, int] | None]] = set()


def verify_checkpoint(path: Path) -> str | None:
    """None when the checkpoint's files match its manifest (and state.pt loads); else what is wrong.
    A folder verified once in this process (same manifest) is not hashed again."""
    manifest = path / MANIFEST
    state = (path / "state.pt").stat() if (path / "state.pt").is_file() else None
    key = (str(path.resolve()), manifest.stat().st_mtime_ns if manifest.is_file() else -1,
           (state.st_mtime_ns, state.st_size) if state else None)
    if key in _VERIFIED:
        return None
    why = _verify(path, manifest)
    if why is None:
        _VERIFIED.add(key)
    return why


def _verify(path: Path, manifest: Path) -> str | None:
    if not manifest.is_file():  # written by a version without manifests: a load test
        try:
            torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 -- any failure to unpickle means a damaged file
            return f"state.pt does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return f"{MANIFEST} is not valid"
    for name, want in files.items():
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, the manifest says {want['size']}"
        if "crc32" in want and _crc32(p) != want["crc32"]:
            return f"{name}'s crc32 differs from the manifest's"
    return None


def resume_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest undamaged checkpoint in `out_dir`, or None when there is none.

    A damaged newer one is moved aside to `.damaged_step_<N>` with a warning naming it, why, and the
    checkpoint used instead; when every checkpoint is damaged this is an error (one line)."""
    damaged: list[str] = []
    for _, path in reversed(_step_dirs(out_dir)):
        if not (path / "state.pt").is_file():
            continue
        why = verify_checkpoint(path)
        if why is None:
            for d in damaged:
                log.warning("%s; resuming from the previous checkpoint %s instead", d, path)
            return path
        aside = path.parent / f".damaged_{path.name}"
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        damaged.append(f"checkpoint {path} is damaged ({why}; moved to {aside})")
    if damaged:
        raise RLBenchError(f"{damaged[0]} and no earlier checkpoint is intact (fix: set trainer.resume=false "
                           f"to start over, or trainer.out_dir to a new folder)")
    return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint folder's state (and restore the global random states)."""
    state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    set_rng_state(state["rng"])
    return state


def restore_log(log_path: Path, ckpt: Path, step: int) -> None:
    """Cut the log to steps <= `step` (atomically); lines the log lost are taken from the checkpoint's copy."""
    kept = [ln for ln in _log_lines(log_path) if (s := _line_step(ln)) is not None and s <= step] \
        if log_path.exists() else []
    copy = ckpt / LOG_COPY
    if copy.is_file():
        saved = _log_lines(copy)
        if {_line_step(ln) for ln in saved} - {_line_step(ln) for ln in kept}:
            log.warning("%s lacks lines of steps <= %d; restored them from %s", log_path, step, copy)
            kept = saved
    tmp = log_path.with_name(log_path.name + ".tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept))
    _fsync(tmp)
    os.replace(tmp, log_path)


def start_fresh(out_dir: str | Path, log_path: Path) -> None:
    """A run starting at step 0 in `out_dir`: no log, and no checkpoint of an earlier run left to resume."""
    old = _step_dirs(out_dir)
    if log_path.exists() and (n := len(_log_lines(log_path))):
        log.warning("starting over in %s: replacing the %d line(s) of %s (no checkpoint to resume from)",
                    out_dir, n, log_path)
    if old:
        log.warning("starting over in %s: removing %d checkpoint(s) of an earlier run (newest %s)",
                    out_dir, len(old), old[-1][1].name)
        for _, p in old:
            shutil.rmtree(p, ignore_errors=True)
    if log_path.exists():
        tmp = log_path.with_name(log_path.name + ".tmp")
        tmp.write_text("")
        os.replace(tmp, log_path)


def resume_or_start(out_dir: str | Path, log_path: Path, *, resume: bool) -> Path | None:
    """The checkpoint a run continues from (`trainer.resume` and one is intact), or None after clearing
    the log and any earlier checkpoints for a run from step 0."""
    ckpt = resume_checkpoint(out_dir) if resume else None
    if ckpt is None:
        start_fresh(out_dir, log_path)
    return ckpt


def announce_resume(ckpt: Path, step: int, total_steps: int, log_path: Path) -> None:
    """Cut the log to the checkpoint's step and say where the run continues from."""
    restore_log(log_path, ckpt, step)
    print(f"resuming from checkpoint {ckpt} (step {step} of {total_steps}; {log_path} kept to step {step})",
          file=sys.stderr, flush=True)


def completed_message(out_dir: str | Path, ckpt: Path, total_steps: int) -> str:
    step = checkpoint_step(ckpt)
    state = f"already complete at {step}/{total_steps} steps" if step == total_steps else (
        f"already at step {step}, beyond trainer.total_steps={total_steps}")
    return (f"run in {out_dir} is {state} (checkpoint {ckpt}); nothing to do (to start fresh: set "
            f"trainer.resume=false or a new trainer.out_dir; to train longer: raise trainer.total_steps)")


def checkpoint_step(path: Path) -> int:
    """The step of a committed checkpoint folder (from its name)."""
    m = _STEP_DIR.match(path.name)
    if m is None:
        raise ValueError(f"not a checkpoint folder: {path}")
    return int(m.group(1))
