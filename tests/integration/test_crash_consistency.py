"""kill -9 at every phase of a step, then the same command again: no metrics line lost or duplicated,
and the final log has the numbers of an uninterrupted run (colocated and Ray paths, tiny model, CPU).

The kills come from the test-only hook `RLBENCH_FAULT_AT=<phase>:<step>` (`trainer/components/faults.py`):
the trainer process sends itself SIGKILL at that point, so nothing (atexit, finally, Ray's own
shutdown) runs. One out_dir takes a chain of kills, each at a later point than the last resume
could have reached, then a clean run finishes it; after every kill the log must be a prefix of
0..total_steps with no step twice. On the Ray path the driver is also killed while the workers
generate, and no process of its Ray session may be left a few seconds later (`ray_guard.py`).
Colocated: 9 short processes (~17 s each on 2 loaded cores); Ray: 3 in the default tier (the driver killed while
its workers generate), the whole chain of 6 in the slow tier (each starts a 2-worker cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.components.faults import FAULT_ENV
from trainer.components.metrics import read_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "trainer/configs/grpo_tiny_arithmetic.yaml")
COMMON = ["trainer.progress=false", "trainer.total_steps=4", "trainer.test_freq=2", "data.num_val_samples=4",
          # two optimizer steps per step (AdamW state matters) and steps large enough that the weights move
          "actor.ppo_mini_batch_size=2", "actor.lr=0.01", "actor.entropy_coeff=0.1"]
RAY = ["trainer.use_ray=true", "trainer.n_gpus_per_node=2"]


def _run(out: Path, *overrides: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env.setdefault("OMP_NUM_THREADS", "1")
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run([sys.executable, "-m", "trainer", CONFIG, f"trainer.out_dir={out}", *COMMON, *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def _steps(out: Path) -> list[int]:
    log = out / "metrics.jsonl"
    return [ln["step"] for ln in read_metrics(log)] if log.exists() else []


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


def _assert_same_numbers(full: list[dict], got: list[dict]) -> None:
    assert [ln["step"] for ln in got] == [ln["step"] for ln in full] == [0, 1, 2, 3, 4]
    assert full[-1]["data"]["actor/grad_norm"] > 0  # the policy moved: equal numbers mean something
    for a, b in zip(full, got):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys(), a["step"]
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)


def _kill_chain(out: Path, faults: list[str], extra: tuple[str, ...], after_kill=None) -> list[str]:
    """Run with each fault in turn (each must kill the run), checking the log after every kill."""
    seen = []
    for fault in faults:
        proc = _run(out, *extra, fault=fault)
        assert proc.returncode == -9, (fault, proc.returncode, proc.stderr[-3000:])
        steps = _steps(out)
        assert steps == list(range(len(steps))), (fault, steps)  # a prefix of 0..N, nothing twice
        seen.append(f"{fault}: log {steps}")
        if after_kill is not None:
            after_kill(fault)
    return seen


def test_colocated_kill_at_every_phase_loses_and_duplicates_nothing(tmp_path: Path):
    save = ("trainer.save_freq=1",)
    full = _run(tmp_path / "full", *save)
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "killed"
    # each kill is later than what the previous resume can reach: the runs resume from 0, 0, 0, 0, 1, 1
    faults = ["rollout:1", "checkpoint:1", "line:1", "commit:1", "update:2", "line:4"]
    _kill_chain(out, faults, save)
    assert (out / "checkpoints" / "step_000003").is_dir()  # line:4 left step 4's line, not its checkpoint
    assert _steps(out) == [0, 1, 2, 3, 4]
    last = _run(out, *save)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "resuming from checkpoint" in last.stderr and "step_000003" in last.stderr and "(step 3 of 4" in last.stderr
    _assert_same_numbers(read_metrics(tmp_path / "full" / "metrics.jsonl"), read_metrics(out / "metrics.jsonl"))
    again = _run(out, *save)  # a finished run says so and how to start over
    assert again.returncode == 0
    assert "already complete at 4/4" in again.stderr and "trainer.resume=false" in again.stderr
    assert _steps(out) == [0, 1, 2, 3, 4]


def _ray_session(out: Path) -> str:
    return json.loads((out / "ray_session.json").read_text())["session_dir"]


def _no_leftovers(session: str, within_s: float = 20.0) -> list[int]:
    from trainer.distributed.ray_guard import session_processes

    deadline = time.monotonic() + within_s
    while (left := session_processes(session)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _ray_kills(tmp_path: Path, faults: list[str], resumes_at: int) -> None:
    pytest.importorskip("ray")
    save = (*RAY, "trainer.save_freq=2")
    full = _run(tmp_path / "full", *save)
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "killed"

    def check_processes(fault: str) -> None:
        left = _no_leftovers(_ray_session(out))
        assert not left, f"{fault}: Ray processes left: {left}"

    _kill_chain(out, faults, save, after_kill=check_processes)
    last = _run(out, *save)
    assert last.returncode == 0, last.stderr[-3000:]
    if resumes_at:
        assert "resuming from checkpoint" in last.stderr and f"(step {resumes_at} of 4" in last.stderr
    _assert_same_numbers(read_metrics(tmp_path / "full" / "metrics.jsonl"), read_metrics(out / "metrics.jsonl"))


def test_ray_driver_killed_while_workers_generate_leaves_no_process(tmp_path: Path):
    """The Ray-specific half of the chain below (3 runs, not 6): the driver dies while its workers
    generate, no process of its session is left, and the run started again logs the uninterrupted numbers."""
    _ray_kills(tmp_path, ["rollout:2"], resumes_at=0)


@pytest.mark.slow
def test_ray_kill_at_every_phase_loses_nothing_and_leaves_no_process(tmp_path: Path):
    # checkpoints at 2 and 4; resumes from 0, 0, 2, 2
    _ray_kills(tmp_path, ["rollout:2", "line:2", "update:3", "checkpoint:4"], resumes_at=2)
