"""HTML parity report: verdict rows, one chart div per chart, escaping, downsampling, tables."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.report import (
    ReportSection,
    downsample,
    overall_verdict,
    partition_table,
    render_report,
    render_session_report,
    throughput_table,
)
from rlbench.results import CheckResult


def _frame(data: dict[str, list[float]], start: int = 1) -> pd.DataFrame:
    n = len(next(iter(data.values())))
    return pd.DataFrame(data, index=pd.Index(range(start, start + n), name="step"))


def _result(verdict: str = "pass", metric: str = "actor/ppo_kl", **kw: object) -> CheckResult:
    base = {"check_id": f"{metric}:{verdict}", "verdict": verdict, "metric": metric, "statistic": "final",
            "expected": "<= 0.001", "actual": 0.0005, "source": "article sec 2", "why": "numerics locked"}
    base.update(kw)
    return CheckResult(**base)  # type: ignore[arg-type]


RUNS = {
    "colocated": _frame({
        "actor/ppo_kl": [1e-4, 2e-4, 3e-4, 4e-4],
        "timing_s/step": [10.0, 10.0, 10.0, 10.0],
        "timing_s/gen": [4.0, 4.0, 4.0, 4.0],
        "timing_s/update_actor": [3.0, 3.0, 3.0, 3.0],
        "perf/throughput": [100.0, 200.0, 300.0, 1000.0],
        "perf/total_num_tokens": [1000.0, 1000.0, 2000.0, 2000.0],
    }),
    "fully_async": _frame({
        "actor/ppo_kl": [1e-3, 2e-3, 3e-3, 4e-3],
        "timing_s/step": [5.0, 5.0, 5.0, 5.0],
        "timing_s/gen": [1.0, 1.0, 1.0, 1.0],
        "timing_s/update_actor": [5.0, 5.0, 5.0, 5.0],
        "perf/throughput": [200.0, 200.0, 200.0, 200.0],
    }),
}


def _chart_divs(text: str) -> list[str]:
    return re.findall(r'<div id="(rlbench-chart-\d+)" class="rlbench-chart"', text)


def test_report_has_verdict_rows_and_one_chart_div_per_chart(tmp_path: Path) -> None:
    results = [
        _result("pass", ref_value=1e-3, ref_band=(0.0, 1.1e-3)),
        _result("fail", metric="timing_s/step", statistic="ratio(colocated/fully_async)", expected=">= 2.5",
                actual=2.0, message="ratio 2.0 < 2.5", ref_value=2.5),
        _result("skip", metric="val-core/aime/acc/mean@1", message="needs gfx950"),
    ]
    out = render_report(tmp_path / "sub" / "r.html", title="Suite A", runs=RUNS, results=results,
                        env={"arch": "gfx942", "engines": {"vllm": "0.11.0"}, "seeds": [1, 2]},
                        provenance={"commit": "abc"}, suite_meta={"name": "verl-grpo"})
    text = out.read_text()
    assert out == tmp_path / "sub" / "r.html"
    # Overall verdict: a failure wins.
    assert 'Overall verdict: <span class="badge v-fail">FAIL</span>' in text
    assert text.count('<tr class="row-') == 3
    assert '<tr class="row-fail"><td>timing_s/step:fail</td>' in text
    assert "ratio 2.0 &lt; 2.5" in text  # the failure message is shown, escaped
    # Charts: ppo_kl and timing_s/step have data; the aime metric has none; plus the partition chart.
    divs = _chart_divs(text)
    assert divs == ["rlbench-chart-1", "rlbench-chart-2", "rlbench-chart-3"]
    assert all(f'draw("{d}",' in text for d in divs)
    assert "No run logged <code>val-core/aime/acc/mean@1</code>" in text
    # plotly.js is embedded once, and nothing is fetched from the network.
    assert text.count("<script>") == 3
    assert "<script src" not in text and "<link" not in text
    # Environment flattened, provenance and suite tables present.
    assert "<th>engines.vllm</th><td>0.11.0</td>" in text
    assert "<th>seeds</th><td>1, 2</td>" in text
    assert "<th>commit</th><td>abc</td>" in text and "<th>name</th><td>verl-grpo</td>" in text


def test_reference_drawn_only_for_statistics_in_metric_unit(tmp_path: Path) -> None:
    results = [
        _result("pass", ref_value=0.00123, ref_band=(0.0, 0.0015)),
        _result("pass", metric="timing_s/step", statistic="ratio(colocated/fully_async)", ref_value=1.75),
    ]
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=results, env={}).read_text()
    assert "ref 0.00123 (final)" in text  # a dashed reference line with its label
    assert '"y0":0.0,"y1":0.0015' in text  # the accepted band as a shaded rectangle
    assert "ref 1.75" not in text  # a ratio is not in seconds: no line on the step-time curve


def test_everything_from_inputs_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert('x')</script>"
    runs = {evil: _frame({evil: [1.0, 2.0]})}
    results = [_result("fail", metric=evil, check_id=evil, source=evil, why=evil, message=evil, run=evil)]
    text = render_report(tmp_path / "r.html", title=evil, runs=runs, results=results, env={evil: evil},
                         provenance={"k": evil}, suite_meta={"name": evil}).read_text()
    assert evil not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    assert text.count("</script>") == 3  # only the page's own script elements close
    assert len(_chart_divs(text)) == 1


def test_downsample_keeps_extremes_and_bounds_points() -> None:
    n = 10_000
    steps = np.arange(n)
    values = np.sin(steps / 50.0)
    values[1234] = 50.0  # a spike must survive
    values[4321] = -50.0
    values[10] = np.nan
    x, y = downsample(steps, values, max_points=2000)
    assert len(x) <= 2000
    assert 50.0 in y and -50.0 in y
    assert np.all(np.diff(x) > 0)  # still in step order
    assert not np.isnan(y).any()
    small_x, small_y = downsample(np.arange(5), np.array([1.0, np.nan, 3.0, np.inf, 5.0]))
    assert list(small_x) == [0, 2, 4] and list(small_y) == [1.0, 3.0, 5.0]


def test_partition_table_means_and_other() -> None:
    table = partition_table(RUNS)
    assert table.loc["colocated", "generation"] == 4.0
    assert table.loc["colocated", "actor update"] == 3.0
    assert table.loc["colocated", "other"] == 3.0  # 10 - 4 - 3
    assert table.loc["fully_async", "other"] == -1.0  # overlapping phases: 5 - 1 - 5
    assert table.loc["colocated", "step"] == 10.0
    assert "old log-prob" not in table.columns  # not logged by any run


def test_partition_flags_overlap_in_report(tmp_path: Path) -> None:
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=[], env={}).read_text()
    assert 'class="warn" title="phases overlap' in text
    assert "No checks were evaluated." in text
    assert '<span class="badge v-none">NO CHECKS</span>' in text


def test_throughput_table_and_ratio(tmp_path: Path) -> None:
    table = throughput_table(RUNS)
    assert table.loc["colocated", "median throughput (tok/s/GPU)"] == 250.0
    assert table.loc["colocated", "mean throughput (tok/s/GPU)"] == 400.0
    assert table.loc["colocated", "median step time (s)"] == 10.0
    assert table.loc["colocated", "median tokens/s"] == 150.0  # median of 100, 100, 200, 200
    assert math.isnan(table.loc["fully_async", "median tokens/s"])
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=[], env={}).read_text()
    # colocated / fully_async: step time 10 / 5 = 2x, median throughput 250 / 200 = 1.25x
    assert "<th>colocated</th> / <th>" not in text
    assert "<th>colocated / fully_async</th>" in text and "<td>2x</td>" in text and "<td>1.25x</td>" in text


def test_report_without_timings_says_so(tmp_path: Path) -> None:
    runs = {"": _frame({"actor/ppo_kl": [0.1, 0.2]})}
    text = render_report(tmp_path / "r.html", title="t", runs=runs, results=[_result()], env={}).read_text()
    assert "no step-time partition" in text
    assert "No throughput or step-time metrics logged." in text
    assert len(_chart_divs(text)) == 1
    assert '<span class="badge v-pass">PASS</span>' in text


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [(["pass", "skip"], "pass"), (["pass", "error"], "error"), (["error", "fail"], "fail"),
     (["skip"], "skip"), ([], "none")],
)
def test_overall_verdict(verdicts: list[str], expected: str) -> None:
    assert overall_verdict([_result(v) for v in verdicts]) == expected


def test_session_report_has_a_section_per_suite_profile(tmp_path: Path) -> None:
    sections = [
        ReportSection(title="suite-a / cpu", runs=RUNS, results=[_result("pass")], env={"arch": "cpu"}),
        ReportSection(title="suite-b / mini", runs={"": RUNS["colocated"]}, results=[_result("fail")],
                      env={"arch": "sm90"}),
    ]
    text = render_session_report(tmp_path / "session.html", sections).read_text()
    assert '<section id="section-1">' in text and '<section id="section-2">' in text
    assert '<a href="#section-2">suite-b / mini</a>' in text
    assert 'Overall verdict: <span class="badge v-fail">FAIL</span>' in text
    divs = _chart_divs(text)
    assert len(divs) == len(set(divs)) == 4  # (metric + partition) per section, ids unique
    assert text.count("<script>") == 3  # plotly.js still embedded once
