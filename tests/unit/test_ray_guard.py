"""`trainer/distributed/ray_guard.py` without Ray: processes of a recorded session are found by the session
folder in their command line or open files, and ended when the recorded driver is dead (never when it lives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainer.distributed.ray_guard import RECORD, clear_leftovers, session_processes


def _sleeper(tmp: Path, session: Path) -> subprocess.Popen:
    """A stand-in for a Ray agent: its argv does not name the session, one of its open files does."""
    code = f"import time; f = open({str(session / 'logs' / 'agent.out')!r}, 'a'); time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while proc.pid not in session_processes(str(session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_leftovers_of_a_dead_driver_are_ended(tmp_path: Path, capsys):
    session = tmp_path / "session_x"
    (session / "logs").mkdir(parents=True)
    proc = _sleeper(tmp_path, session)
    assert proc.pid in session_processes(str(session))
    (tmp_path / RECORD).write_text(json.dumps({"driver_pid": _dead_pid(), "driver_start": None,
                                               "session_dir": str(session)}))
    assert clear_leftovers(tmp_path) == 1
    assert proc.wait(timeout=10) != 0  # ended by a signal
    assert "ended 1 Ray process(es) left by a killed earlier run" in capsys.readouterr().err
    assert not (tmp_path / RECORD).exists()


def test_a_live_driver_keeps_its_processes(tmp_path: Path):
    session = tmp_path / "session_y"
    (session / "logs").mkdir(parents=True)
    proc = _sleeper(tmp_path, session)
    try:
        driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (tmp_path / RECORD).write_text(json.dumps({"driver_pid": driver.pid, "driver_start": None,
                                                   "session_dir": str(session)}))
        assert clear_leftovers(tmp_path) == 0 and proc.poll() is None
    finally:
        for p in (proc, driver):
            p.kill()
            p.wait()


def test_no_record_is_nothing_to_do(tmp_path: Path):
    assert clear_leftovers(tmp_path) == 0
    assert os.getpid() not in session_processes(str(tmp_path))
