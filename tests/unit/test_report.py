"""HTML parity report: the headline (published references vs golden and sanity checks), verdict rows
in reading order with skips folded by reason, charts only for evaluated checks plus validation
accuracy, band actuals, stable phase colours, CPU units, run coverage, escaping, downsampling."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.checks.results import CheckResult
from rlbench.report.charts import PHASE_COLOURS, validation_metrics
from rlbench.report.html import (
    ReportSection,
    UnrunProfile,
    actual_text,
    downsample,
    overall_verdict,
    partition_table,
    render_report,
    render_session_report,
    runs_table,
    throughput_table,
)
from rlbench.report.summary import Tally, counts_text


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


def _verdict_rows(text: str) -> list[str]:
    """The row classes of the verdict table, in page order."""
    return re.findall(r'<tr class="row-([a-z_]+)">', text)


def test_report_has_verdict_rows_and_one_chart_div_per_chart(tmp_path: Path) -> None:
    results = [
        _result("pass", ref_value=1e-3, ref_band=(0.0, 1.1e-3)),
        _result("fail", metric="timing_s/step", statistic="ratio(colocated/fully_async)", expected=">= 2.5",
                actual=2.0, message="ratio 2.0 < 2.5", ref_value=2.5),
        _result("skip", metric="val-core/aime/acc/mean@1", message="val-core/aime:skip: SKIP (needs gfx950)"),
    ]
    out = render_report(tmp_path / "sub" / "r.html", title="Suite A", runs=RUNS, results=results,
                        env={"arch": "gfx942", "engines": {"vllm": "0.11.0"}, "seeds": [1, 2]},
                        provenance={"commit": "abc"}, suite_meta={"name": "verl-grpo"})
    text = out.read_text()
    assert out == tmp_path / "sub" / "r.html"
    # Verdict: a failure wins; the verdict column comes first; the skip is folded, not a row.
    assert 'Verdict: <span class="badge v-fail">FAIL</span>' in text
    assert _verdict_rows(text) == ["fail", "pass"]
    assert '<tr class="row-fail"><td class="c-verdict"><span class="badge v-fail">FAIL</span></td>' in text
    assert "ratio 2.0 &lt; 2.5" in text  # the failure message is shown, escaped
    assert "<summary><span class=\"badge v-skip\">SKIP</span> 1 skipped: needs gfx950</summary>" in text
    # Charts: ppo_kl and the (failed) step-time ratio; the skipped aime check gets none; the
    # partition gets bars because a timing check was evaluated.
    divs = _chart_divs(text)
    assert divs == ["rlbench-chart-1", "rlbench-chart-2", "rlbench-chart-3"]
    assert all(f'draw("{d}",' in text for d in divs)
    assert "val-core/aime" not in text.split("<h3>Validation accuracy</h3>")[1].split("<h3>Checked")[0]
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
    # No timing check was evaluated: the partition is a table marked as this machine's, no chart.
    assert "compared to nothing" in text and _chart_divs(text) == []


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
    # The one check is published and passed: green PASS, and the headline counts it.
    assert 'Verdict: <span class="badge v-pass">PASS</span>' in text
    assert "<b>1</b> of 1 published references (read off the articles) were compared" in text


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [(["pass", "skip"], "pass"), (["pass", "error"], "error"), (["error", "fail"], "fail"),
     (["skip"], "skip"), ([], "none"), (["pass", "not_evaluated"], "not_evaluated"),
     (["not_evaluated", "fail"], "fail"), (["not_evaluated", "error"], "not_evaluated")],
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
    assert 'Verdict: <span class="badge v-fail">FAIL</span>' in text
    divs = _chart_divs(text)
    assert len(divs) == len(set(divs)) == 2  # the checked metric per section (no timing check), ids unique
    assert text.count("<script>") == 3  # plotly.js still embedded once


# ---------------------------------------------------------------------------- what a reader sees first
ROOT = Path(__file__).resolve().parents[2]


def _real_full_results(tmp_path: Path, **kw: float) -> tuple[dict[str, pd.DataFrame], list[CheckResult]]:
    """The Qwen3-8B suite's checks on a log shaped like the published run (full profile, gfx950)."""
    from rlbench.checks.evaluate import evaluate
    from rlbench.ingest.load import load_metrics
    from rlbench.suites.suite import load_suite
    from tests.helpers.verl_logs import write_qwen3_8b_grpo_log

    suite = load_suite(ROOT / "suites" / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    runs = {"colocated": load_metrics(write_qwen3_8b_grpo_log(tmp_path / "log.jsonl", **kw)).frame}
    return runs, evaluate(suite, "full", runs, arch="gfx950", device_name="AMD Instinct MI355X")


def test_headline_counts_published_references_and_other_profiles(tmp_path: Path) -> None:
    runs, results = _real_full_results(tmp_path, gsm8k_peak=0.90)
    text = render_report(tmp_path / "r.html", title="t", runs=runs, results=results, env={"arch": "gfx950"},
                         suite_meta={"profile": "full", "steps": 200}).read_text()
    tally = Tally.of(results)
    assert tally.published_evaluated == 10 and tally.count("published", "fail") == 3
    assert "<b>10</b> of 10 published references (read off the articles) were compared on profile full: " \
           "7 pass, 3 fail." in text
    # The mini/cpu sanity and golden checks are not this profile's: counted apart, folded, never rows.
    from rlbench.suites.suite import load_suite

    suite = load_suite(ROOT / "suites" / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    n_other = sum("full" not in ref.profiles for ref in suite.references)
    assert len(tally.other_profiles) == n_other > 0
    assert f"{n_other} golden/sanity checks apply only to profile mini/cpu" in text
    assert f"{n_other} not applicable to profile full: they apply to profile mini/cpu</summary>" in text
    rows = _verdict_rows(text)
    assert rows == ["fail"] * 3 + ["pass"] * 8  # failures first, no skip row
    assert text.index('<tr class="row-fail"') < text.index('<tr class="row-pass"') < text.index('<details class="fold fold-other"')
    # Validation accuracy: both published curves drawn, with the checks on them above each.
    val = text.split("<h3>Validation accuracy</h3>")[1].split("<h3>Checked metrics</h3>")[0]
    assert val.count('class="rlbench-chart"') == 2
    assert validation_metrics(runs) == ["val-core/lighteval/MATH/acc/mean@1", "val-core/openai/gsm8k/acc/mean@1"]


def test_project_checks_only_is_not_a_green_pass(tmp_path: Path) -> None:
    results = [
        _result("pass", source="rlbench: a finite loss at every training step", statistic="no_nan", actual=0.0),
        _result("pass", check_id="golden:colocated:critic/score/mean:mean_last[4]", scope="golden",
                source="reports/golden/x.cpu.cpu.json"),
        _result("skip", metric="timing_s/step", source="002.txt: Figure 5, mean step time 388.50 s",
                message="timing_s/step:median~=388.5: SKIP (applies to profile full (this run: cpu))"),
        _result("skip", metric="perf/throughput", source="002.txt: throughput",
                message="perf/throughput:x: SKIP (device-scoped to MI300X; this run is on cpu)"),
    ]
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=results, env={"arch": "cpu"},
                         suite_meta={"profile": "cpu"}).read_text()
    assert Tally.of(results).verdict() == "partial"
    assert '<span class="badge v-partial">PASS: project checks only</span>' in text
    assert 'class="badge v-pass">PASS</span></p>' not in text  # no green overall badge
    assert "<b>0</b> of 2 published references" in text and "This is not a parity result." in text
    assert "1 apply only to profile full" in text and "1 skipped here (reasons below)" in text
    assert "1 golden value(s) recorded by this project per arch: 1 pass." in text
    assert "1 sanity check(s) of this project's mechanics: 1 pass." in text
    # The skipped timing and throughput checks get no chart; no timing check ran: no partition bars.
    assert _chart_divs(text) == ["rlbench-chart-1"]  # actor/ppo_kl, the sanity check's metric
    assert "tok/s, CPU" in text and "tok/s/GPU" not in text  # units of a CPU run


def test_not_evaluated_status_is_grouped_with_reason_and_never_a_pass(tmp_path: Path) -> None:
    results = [
        _result("pass"),
        _result("not_evaluated", metric="val-core/x/acc/mean@1",
                message="val-core/x:peak>=0.9: NOT EVALUATED (metric val-core/x/acc/mean@1 not in the log)"),
    ]
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=results, env={}).read_text()
    assert Tally.of(results).verdict() == "not_evaluated"
    assert 'Verdict: <span class="badge v-not_evaluated">NOT EVALUATED</span>' in text
    assert '1 not evaluated: metric val-core/x/acc/mean@1 not in the log</summary>' in text
    assert _verdict_rows(text) == ["pass"]  # the not-evaluated check is no pass row
    assert "1 pass, 1 not evaluated" in counts_text(results)


def test_partial_log_coverage_is_stated(tmp_path: Path) -> None:
    r = _result("pass")
    if not hasattr(r, "coverage"):
        pytest.skip("rlbench.checks.results.CheckResult has no coverage field")
    r.coverage = "log has steps 80-200 of the profile's 0-200 (starts late)"
    text = render_report(tmp_path / "r.html", title="t", runs=RUNS, results=[r], env={}).read_text()
    assert "1 checks read a partial log: log has steps 80-200 of the profile&#x27;s 0-200 (starts late)." in text
    assert '<div class="msg warn">log has steps 80-200' in text


def test_band_check_actual_is_the_range_seen(tmp_path: Path) -> None:
    runs = {"": _frame({"response_length/mean": [3.0, 12.0, 24.0, 7.0]})}
    ok = _result("pass", metric="response_length/mean", statistic="every step", actual=0.0,
                 steps=[1, 2, 3, 4], ref_band=(1.0, 24.0), expected="every step in [1, 24] (rlbench: limits)")
    assert actual_text(ok, runs) == "min 3, max 24"
    bad = _result("fail", metric="response_length/mean", statistic="every step", actual=1.0, steps=[1, 2, 3, 4])
    assert actual_text(bad, runs) == "min 3, max 24, 1 steps outside"
    text = render_report(tmp_path / "r.html", title="t", runs=runs, results=[ok], env={}).read_text()
    assert "<td>min 3, max 24</td>" in text and "<td>0</td>" not in text


def test_validation_accuracy_drawn_without_a_check(tmp_path: Path) -> None:
    runs = {"": _frame({"actor/ppo_kl": [0.1, 0.2, 0.3], "val-core/synthetic/arithmetic/acc/mean@1": [0.5, 0.7, 0.9]})}
    text = render_report(tmp_path / "r.html", title="t", runs=runs, results=[_result()], env={}).read_text()
    val = text.split("<h3>Validation accuracy</h3>")[1].split("<h3>Checked metrics</h3>")[0]
    assert 'class="rlbench-chart"' in val and "its curve is shown for context" in val
    none = render_report(tmp_path / "n.html", title="t", runs=RUNS, results=[], env={}).read_text()
    assert "No run logged a validation metric" in none


def test_phase_colours_are_stable_across_reports(tmp_path: Path) -> None:
    timing = [_result("pass", metric="timing_s/step", statistic="median", actual=10.0)]
    a = render_report(tmp_path / "a.html", title="t", runs=RUNS, results=timing, env={}).read_text()
    runs_b = {"": _frame({"timing_s/step": [9.0, 9.0], "timing_s/update_actor": [4.0, 4.0]})}
    b = render_report(tmp_path / "b.html", title="t", runs=runs_b, results=timing, env={}).read_text()

    def colour(text: str, phase: str) -> str:
        m = re.search(r'"marker":\{"color":"(#[0-9a-f]+)"\},"name":"' + re.escape(phase) + '"', text)
        assert m, phase
        return m.group(1)

    assert colour(a, "actor update") == colour(b, "actor update") == PHASE_COLOURS["actor update"]
    assert colour(a, "generation") == PHASE_COLOURS["generation"]


def test_runs_table_flags_late_start_and_early_end() -> None:
    runs = {"colocated": _frame({"actor/ppo_kl": [0.1] * 4}, start=3), "fully_async": _frame({"actor/ppo_kl": [0.1] * 8})}
    text = runs_table(runs, expected_steps=8)
    assert "starts late: first training step 3 (steps 1-2 missing)" in text
    assert "ends early: last step 6 of 8" in text
    assert "<td>8 of 8</td><td>8</td><td>complete</td>" in text
    # A validation-only step 0 is no training step; a run cut by an override says so.
    val0 = _frame({"val-core/x/acc/mean@1": [0.5], "timing_s/testing": [3.0]}, start=0)
    cut = {"": pd.concat([val0, _frame({"actor/ppo_kl": [0.1] * 3})])}
    text = runs_table(cut, expected_steps=3, profile_steps=8)
    assert "<td>1</td><td>3 of 3</td><td>3</td>" in text
    assert "cut to 3 steps by an override (the profile runs 8)" in text


def test_session_report_lists_profiles_that_could_not_run(tmp_path: Path) -> None:
    sections = [ReportSection(title="suite-a [cpu]", runs=RUNS, results=[_result("pass")], env={"arch": "cpu"})]
    unrun = [UnrunProfile("suite-a [full]", "needs 8 GPUs of arch gfx950 (this machine: 0)", 11)]
    text = render_session_report(tmp_path / "s.html", sections, unrun=unrun,
                                 items={"passed": 1, "skipped": 11}).read_text()
    assert "11 checks of suite-a [full] could not run here: needs 8 GPUs of arch gfx950 (this machine: 0)." in text
    assert "pytest items: 1 passed, 11 skipped." in text
    assert "<b>1</b> of 1 published references" in text


def test_run_colours_are_stable_across_reports(tmp_path: Path) -> None:
    only_async = {"fully_async": RUNS["fully_async"]}
    text = render_report(tmp_path / "r.html", title="t", runs=only_async, results=[_result()], env={}).read_text()
    assert '"line":{"color":"#d62728"},"mode":"lines+markers","name":"fully_async"' in text


def test_validation_samples_and_sandbox_layers_reach_the_report(tmp_path: Path) -> None:
    import json

    from rlbench.run.runner import evaluate_runs
    from rlbench.suites.suite import load_suite
    from trainer.components.val_samples import write_samples

    suite = load_suite(Path(__file__).resolve().parents[2] / "suites" / "verl_geo3k_qwen35_35b_a3b_moe_gfx950.yaml")
    run_dir = tmp_path / "colocated"
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    write_samples(run_dir, 0, [{"step": 0, "response": "old", "ground_truth": "3", "score": 0.0, "images": []}])
    write_samples(run_dir, 4, [{"step": 4, "response": "answer 7", "ground_truth": "7", "score": 1.0,
                                "images": [png]}])
    (run_dir / "env.json").write_text(json.dumps({"sandbox": {"layers": ["rlimits", "seccomp"]}}))
    out = evaluate_runs(suite, "cpu", {0: {"colocated": _frame({"critic/score/mean": [0.1, 0.2]})}}, arch="cpu",
                        device_name="", folder=tmp_path, env={"arch": "cpu"}, provenance={}, status=lambda _: None)
    text = out.report.read_text()
    samples = text.split("<h3>Validation samples</h3>")[1].split("<h3>")[0]
    assert "step 4" in samples and "answer 7" in samples and "old" not in samples  # the last sampled step only
    assert f'src="data:image/png;base64,{png}"' in samples
    assert "sandbox (colocated).layers" in text and "rlimits, seccomp" in text
