"""Checks say what they saw: a metric, window, start or end the log lacks is `not_evaluated` (never a
pass), partial logs are named in every result, and only verdicts more steps cannot change stand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlbench.checks.coverage import Coverage, with_coverage
from rlbench.checks.evaluate import evaluate
from rlbench.checks.results import CheckResult
from tests.unit.test_checks import toy_suite

SRC = "000_af77aeb111e0721a.txt: s"


def _run(first: int, last: int, **cols) -> pd.DataFrame:
    steps = pd.Index(range(first, last + 1), name="step")
    return pd.DataFrame({k: f(np.asarray(steps, dtype=float)) for k, f in cols.items()}, index=steps)


def _one(refs: list[dict], run: pd.DataFrame, steps: int = 200) -> dict[str, CheckResult]:
    s = toy_suite(refs, modes={"colocated": {"gpus": 8}}, steps=steps)
    return {r.check_id: r for r in evaluate(s, "full", {"colocated": run}, arch="gfx950", device_name="MI350X")}


RISING = {"critic/score/mean": lambda t: 0.2 + 0.003 * t}  # 0.2 at step 0, 0.44 at step 80, 0.8 at 200


def test_first_checks_on_a_log_starting_at_step_80_are_not_evaluated() -> None:
    refs = [{"id": "first", "metric": "critic/score/mean", "stat": "first", "op": ">=", "value": 0.4, "tol": 0.0},
            {"id": "mfirst", "metric": "critic/score/mean", "stat": "mean_first", "n": 4, "op": "approx",
             "value": 0.45, "tol": 0.05},
            {"id": "final", "metric": "critic/score/mean", "stat": "final", "op": ">=", "value": 0.7}]
    late = _one(refs, _run(80, 200, **RISING))
    # step 80's value (0.44) would pass both against a step-0 reference: it must not
    assert late["first"].verdict == "not_evaluated" and late["mfirst"].verdict == "not_evaluated"
    assert "first needs the run's start; the log starts at step 80, after step 1" in late["first"].message
    assert late["final"].verdict == "pass"  # the end of the run is in the log
    assert all(r.coverage == "log has steps 80-200 of the profile's 0/1-200 (starts late)" for r in late.values())
    full = _one(refs, _run(0, 200, **RISING))
    assert full["first"].verdict == "fail" and full["mfirst"].verdict == "fail"  # 0.2 at step 0
    assert all(r.coverage == "" for r in full.values())


def test_a_log_that_ends_early_keeps_only_conclusive_verdicts() -> None:
    refs = [{"id": "final", "metric": "critic/score/mean", "stat": "final", "op": ">=", "value": 0.3},
            {"id": "peak_hit", "metric": "critic/score/mean", "stat": "peak", "op": ">=", "value": 0.4},
            {"id": "peak_miss", "metric": "critic/score/mean", "stat": "peak", "op": ">=", "value": 0.7},
            {"id": "max_over", "metric": "critic/score/mean", "stat": "max", "op": "<=", "value": 0.3},
            {"id": "max_under", "metric": "critic/score/mean", "stat": "max", "op": "<=", "value": 0.9},
            {"id": "band_out", "metric": "critic/score/mean", "op": "band", "lo": 0.0, "hi": 0.3},
            {"id": "reach_hit", "metric": "critic/score/mean", "stat": "steps_to_reach", "threshold": 0.4,
             "op": "<=", "value": 100},
            {"id": "reach_miss", "metric": "critic/score/mean", "stat": "steps_to_reach", "threshold": 0.7,
             "op": "<=", "value": 190}]
    res = _one(refs, _run(0, 100, **RISING))  # 0.2 -> 0.5 by step 100 of 200
    got = {k: r.verdict for k, r in res.items()}
    assert got == {"final": "not_evaluated", "peak_hit": "pass", "peak_miss": "not_evaluated",
                   "max_over": "fail", "max_under": "not_evaluated", "band_out": "fail",
                   "reach_hit": "pass", "reach_miss": "not_evaluated"}
    assert "final needs the run's end; the log ends at step 100, before step 200" in res["final"].message
    assert res["final"].coverage == "log has steps 0-100 of the profile's 0/1-200 (ends early)"


def test_window_missing_from_the_log_is_not_evaluated() -> None:
    refs = [{"id": "late_window", "metric": "critic/score/mean", "stat": "median", "window": [150, 180],
             "op": ">=", "value": 0.1}]
    res = _one(refs, _run(0, 100, **RISING), steps=100)
    assert res["late_window"].verdict == "not_evaluated"
    assert "critic/score/mean has no value in steps 150-180 (logged at steps 0-100)" in res["late_window"].message
    res = _one(refs, _run(0, 200, **RISING), steps=200)
    assert res["late_window"].verdict == "pass"


def test_missing_metric_is_not_evaluated_with_the_reward_hint() -> None:
    refs = [{"id": "acc", "metric": "val-core/x/acc/mean@4", "stat": "peak", "op": ">=", "value": 0.5}]
    run = _run(0, 10, **{"val-core/x/reward/mean@4": lambda t: 0.1 * t})
    (r,) = _one(refs, run, steps=10).values()
    assert r.verdict == "not_evaluated"
    assert "it has val-core/x/reward/mean@4, the mean validation reward" in r.message
    assert "pass --reward-is-accuracy" in r.message


def test_ratio_with_one_partial_run_is_not_evaluated() -> None:
    s = toy_suite([{"kind": "ratio", "metric": "timing_s/step", "stat": "median", "num": "colocated",
                    "den": "fully_async", "op": ">=", "value": 1.5}], steps=100)
    fast, slow = _run(1, 100, **{"timing_s/step": lambda t: 0 * t + 100.0}), _run(1, 40, **{"timing_s/step": lambda t: 0 * t + 50.0})
    (r,) = evaluate(s, "full", {"colocated": fast, "fully_async": slow}, arch="gfx950", device_name="MI350X")
    assert r.verdict == "not_evaluated" and "fully_async run: median needs the run's steps" in r.message
    (r,) = evaluate(s, "full", {"colocated": fast, "fully_async": _run(1, 100, **{"timing_s/step": lambda t: 0 * t + 50.0})},
                    arch="gfx950", device_name="MI350X")
    assert r.verdict == "pass"


def test_golden_start_statistics_on_a_late_log_are_not_evaluated() -> None:
    golden = [CheckResult("golden:score.mean_first", "pass", "critic/score/mean", "mean_first[4]", "", 0.3, "g", "w",
                          [80, 81, 82, 83], "golden:score.mean_first: PASS", "golden", "colocated"),
              CheckResult("golden:score.mean_last", "pass", "critic/score/mean", "mean_last[4]", "", 0.8, "g", "w",
                          [197, 198, 199, 200], "golden:score.mean_last: PASS", "golden", "colocated")]
    covs = {"colocated": Coverage(80, 200, 200)}
    first, last = with_coverage(golden, covs)
    assert first.verdict == "not_evaluated" and "mean_first needs the run's start" in first.message
    assert last.verdict == "pass" and last.coverage.endswith("(starts late)")
    assert [r.verdict for r in with_coverage(golden, {"colocated": Coverage(0, 200, 200)})] == ["pass", "pass"]


@pytest.mark.parametrize("first,last,note", [(1, 8, ""), (0, 8, ""), (2, 8, "starts late"), (0, 5, "ends early"),
                                             (3, 5, "starts late and ends early")])
def test_coverage_note(first: int, last: int, note: str) -> None:
    text = Coverage(first, last, 8).note()
    assert text.endswith(f"({note})") if note else text == ""


def test_a_run_meant_to_be_short_is_checked_against_its_own_length() -> None:
    """`steps=N`: the first N steps of a profile, trained on purpose (e.g. `rlbench selftest --steps`)."""
    refs = [{"id": "band", "metric": "critic/score/mean", "op": "band", "lo": 0.0, "hi": 1.0},
            {"id": "final", "metric": "critic/score/mean", "stat": "final", "op": ">=", "value": 0.2}]
    s = toy_suite(refs, modes={"colocated": {"gpus": 8}}, steps=200)
    run = {"colocated": _run(0, 2, **RISING)}
    as_profile = {r.check_id: r.verdict for r in evaluate(s, "full", run, arch="gfx950", device_name="MI350X")}
    assert as_profile == {"band": "not_evaluated", "final": "not_evaluated"}  # 2 of 200 steps
    short = {r.check_id: r for r in evaluate(s, "full", run, arch="gfx950", device_name="MI350X", steps=2)}
    assert {k: r.verdict for k, r in short.items()} == {"band": "pass", "final": "pass"}
    assert all(r.coverage == "" for r in short.values())


def test_first_of_a_metric_logged_only_later_is_not_evaluated() -> None:
    """No validation before training: the first validation value is at step 5, not the step-0 one."""
    refs = [{"id": "first", "metric": "acc", "stat": "first", "op": "approx", "value": 0.8, "tol": 0.05},
            {"id": "peak", "metric": "acc", "stat": "peak", "op": ">=", "value": 0.5}]
    steps = pd.Index(range(1, 21), name="step")
    run = pd.DataFrame({"loss": 1.0, "acc": [0.82 if t % 5 == 0 else np.nan for t in steps]}, index=steps)
    res = _one(refs, run, steps=20)
    assert res["first"].verdict == "not_evaluated"
    assert "first reads the run's start; acc is first logged at step 5, the run starts at step 1" in res["first"].message
    assert res["peak"].verdict == "pass"
    run.loc[1, "acc"] = 0.82  # validated at the first step
    assert _one(refs, run, steps=20)["first"].verdict == "pass"


def test_a_window_past_the_log_end_is_not_evaluated() -> None:
    """A `[190, 250]` window on a 200-step log of a 200-step profile: not a verdict on steps 190-200 alone."""
    refs = [{"id": "mean", "metric": "critic/score/mean", "stat": "mean", "window": [190, 250], "op": ">=",
             "value": 0.5},
            {"id": "inside", "metric": "critic/score/mean", "stat": "mean", "window": [150, 200], "op": ">=",
             "value": 0.5},
            {"id": "peak", "metric": "critic/score/mean", "stat": "peak", "window": [190, 250], "op": ">=",
             "value": 0.7}]
    res = _one(refs, _run(0, 200, **RISING), steps=200)
    assert res["mean"].verdict == "not_evaluated"
    assert res["mean"].message.endswith(
        "(mean needs steps 190-250; the log ends at step 200, before step 250; the window ends past the "
        "profile's 200 steps: fix the window)")
    assert res["inside"].verdict == "pass"  # a window the log holds is evaluated as before
    assert res["peak"].verdict == "pass"  # already reached: steps 201-250 could not undo it


def _nan_log(tmp: Path, nan_at: range, nan: str = "NaN") -> pd.DataFrame:
    """A 200-step JSONL log, `actor/ppo_kl` logged as `nan` (JSON NaN, or the trainer's "nan") at `nan_at`."""
    from rlbench.ingest.load import load_metrics

    lines = []
    for t in range(201):
        kl = nan if t in nan_at else "0.0001"
        lines.append(f'{{"step": {t}, "data": {{"critic/score/mean": {0.2 + 0.003 * t}, "actor/ppo_kl": {kl}}}}}')
    (tmp / "nan.jsonl").write_text("\n".join(lines) + "\n")
    return load_metrics(tmp / "nan.jsonl").frame


@pytest.mark.parametrize("nan", ["NaN", '"nan"'])
def test_nan_the_log_gave_inside_a_window_is_counted_not_skipped(tmp_path: Path, nan: str) -> None:
    """NaN at steps 50-59: a statistic that reads them is unknown (not evaluated, with the count); a verdict
    no value there could change stands; `no_nan` fails; statistics that do not read them are unchanged."""
    refs = [{"id": "max", "metric": "actor/ppo_kl", "stat": "max", "window": [1, 200], "op": "<=", "value": 0.01},
            {"id": "mean", "metric": "actor/ppo_kl", "stat": "mean", "op": "<=", "value": 0.01},
            {"id": "band", "metric": "actor/ppo_kl", "op": "band", "lo": 0.0, "hi": 0.01},
            {"id": "peak", "metric": "actor/ppo_kl", "stat": "peak", "op": ">=", "value": 1e-5},
            {"id": "final", "metric": "actor/ppo_kl", "stat": "final", "op": "<=", "value": 0.01},
            {"id": "late", "metric": "actor/ppo_kl", "stat": "max", "window": [100, 200], "op": "<=", "value": 0.01},
            {"id": "nonan", "metric": "actor/ppo_kl", "stat": "no_nan"}]
    frame = _nan_log(tmp_path, range(50, 60), nan)
    res = _one(refs, frame, steps=200)
    for cid in ("max", "mean", "band"):
        assert res[cid].verdict == "not_evaluated", res[cid].message
    assert ("actor/ppo_kl was logged as NaN at 10 steps in steps 1-200 (50-59): its max there is unknown"
            in res["max"].message)
    assert "NaN at 10 steps of the log (50-59): its value there is unknown" in res["band"].message
    assert res["peak"].verdict == "pass"  # reached already: no value at 50-59 could lower a peak
    assert "(logged as NaN at 10 steps, 50-59, which could not change it): PASS" in res["peak"].message
    assert res["final"].verdict == "pass" and res["late"].verdict == "pass"  # they do not read steps 50-59
    assert res["nonan"].verdict == "fail"
    at_end = _one(refs, _nan_log(tmp_path, range(200, 201), nan), steps=200)
    assert at_end["final"].verdict == "not_evaluated"  # the last step logged NaN: its value, not step 199's
    clean = _one(refs, _nan_log(tmp_path, range(0)), steps=200)
    assert {r.verdict for r in clean.values()} == {"pass"}
