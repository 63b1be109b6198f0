"""Trend charts of the run report (rlbench/report/trends.py): each check's value over the results store's
last runs of the same suite, profile, modes and device, trusted and untrusted runs apart, this run last,
the band drawn where the check has one; read back from the chart JSON the page embeds.

    pytest tests/unit/test_report_trends.py -q
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd

from rlbench.checks.results import CheckResult
from rlbench.report.html import render_report
from rlbench.report.trends import load_trends
from rlbench.store.sqlite import CheckRow, ResultsStore, RunRecord

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"
SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"
ACC = "val-core/x/acc/mean@1:mean_last[3]~=history"
TPUT = "perf/throughput:median>=history"


def charts_by_check(page: str) -> dict[str, dict]:
    """Check id -> the figure (data, layout) its trend chart draws."""
    figs = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r'^draw\("(rlbench-chart-\d+)", (.*)\);$',
                                                                    page, flags=re.MULTILINE)}
    cells = re.findall(r'<div class="trend"><p class="trend-title"><code>(.*?)</code>.*?<div id="(rlbench-chart-\d+)"',
                       page)
    return {html.unescape(cid): figs[div] for cid, div in cells}


def trace(fig: dict, name: str) -> dict:
    (t,) = [t for t in fig["data"] if t["name"] == name]
    return t


def _rec(trusted: bool, device: str = "cpu", mode: str = "colocated") -> RunRecord:
    return RunRecord(suite="s", profile="cpu", mode=mode, arch="cpu", device=device, source="check",
                     verdict="pass", trusted=trusted)


def test_trend_charts_from_a_sqlite_history(tmp_path: Path) -> None:
    db = tmp_path / "results.sqlite"
    trusted = [i % 3 != 2 for i in range(24)]  # every third run untrusted (a pull request's)
    with ResultsStore(db) as store:
        for i in range(24):
            store.append(_rec(trusted[i]), [CheckRow(ACC, "pass", 0.90 + i / 1000, 0.88 + i / 1000, 0.92 + i / 1000),
                                            CheckRow(TPUT, "pass" if i != 20 else "fail", 190.0 + i, 180.0, None)])
        store.append(_rec(True, device="MI300X"), [CheckRow(ACC, "pass", 0.5, 0.4, 0.6)])  # another board
        store.append(_rec(True, mode="colocated+fully_async"), [CheckRow(ACC, "pass", 0.6)])  # other modes
    trends = load_trends(db, suite="s", profile="cpu", mode="colocated", device="cpu")
    assert [r.id for r in trends.runs] == list(range(24, 4, -1))  # the last 20 of the 24, newest first
    current = [
        CheckResult(ACC, "pass", "val-core/x/acc/mean@1", "mean_last[3]", "", 0.95, "", "", ref_band=(0.9, 0.96)),
        CheckResult(TPUT, "fail", "perf/throughput", "median", "", 150.0, "", "", ref_band=(182.0, float("inf"))),
        CheckResult("skipped", "skip", "perf/x", "median", "", None, "", ""),
    ]
    frame = pd.DataFrame({"val-core/x/acc/mean@1": [0.9, 0.95]}, index=pd.Index([1, 2], name="step"))
    page = render_report(tmp_path / "r.html", title="t", runs={"colocated": frame}, results=current, env={},
                         trends=trends).read_text()
    charts = charts_by_check(page)
    assert list(charts) == [ACC, TPUT]  # one per evaluated check; the skipped one has none
    acc, tput = charts[ACC], charts[TPUT]
    runs = list(range(5, 25))  # store ids, oldest first
    line = trace(acc, "value")
    assert line["x"] == [f"#{i}" for i in runs] + ["this run"]  # 20 earlier runs and this one
    assert line["y"] == [0.90 + (i - 1) / 1000 for i in runs] + [0.95]
    assert trace(acc, "trusted")["x"] == [f"#{i}" for i in runs if trusted[i - 1]]
    assert trace(acc, "untrusted")["x"] == [f"#{i}" for i in runs if not trusted[i - 1]]
    assert len(trace(acc, "trusted")["x"]) == 13 and len(trace(acc, "untrusted")["x"]) == 7
    assert trace(acc, "this run")["x"] == ["this run"] and trace(acc, "this run")["y"] == [0.95]
    # the band: each run's own (a history gate's moves with its baseline), shaded between lo and hi
    assert trace(acc, "band lo")["y"] == [0.88 + (i - 1) / 1000 for i in runs] + [0.9]
    assert trace(acc, "band hi")["y"] == [0.92 + (i - 1) / 1000 for i in runs] + [0.96]
    assert trace(acc, "band hi")["fill"] == "tonexty"
    # a one-sided band (>=): its lower edge only, dashed; an infinite edge is no band value
    assert trace(tput, "band lo")["y"] == [180.0] * 20 + [182.0]
    assert not [t for t in tput["data"] if t["name"] == "band hi"]
    assert trace(tput, "value")["y"] == [190.0 + i - 1 for i in runs] + [150.0]
    assert "#21 (untrusted): 210, fail" in trace(tput, "untrusted")["text"]
    assert "20 earlier run(s); this run 150 fail; band [182, inf]" in page
    assert "last 20 run(s) of s [cpu] colocated on cpu in " + str(db) in page
    plain = render_report(tmp_path / "p.html", title="t", runs={"colocated": frame}, results=current, env={})
    assert "Trends</h3>" not in plain.read_text() and 'class="trend"' not in plain.read_text()
    assert '<h3 class="trends-head">Trends</h3>' in page


def test_rlbench_check_with_a_store_draws_the_history(tmp_path: Path) -> None:
    """`rlbench check LOG --store` on the real cpu log: the report reads the store's runs before this one
    is appended (11 earlier runs: the first check's and 10 trusted reruns with other response lengths)."""
    from rlbench.cli import main

    db = tmp_path / "results.sqlite"
    args = ["check", str(LOG), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu", "--store", str(db)]
    assert main([*args, "--out", str(tmp_path / "first")]) in (0, 1)
    with ResultsStore(db) as store:
        (first,) = store.runs()
        tput = first.checks["golden:colocated:response_length/mean:mean"]  # a value and a band
        for i in range(10):
            checks = [CheckRow(**{**vars(c), "value": c.value * (1 + i / 100)}) if c is tput else c
                      for c in first.checks.values()]
            store.append(RunRecord(**{**vars(first.record), "trusted": True}), checks)
    assert main([*args, "--out", str(tmp_path / "last")]) in (0, 1)
    page = (tmp_path / "last" / "report.html").read_text()
    fig = charts_by_check(page)[tput.check_id]
    assert trace(fig, "value")["x"] == [f"#{i}" for i in range(1, 12)] + ["this run"]
    assert trace(fig, "value")["y"][:11] == [tput.value] + [tput.value * (1 + i / 100) for i in range(10)]
    assert trace(fig, "untrusted")["x"] == ["#1"] and len(trace(fig, "trusted")["x"]) == 10
    assert trace(fig, "this run")["y"] == [tput.value]  # the same log, the same median
    assert tput.lo is not None and tput.hi is not None
    assert trace(fig, "band lo")["y"] == [tput.lo] * 12 and trace(fig, "band hi")["y"] == [tput.hi] * 12
    # an "every step in [lo, hi]" check counts the steps outside: its band is not drawn on that count
    every = charts_by_check(page)["response_length/mean:each in [1,24]"]
    assert trace(every, "value")["y"] == [0.0] * 12 and {t["name"] for t in every["data"]} == {"value", "trusted",
                                                                                               "untrusted", "this run"}
    with ResultsStore(db) as store:
        assert len(store.runs()) == 12  # and this run appended after its report


def test_no_earlier_run_and_an_unreadable_store_are_said(tmp_path: Path) -> None:
    r = CheckResult(ACC, "pass", "val-core/x/acc/mean@1", "mean_last[3]", "", 0.95, "", "")
    frame = pd.DataFrame({"val-core/x/acc/mean@1": [0.95]}, index=pd.Index([1], name="step"))
    first = load_trends(tmp_path / "new.sqlite", suite="s", profile="cpu", mode="colocated", device="cpu")
    page = render_report(tmp_path / "a.html", title="t", runs={"colocated": frame}, results=[r], env={},
                         trends=first).read_text()
    assert first.runs == [] and "No earlier run of s [cpu] colocated on cpu in" in page and not charts_by_check(page)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    broken = load_trends(bad, suite="s", profile="cpu", mode="colocated", device="cpu")
    page = render_report(tmp_path / "b.html", title="t", runs={"colocated": frame}, results=[r], env={},
                         trends=broken).read_text()
    assert f"No trends: the results store could not be read ({bad}: not an rlbench results store" in page

