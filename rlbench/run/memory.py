"""Resident memory of a training run, summed over its process tree, and the machine's memory.

    from rlbench.run.memory import TreeMemory, machine_memory_gb
    with TreeMemory(child_pid) as mem:      # samples the child and every descendant (Ray's GCS,
        child.wait()                        # raylet and workers, engine processes) twice a second
    mem.record()                            # {"peak_rss_gb": 12.9, "peak_by_process": {...}, ...}

What a run's memory is, for the budget a profile states (`requires.memory_gb` in a suite) and the
machine it must fit: the peak over time of the *sum* of the resident set sizes of the run's
processes. A sum of RSS counts pages that two processes share (the torch libraries, a forked
worker's copy-on-write pages) once per process, so it is an upper bound of what the run takes from
the machine; that is the side to err on for a budget. Sampling every 0.5 s can miss a peak shorter
than that; the number is a measured lower bound of the true peak of the sum, and a budget leaves
headroom for both.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import psutil

GB = float(2**30)


def machine_memory_gb() -> dict[str, float]:
    """This machine's memory: total and available now (GiB), as the kernel reports them."""
    vm = psutil.virtual_memory()
    return {"total_gb": round(vm.total / GB, 2), "available_gb": round(vm.available / GB, 2)}


def process_rss_gb(pid: int | None = None) -> float:
    """Resident set size of one process (default: this one), GiB."""
    return psutil.Process(pid).memory_info().rss / GB


def _kind(proc: psutil.Process) -> str:
    """A short name for a process of the tree: Ray names its workers `ray::<Actor>.<method>`."""
    try:
        name = proc.name()
        if name.startswith("ray::"):
            return name.split(".")[0]
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if len(cmd) > 2 and cmd[1] == "-m":
        return f"python -m {cmd[2]}"
    return name


class TreeMemory:
    """A thread that samples the RSS of `pid` and all its descendants every `every_s` seconds."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.peak_gb = 0.0
        self.peak_at_s = 0.0
        self.peak_by_kind: dict[str, float] = {}  # at the moment of the peak of the sum
        self.max_processes = 0
        self.samples = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlbench-memory", daemon=True)

    def __enter__(self) -> TreeMemory:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return  # the root has exited
        by_kind: dict[str, float] = defaultdict(float)
        for p in procs:
            try:
                by_kind[_kind(p)] += p.memory_info().rss / GB
            except psutil.Error:
                continue  # exited between the listing and the read
        total = sum(by_kind.values())
        self.samples += 1
        self.max_processes = max(self.max_processes, len(procs))
        if total > self.peak_gb:
            self.peak_gb, self.peak_at_s = total, time.monotonic() - self._t0
            self.peak_by_kind = dict(by_kind)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def record(self) -> dict[str, Any]:
        top = sorted(self.peak_by_kind.items(), key=lambda kv: -kv[1])
        return {"peak_rss_gb": round(self.peak_gb, 3), "peak_at_s": round(self.peak_at_s, 1),
                "peak_by_process": {k: round(v, 3) for k, v in top},
                "max_processes": self.max_processes, "samples": self.samples, "every_s": self.every_s,
                "measure": "peak over time of the sum of RSS over the run's process tree (psutil)"}
