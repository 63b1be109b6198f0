"""Time ingest + checks + report on a 10,000-step x 50-metric log (target: each part well under 2 s).

    OMP_NUM_THREADS=1 python3 tests/benchmarks/bench_report.py            # median of 5 runs per part
    OMP_NUM_THREADS=1 python3 -m pytest tests/benchmarks/bench_report.py --benchmark-enable -q

The log is a verl JSONL file-logger file (values with full float precision, as verl writes
them) for two runs (colocated, fully_async). Checks run through `rlbench.checks.metric` when that
module is present; otherwise that part is reported as skipped.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from rlbench.checks.results import CheckResult
from rlbench.ingest.load import load_metrics
from rlbench.report.html import render_report

NUM_STEPS = 10_000
NUM_METRICS = 50
TIMINGS = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref",
           "timing_s/update_actor", "timing_s/update_weights")
NAMED = ("val-core/openai/gsm8k/acc/mean@1", "actor/ppo_kl", "critic/score/mean", "perf/throughput",
         "response_length/mean", "actor/pg_clipfrac", "actor/entropy", "actor/grad_norm", *TIMINGS)


def write_log(path: Path, *, seed: int, step_scale: float) -> Path:
    """A verl JSONL log: NUM_STEPS steps x NUM_METRICS metrics, each step split over two lines."""
    rng = np.random.default_rng(seed)
    names = list(NAMED) + [f"extra/metric_{i}" for i in range(NUM_METRICS - len(NAMED))]
    t = np.arange(NUM_STEPS) / NUM_STEPS
    cols = {name: rng.random(NUM_STEPS) for name in names}
    cols["val-core/openai/gsm8k/acc/mean@1"] = 0.82 + 0.13 * (1 - np.exp(-8 * t)) + rng.normal(0, 0.005, NUM_STEPS)
    cols["actor/ppo_kl"] = 1e-4 + rng.normal(0, 2e-5, NUM_STEPS)
    for name, mean in zip(TIMINGS, (200.0, 100.0, 20.0, 10.0, 60.0, 5.0)):
        cols[name] = mean * step_scale + rng.normal(0, 1, NUM_STEPS)
    half = NUM_METRICS // 2
    with path.open("w") as f:
        for i in range(NUM_STEPS):
            row = {name: float(cols[name][i]) for name in names}
            items = list(row.items())
            f.write(json.dumps({"step": i + 1, "data": dict(items[:half])}) + "\n")
            f.write(json.dumps({"step": i + 1, "data": dict(items[half:])}) + "\n")
    return path


def evaluate_checks(runs: dict[str, pd.DataFrame]) -> list[CheckResult] | None:
    """A set of checks like a suite's, through rlbench.checks.metric; None when that module is missing."""
    try:
        from rlbench.checks.metric import check_metric
        from rlbench.suites.suite import Reference
    except ImportError:
        return None
    src, why = "000_af77aeb111e0721a.txt: Figure 1", "benchmark"
    refs = [
        Reference(metric="val-core/openai/gsm8k/acc/mean@1", stat="peak", op=">=", value=0.93, tol=0.03,
                  source=src, why=why),
        Reference(metric="val-core/openai/gsm8k/acc/mean@1", stat="mean_last", n=20, op=">=", value=0.9,
                  tol=0.03, source=src, why=why),
        Reference(metric="actor/ppo_kl", stat="mean", op="<=", value=1e-3, source=src, why=why),
        Reference(metric="actor/ppo_kl", op="band", lo=-1e-3, hi=1e-3, source=src, why=why),
        Reference(metric="critic/score/mean", stat="slope", op=">=", value=-1.0, source=src, why=why),
        Reference(metric="timing_s/step", stat="median", window=(1, 64), op="approx", value=200.0, tol=50.0,
                  source=src, why=why),
        Reference(metric="perf/throughput", stat="median", op=">=", value=0.1, source=src, why=why),
    ]
    return [check_metric(ref, frame, tol=ref.tol, run=mode) for mode, frame in runs.items() for ref in refs]


def _median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(repeats: int = 5) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        paths = {mode: write_log(tmpdir / f"{mode}.jsonl", seed=i, step_scale=s)
                 for i, (mode, s) in enumerate((("colocated", 1.8), ("fully_async", 1.0)))}
        size_mb = paths["colocated"].stat().st_size / 1e6
        t_ingest, _ = _median_time(lambda: load_metrics(paths["colocated"]), repeats)
        runs = {mode: load_metrics(p).frame for mode, p in paths.items()}
        t_checks, results = _median_time(lambda: evaluate_checks(runs), repeats)
        checks = results if isinstance(results, list) else []
        out = tmpdir / "report.html"
        env = {"arch": "cpu", "device": "benchmark", "torch": "n/a"}
        t_report, _ = _median_time(
            lambda: render_report(out, title="benchmark", runs=runs, results=checks, env=env), repeats)
        report_mb = out.stat().st_size / 1e6
    print(f"log: {NUM_STEPS} steps x {NUM_METRICS} metrics, {size_mb:.1f} MB JSONL per run; median of {repeats}")
    print(f"ingest (one run)    : {t_ingest:.3f} s")
    if results is None:
        print("checks              : skipped (rlbench.checks.metric not available)")
    else:
        print(f"checks ({len(checks)} results): {t_checks:.3f} s")
    print(f"report (two runs)   : {t_report:.3f} s, {report_mb:.1f} MB HTML")
    return {"ingest_s": t_ingest, "checks_s": t_checks, "report_s": t_report}


# ------------------------------------------------------------------ pytest-benchmark entry points


def _fixture_runs(tmp_path: Path) -> tuple[dict[str, Path], dict[str, pd.DataFrame]]:
    paths = {"colocated": write_log(tmp_path / "c.jsonl", seed=0, step_scale=1.8),
             "fully_async": write_log(tmp_path / "a.jsonl", seed=1, step_scale=1.0)}
    return paths, {m: load_metrics(p).frame for m, p in paths.items()}


def test_bench_ingest(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    paths, _ = _fixture_runs(tmp_path)
    log = benchmark(load_metrics, paths["colocated"])
    assert log.frame.shape == (NUM_STEPS, NUM_METRICS)


def test_bench_checks(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, runs = _fixture_runs(tmp_path)
    results = benchmark(evaluate_checks, runs)
    if results is None:
        import pytest

        pytest.skip("rlbench.checks.metric not available")
    assert len(results) == 14 and all(r.verdict in ("pass", "fail") for r in results)


def test_bench_report(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, runs = _fixture_runs(tmp_path)
    results = evaluate_checks(runs) or []
    out = benchmark(render_report, tmp_path / "r.html", title="bench", runs=runs, results=results, env={})
    assert out.stat().st_size < 8_000_000  # plotly.js (~4.8 MB) + downsampled curves


if __name__ == "__main__":
    main()
