"""A suite run trains in a process of its own: the caller keeps no memory of it, its peak is measured,
and its failures keep the trainer's meaning (rlbench/run/isolated.py, rlbench/run/memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbench.run.isolated import MEMORY_FILE, TrainingCrashed, require_free_memory, train_isolated
from rlbench.run.memory import TreeMemory, machine_memory_gb, process_rss_gb
from tests.helpers.configs import tiny_config
from trainer.config import load_config
from trainer.errors import ConfigError

pytestmark = pytest.mark.integration


def test_a_run_in_its_own_process_writes_its_log_and_leaves_the_caller_as_it_was(tmp_path: Path) -> None:
    cfg = load_config(tiny_config(str(tmp_path / "run"), trainer={"total_steps": 2, "test_freq": 0}))
    before = process_rss_gb()
    done = train_isolated(cfg)
    after = process_rss_gb()
    steps = [json.loads(x)["step"] for x in done.metrics.read_text().splitlines()]
    assert steps[-1] == 2
    rec = json.loads((tmp_path / "run" / MEMORY_FILE).read_text())
    assert rec == done.memory
    # the child imported torch and transformers and built a model: hundreds of MB that are not ours
    assert rec["peak_rss_gb"] > 0.2 and rec["samples"] >= 1
    assert next(iter(rec["peak_by_process"])) == "python -m trainer"
    assert after - before < 0.05, (before, after)
    assert rec["driver_rss_gb"]["before"] == pytest.approx(before, abs=0.01)


def test_bad_input_in_the_child_is_the_trainer_s_one_line(tmp_path: Path) -> None:
    cfg = load_config(tiny_config(str(tmp_path / "run"), data={"train_files": str(tmp_path / "missing.parquet")}))
    with pytest.raises(ConfigError) as e:
        train_isolated(cfg)
    assert "missing.parquet" in str(e.value) and "\n" not in str(e.value)


def test_a_child_killed_by_a_signal_is_named_with_its_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL, as the kernel's OOM killer sends it: the error says so (not a bare exit code)."""
    import rlbench.run.isolated as iso

    real_popen = subprocess.Popen

    def popen_then_kill(argv, **kw):
        proc = real_popen([sys.executable, "-c", "import time; time.sleep(30)"], **kw)
        time.sleep(0.5)
        os.kill(proc.pid, 9)
        return proc

    monkeypatch.setattr(iso.subprocess, "Popen", popen_then_kill)
    cfg = load_config(tiny_config(str(tmp_path / "run")))
    with pytest.raises(TrainingCrashed, match=r"killed by SIGKILL .* GB peak .*OOM killer"):
        train_isolated(cfg)


def test_the_memory_of_a_tree_is_summed_over_its_processes() -> None:
    """A parent holding ~0 MB with two children holding ~200 MB each: the peak counts all three."""
    code = ("import subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(200 * 2**20); import time; "
            "time.sleep(3)']) for _ in range(2)]\n"
            "[k.wait() for k in kids]\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    with TreeMemory(proc.pid, every_s=0.2) as mem:
        proc.wait()
    rec = mem.record()
    assert rec["max_processes"] == 3
    assert rec["peak_rss_gb"] > 0.4, rec  # 2 x 200 MB, plus the interpreters


def test_a_budget_the_machine_cannot_give_now_stops_before_the_run() -> None:
    have = machine_memory_gb()["available_gb"]
    with pytest.raises(ConfigError, match=r"^suite x \[cpu\] colocated: its budget is .* GB available now \(fix: "):
        require_free_memory(have + 100, "suite x [cpu] colocated")
    require_free_memory(None, "no budget")  # no budget stated: nothing to check
