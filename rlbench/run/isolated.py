"""Train one run in a process of its own, measuring its memory; the caller's process stays as it was.

    from rlbench.run.isolated import train_isolated
    done = train_isolated(cfg, status=print)   # runs `python -m trainer <out_dir>/config.requested.yaml`
    done.metrics                               # <out_dir>/metrics.jsonl
    done.memory                                # {"peak_rss_gb": ..., "driver_rss_gb": {...}, ...}

Why a process per run: a suite session (`pytest suites/`) trains a dozen runs, some of them Ray runs
whose workers need most of a 24 GB machine. Models, optimizers, engine caches and the allocator's
arenas of a run made inside the pytest process outlive it (a colocated MoE run left ~9.6 GB behind),
and the Ray run that followed was killed for memory. In a child process everything a run allocates
is returned to the machine when it exits, whatever the run did, so the session's memory after a
run equals its memory before (recorded here as `driver_rss_gb` before/after, and checked by
`memory_results`).

The child is the trainer's own command line on the resolved config, with this interpreter and the
caller's environment (the profile's `env` included). Its stderr is streamed through (the progress
bar, warnings) and kept in `<out_dir>/trainer.log`. Failures keep the trainer's meaning:

- exit 2 (the trainer's bad-input exit) -> `ConfigError` with the trainer's one-line message;
- any other exit -> `TrainingCrashed` with the last line of its traceback;
- killed by a signal (SIGKILL from the kernel's OOM killer, most likely) -> `TrainingCrashed` naming
  the signal and the peak memory measured until then.

Before the child starts, `require_free_memory` stops with one line when the machine has less memory
available than the profile's budget (`requires.memory_gb` of the suite profile), instead of a kill
for memory in the middle of the run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlbench.run.memory import TreeMemory, machine_memory_gb, process_rss_gb
from trainer.config import TrainerConfig
from trainer.errors import ConfigError, RLBenchError

REQUESTED_CONFIG = "config.requested.yaml"
TRAINER_LOG = "trainer.log"
MEMORY_FILE = "memory.json"


class TrainingCrashed(RLBenchError):
    """The trainer process failed other than on bad input (a traceback, a signal)."""


@dataclass
class Trained:
    metrics: Path  # <out_dir>/metrics.jsonl
    memory: dict[str, Any]  # TreeMemory.record() plus the driver's RSS before and after


def require_free_memory(budget_gb: float | None, what: str) -> None:
    """One line, before a run starts, when the machine cannot give the run its memory budget now."""
    if not budget_gb:
        return
    mem = machine_memory_gb()
    if mem["available_gb"] < budget_gb:
        raise ConfigError(
            f"{what}: its budget is {budget_gb:g} GB of memory at peak (requires.memory_gb) and this machine has "
            f"{mem['available_gb']:.1f} of {mem['total_gb']:.1f} GB available now (fix: stop what else is running, "
            f"or run on a machine with more memory)")


def _pump(stream: Any, log_path: Path, tail: deque[str]) -> None:
    """Copy the child's stderr to ours and to trainer.log, keeping its last lines for an error message."""
    with log_path.open("ab") as log:
        buf = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            log.write(chunk)
            buf += chunk
            *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
            tail.extend(x.decode("utf-8", "replace").strip() for x in lines if x.strip())
        if buf.strip():
            tail.append(buf.decode("utf-8", "replace").strip())


def _failure_line(tail: deque[str]) -> str:
    """The line that says what went wrong: the trainer's `error: ...`, else the traceback's last line."""
    lines = list(tail)
    for line in reversed(lines):
        if line.startswith("error: "):
            return line[len("error: "):]
    for line in reversed(lines):
        if not line.startswith(("File ", "^", "~")) and ("Error" in line or "Exception" in line):
            return line
    return lines[-1] if lines else "(no output)"


def train_isolated(cfg: TrainerConfig, *, status: Callable[[str], None] | None = None,
                   memory_every_s: float = 0.5) -> Trained:
    """Run `python -m trainer` on `cfg` in a child process; return its metrics path and memory record."""
    out_dir = Path(cfg.trainer.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / REQUESTED_CONFIG
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    log_path = out_dir / TRAINER_LOG
    log_path.write_bytes(b"")
    driver_before = process_rss_gb()
    tail: deque[str] = deque(maxlen=60)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", str(cfg_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    pump = threading.Thread(target=_pump, args=(proc.stderr, log_path, tail), daemon=True)
    pump.start()
    try:
        with TreeMemory(proc.pid, every_s=memory_every_s) as mem:
            rc = proc.wait()
    except BaseException:  # Ctrl-C or a session stop: the child's tree must not outlive us
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        pump.join(timeout=10)
    record = {**mem.record(), "machine": machine_memory_gb(),
              "driver_rss_gb": {"before": round(driver_before, 3), "after": round(process_rss_gb(), 3)}}
    (out_dir / MEMORY_FILE).write_text(json.dumps(record, indent=2))
    if rc == 2:
        raise ConfigError(_failure_line(tail))
    if rc < 0:
        name = signal.Signals(-rc).name
        raise TrainingCrashed(f"the trainer process was killed by {name} after {mem.peak_at_s:.0f} s at "
                              f"{record['peak_rss_gb']:.1f} GB peak (SIGKILL: the kernel's OOM killer, most likely); "
                              f"its output: {log_path}")
    if rc != 0:
        raise TrainingCrashed(f"the trainer process exited with code {rc}: {_failure_line(tail)} (its output: {log_path})")
    return Trained(metrics=out_dir / "metrics.jsonl", memory=record)
