"""A run whose vLLM engine dies mid-run (its engine-core process SIGKILLed) stops with one line and
keeps what it wrote: colocated in the trainer's process, colocated on Ray (a trainer worker's
engine) and fully-async on Ray (the rollout worker's engine). Then `rlbench check` still renders
the report from the steps written.

    python -m pytest -m vllm tests/engines/test_vllm_engine_dies_in_a_run.py -q

Tiny random Llama (head_dim 64 for vLLM's CPU attention), fp32, `python -m trainer` in a process of
its own; each run ~1-2 min on 2 cores, most of it vLLM's start-up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]

GRPO, DAPO = "verl_grpo_qwen3_8b_sglang_gfx950", "verl_dapo_qwen25_math_7b_fully_async_gfx942"
CASES = {  # case -> (overrides, the error line's start, suite and mode the report is checked against)
    "colocated": ([], "error: rollout.engine=vllm: the vLLM engine failed", GRPO, "colocated"),
    "colocated_ray": (["trainer.use_ray=true"], "error: a trainer worker's engine died at step", GRPO, "colocated"),
    "fully_async": (["trainer.mode=fully_async", "async.trigger_parameter_sync_step=1"],
                    "error: rollout worker's engine died at trainer step", DAPO, "fully_async"),
}


def _engine_cores(pid: int) -> list:
    import psutil

    procs = psutil.Process(pid).children(recursive=True)
    out = []
    for p in procs:
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


# fully-async (the rollout worker on Ray) in the default tier; the two colocated layouts in the slow tier
@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c != "fully_async" else [])
                                  for c in CASES])
def test_engine_killed_mid_run_stops_in_one_line_and_keeps_the_report(tmp_path: Path, case: str):
    pytest.importorskip("vllm")
    overrides, starts, suite, check_mode = CASES[case]
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainer", "trainer/configs/grpo_tiny_arithmetic.yaml", f"trainer.out_dir={out}",
           "model.path=tiny:llama", "model.override_config={head_dim: 64}", "rollout.engine=vllm",
           "rollout.gpu_memory_utilization=0.08", "trainer.total_steps=60", "trainer.test_freq=0",
           "trainer.save_freq=0", "trainer.progress=false", *overrides]
    log = tmp_path / "stderr.txt"  # a file, not a pipe: the run's (Ray's) output would fill a pipe and block it
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = out / "metrics.jsonl"
    killed = []
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            cores = _engine_cores(proc.pid)
            if cores:
                for c in cores:
                    os.kill(c.pid, signal.SIGKILL)
                killed = [c.pid for c in cores]
                break
        time.sleep(0.2)
    try:
        proc.wait(timeout=300)
    finally:
        proc.kill()
    stderr = log.read_text()
    assert killed, f"no vLLM engine-core process found under the run (rc={proc.returncode}):\n{stderr[-3000:]}"
    # one line naming what died and the fix; exit 2 as every RLBenchError from `python -m trainer`
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, stderr[-3000:])
    msg = errors[0]
    assert msg.startswith(starts) and "the vLLM engine failed" in msg and "fix:" in msg, msg
    assert "steps completed so far are kept" in msg, msg
    if case != "colocated":  # the Ray paths name the step and where its predecessors' metrics are
        assert str(metrics) in msg, msg
    # the steps written before the kill are kept, in order, none twice
    steps = [r["step"] for r in read_metrics(metrics) if r["step"] > 0]
    assert len(steps) >= 2 and steps == list(range(1, len(steps) + 1))
    if case != "colocated":
        failure = json.loads((out / "failure.json").read_text())
        assert failure["completed_steps"] >= len(steps) and "engine died" in failure["error"]
    # the report renders from what was written (the checks see a short log; it says so)
    report = tmp_path / "check"
    rc = subprocess.run([sys.executable, "-m", "rlbench", "check", str(metrics), "--suite", suite, "--profile", "cpu",
                         "--arch", "cpu", "--mode", check_mode, "--out", str(report)], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)
    assert rc.returncode in (0, 1), rc.stderr[-2000:]
    assert (report / "report.html").stat().st_size > 0
    doc = json.loads((report / "checks.json").read_text())
    assert f"log has steps 1-{steps[-1]}" in doc["provenance"]["log_coverage"][check_mode]
