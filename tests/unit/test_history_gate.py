"""Gates from trusted history (rlbench/checks/history.py) on a history built from the real cpu-profile log
in reports/cpu (its own step timings and accuracies): a planted 10% throughput drop and a planted 0.05
accuracy drop are caught, the clean history raises no alarm, too little history is never a pass.

The history: 12 trusted runs, each the real log with one training step left out (run k without step
k + 5), so each run's statistic is a real one and they differ as little as reruns of one machine's
run; only the planted runs are changed (throughput x 0.9 at every step; accuracy - 0.05 at every
validation step).

    pytest tests/unit/test_history_gate.py -q -s      # -s prints the gate's verdict lines
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rlbench.checks.evaluate import evaluate
from rlbench.checks.history import HistorySource
from rlbench.ingest.load import load_metrics
from rlbench.run.record import check_row
from rlbench.store.sqlite import ResultsStore, RunRecord
from rlbench.suites.suite import Suite, load_suite
from trainer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"
SUITE = ROOT / "suites/verl_grpo_qwen3_8b_sglang_gfx950.yaml"
TPUT, ACC = "perf/throughput", "val-core/synthetic/arithmetic/acc/mean@1"
HISTORY_REFS = [
    {"metric": TPUT, "stat": "median", "op": ">=", "history": {"rule": "median_rel", "last": 10, "band": 0.05},
     "profiles": ["cpu"], "source": "rlbench: this runner's trusted history", "why": "a 5% drop is a regression"},
    {"metric": "perf/time_per_step", "stat": "median", "op": "<=",
     "history": {"rule": "median_rel", "last": 10, "band": 0.05}, "profiles": ["cpu"],
     "source": "rlbench: this runner's trusted history", "why": "a 5% slower step is a regression"},
    {"metric": ACC, "stat": "mean_last", "n": 3, "op": "approx",
     "history": {"rule": "mean_floor", "last": 20, "rel": 0.02, "floor": 0.02}, "profiles": ["cpu"],
     "source": "rlbench: trusted history of this arch", "why": "Miles' band: max(2% of the mean, 0.02)"},
]


def history_suite(tmp_path: Path, refs: list[dict] | None = None) -> Suite:
    doc = yaml.safe_load(SUITE.read_text())
    doc["references"] = refs if refs is not None else HISTORY_REFS
    path = tmp_path / SUITE.name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_suite(path)


def real_frame() -> pd.DataFrame:
    return load_metrics(LOG).frame


def evaluate_and_store(suite: Suite, frame: pd.DataFrame, db: Path, *, trusted: bool, device: str = "cpu",
                       arch: str = "cpu") -> dict[str, object]:
    src = HistorySource(store=db, suite=suite.id, profile="cpu", arch=arch, device=device)
    results = evaluate(suite, "cpu", {"colocated": frame}, arch=arch, device_name=device, history=src)
    with ResultsStore(db) as store:
        store.append(RunRecord(suite.id, "cpu", "colocated", arch, device, "check", "pass", trusted=trusted),
                     [check_row(r) for r in results])
    return {r.metric: r for r in results}


def build_history(suite: Suite, db: Path, n: int = 12) -> list[dict[str, object]]:
    frame = real_frame()
    return [evaluate_and_store(suite, frame.drop(index=k + 5), db, trusted=True) for k in range(n)]


def test_clean_history_passes_and_planted_regressions_fail(tmp_path: Path) -> None:
    suite, db = history_suite(tmp_path), tmp_path / "results.sqlite"
    built = build_history(suite, db)
    # the first runs have too little history (min_runs = 5): not evaluated, never a pass; then they pass
    assert [b[TPUT].verdict for b in built[:5]] == ["not_evaluated"] * 5
    assert "0 trusted run(s)" in built[0][TPUT].message and "needs 5" in built[0][TPUT].message
    assert all(b[m].verdict == "pass" for b in built[5:] for m in (TPUT, ACC, "perf/time_per_step"))

    clean = evaluate_and_store(suite, real_frame(), db, trusted=False)
    for m in (TPUT, ACC, "perf/time_per_step"):
        print(clean[m].message)
        assert clean[m].verdict == "pass", clean[m].message

    slow = real_frame()
    slow[TPUT] = slow[TPUT] * 0.9
    slow["perf/time_per_step"] = slow["perf/time_per_step"] / 0.9
    got = evaluate_and_store(suite, slow, db, trusted=False)
    print(got[TPUT].message)
    print(got["perf/time_per_step"].message)
    ref = statistics.median(b[TPUT].actual for b in built[-10:])  # the last 10 trusted runs' medians
    drop = 1 - got[TPUT].actual / ref
    assert got[TPUT].actual == pytest.approx(0.9 * real_frame()[TPUT].median())
    assert 0.10 < drop < 0.12  # 10% planted, plus the full log's median 1.2% under the leave-one-out ones
    assert got[TPUT].verdict == "fail"
    assert f"{drop * 100:.1f}% under the median of the last 10 trusted runs ({ref:.3f}; band 5%, device cpu): FAIL" \
        in got[TPUT].message
    assert got["perf/time_per_step"].verdict == "fail" and "% over the median" in got["perf/time_per_step"].message
    assert got[ACC].verdict == "pass"

    worse = real_frame()
    worse[ACC] = worse[ACC] - 0.05
    got = evaluate_and_store(suite, worse, db, trusted=False)
    print(got[ACC].message)
    assert got[ACC].verdict == "fail" and "0.050 under the mean of the last 12 trusted runs" in got[ACC].message
    assert got[TPUT].verdict == "pass"


def test_untrusted_and_other_device_runs_are_not_history(tmp_path: Path) -> None:
    suite, db = history_suite(tmp_path), tmp_path / "results.sqlite"
    frame = real_frame()
    for k in range(6):
        evaluate_and_store(suite, frame.drop(index=k + 5), db, trusted=False)  # pull-request runs
        evaluate_and_store(suite, frame.drop(index=k + 5), db, trusted=True, device="MI300X", arch="gfx942")
    got = evaluate_and_store(suite, frame, db, trusted=False)
    assert got[TPUT].verdict == "not_evaluated" and "0 trusted run(s)" in got[TPUT].message
    assert "device cpu" in got[TPUT].message
    assert got[TPUT].actual is not None  # the statistic is still stored: a trusted run adds to the history


def test_no_store_is_not_evaluated(tmp_path: Path) -> None:
    suite = history_suite(tmp_path)
    res = evaluate(suite, "cpu", {"colocated": real_frame()}, arch="cpu", device_name="cpu")
    assert {r.verdict for r in res} == {"not_evaluated"}
    assert "no results store is set" in res[0].message


@pytest.mark.parametrize("history, extra, match", [
    ({"rule": "median_rel", "last": 10}, {}, r"references\[0\]\.history\.band: rule median_rel needs 'band'"),
    ({"rule": "median", "last": 10, "band": 0.05}, {}, r"history\.rule: bad value 'median' .*did you mean 'median_rel'"),
    ({"rule": "mean_floor", "last": 30, "rel": 0.02, "floor": 0.01}, {}, r"history\.last: .*at most the last 20"),
    ({"rule": "median_rel", "last": 10, "band": 0.05, "floor": 0.1}, {}, r"history\.floor: 'floor' belongs to"),
    ({"rule": "median_rel", "last": 10, "band": 0.05, "lst": 3}, {}, r"history\.lst: unknown key 'lst'"),
    ({"rule": "median_rel", "last": 10, "band": 0.05}, {"value": 180.0}, r"references\[0\]\.value: a history"),
    ({"rule": "median_rel", "last": 3, "band": 0.05, "min_runs": 5}, {}, r"history\.min_runs: min_runs 5 > last 3"),
])
def test_bad_history_keys_name_file_field_and_fix(tmp_path: Path, history: dict, extra: dict, match: str) -> None:
    ref = {**HISTORY_REFS[0], "history": history, **extra}
    with pytest.raises(ConfigError, match=match) as e:
        history_suite(tmp_path, [ref])
    assert str(e.value).startswith(str(tmp_path / SUITE.name))
