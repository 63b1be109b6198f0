"""End to end on 2 CPU cores (minutes): `rlbench run` and `pytest suites/` train a real cpu profile.

    OMP_NUM_THREADS=1 python3 -m pytest tests/integration/test_cli_run.py -m "slow or integration" -q

The runs are cut to 2 training steps (`--set` / `--rlbench-set trainer.total_steps=2`): these
tests prove the wiring (trainer -> metrics.jsonl -> checks -> run folder and pytest items), not
learning, so the learning check (`critic/score/mean delta`) may fail and is not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_rlbench_run_cpu_profile_writes_run_folder(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "rlbench", "run", SUITE, "--profile", "cpu", "--arch", "cpu",
                          "--out", str(tmp_path), "--set", "trainer.total_steps=2"],
                         check=False, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    folder = tmp_path / SUITE / "cpu"
    for name in ("config.colocated.yaml", "env.json", "checks.json", "report.html", "colocated/metrics.jsonl"):
        assert (folder / name).is_file(), name
    steps = [json.loads(x)["step"] for x in (folder / "colocated" / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2
    doc = json.loads((folder / "checks.json").read_text())
    mine = {r["check_id"]: r["verdict"] for r in doc["results"]}
    assert mine["actor/pg_loss:no_nan"] == "pass"
    assert mine["response_length/mean:each in [1,24]"] == "pass"
    assert "error" not in mine.values()
    assert "training 2 steps" in res.stderr and "evaluating checks" in res.stderr


def test_pytest_suites_cpu_one_suite(tmp_path: Path) -> None:
    report = tmp_path / "session.html"
    res = subprocess.run([sys.executable, "-m", "pytest", "suites/", "--arch", "cpu", "--profile", "cpu",
                          "-k", SUITE, "--rlbench-set", "trainer.total_steps=2", "--rlbench-out", str(tmp_path),
                          "--rlbench-report", str(report), "-p", "no:cacheprovider", "-q", "-rs"],
                         check=False, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
    out = res.stdout
    summary = out.strip().splitlines()[-1]
    assert res.returncode in (0, 1) and " passed" in summary and "error" not in summary, out[-3000:]
    assert f"[rlbench] {SUITE} [cpu] colocated seed 0: training 2 steps" in out  # status line reaches the terminal
    assert (tmp_path / SUITE / "cpu" / "checks.json").is_file()  # one run, shared by the items
    assert len(list((tmp_path / SUITE / "cpu").glob("colocated/metrics.jsonl"))) == 1
    assert report.is_file() and "Plotly.newPlot" in report.read_text()
