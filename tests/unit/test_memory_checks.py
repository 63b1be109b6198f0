"""A profile's memory items (rlbench/run/runner.py: memory_checks) on the numbers of a clean and a broken
session: the geometry3k cpu profile measured with each run in its own process, and as it was when the runs
trained inside the pytest process (reports/cpu/memory.md)."""

from __future__ import annotations

from pathlib import Path

from rlbench.run.runner import DRIVER_CHECK_ID, memory_check_ids, memory_checks
from rlbench.suites.suite import load_suite

GEO = load_suite(Path(__file__).resolve().parents[2] / "suites" / "verl_geo3k_qwen35_35b_a3b_moe_gfx950.yaml")


def _rec(peak: float) -> dict[str, object]:
    return {"peak_rss_gb": peak, "peak_by_process": {"ray::TrainerWorker": peak * 0.7}}


def test_clean_session_passes_every_memory_item() -> None:
    res = memory_checks(GEO, "cpu", {"colocated": _rec(11.2), "fully_async": _rec(14.0)}, (0.31, 0.35))
    assert [r.check_id for r in res] == memory_check_ids(GEO, "cpu")
    assert [r.check_id for r in res] == ["memory/peak_rss_gb<=16[colocated]", "memory/peak_rss_gb<=16[fully_async]",
                                         DRIVER_CHECK_ID]
    assert all(r.verdict == "pass" for r in res), [r.message for r in res]


def test_runs_made_in_the_driver_fail_the_growth_and_the_peak() -> None:
    res = memory_checks(GEO, "cpu", {"colocated": _rec(11.35), "fully_async": _rec(21.3)}, (0.31, 9.9))
    verdicts = {r.check_id: r.verdict for r in res}
    assert verdicts == {"memory/peak_rss_gb<=16[colocated]": "pass", "memory/peak_rss_gb<=16[fully_async]": "fail",
                        DRIVER_CHECK_ID: "fail"}
    growth = next(r for r in res if r.check_id == DRIVER_CHECK_ID)
    assert "0.31 -> 9.90 GB" in growth.message and "+9.59 GB" in growth.message


def test_a_mode_without_a_record_is_not_evaluated() -> None:
    res = memory_checks(GEO, "cpu", {"colocated": _rec(11.2)}, (0.3, 0.3))
    assert {r.check_id: r.verdict for r in res}["memory/peak_rss_gb<=16[fully_async]"] == "not_evaluated"
