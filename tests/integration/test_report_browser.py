"""Open rendered reports in headless Chromium: no console errors, every plotly chart drawn, offline;
and what a reader sees at 1280x800 on a report with passes, failures and skips: the headline states
how many published references were compared, the verdict column is on screen without horizontal
scrolling, failures come before skips, the validation-accuracy chart is drawn.

Needs Debian's chromium (`apt-get install -y chromium`; `.ci/run` installs it) and
playwright-python (`pip install playwright`; its own browser download is not needed). Skipped
when either is missing. Screenshots are left in <tmp>; with RLBENCH_SCREENSHOT=PATH the reader's
view (full page) is also written to PATH (reports/report_screenshot.png was made so).

    OMP_NUM_THREADS=1 python3 -m pytest tests/integration/test_report_browser.py -m integration -q
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.checks.results import CheckResult
from rlbench.report.html import ReportSection, UnrunProfile, render_report, render_session_report
from rlbench.report.summary import Tally

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _runs(num_steps: int) -> dict[str, pd.DataFrame]:
    steps = pd.Index(np.arange(1, num_steps + 1), name="step")
    rng = np.random.default_rng(0)
    t = np.arange(num_steps) / num_steps
    runs = {}
    for name, scale in (("colocated", 1.8), ("fully_async", 1.0)):
        runs[name] = pd.DataFrame(
            {
                "val-core/openai/gsm8k/acc/mean@1": 0.82 + 0.13 * (1 - np.exp(-8 * t)) + rng.normal(0, 0.005, num_steps),
                "actor/ppo_kl": 1e-4 + rng.normal(0, 2e-5, num_steps),
                "timing_s/step": 200 * scale + rng.normal(0, 5, num_steps),
                "timing_s/gen": 100 * scale + rng.normal(0, 2, num_steps),
                "timing_s/old_log_prob": 20 * scale + rng.normal(0, 1, num_steps),
                "timing_s/update_actor": 60 * scale + rng.normal(0, 2, num_steps),
                "timing_s/update_weights": 5.0 + rng.normal(0, 0.1, num_steps),
                "perf/throughput": 1000 / scale + rng.normal(0, 10, num_steps),
            },
            index=steps,
        )
    return runs


def _browser() -> object:
    if CHROMIUM is None:
        pytest.skip("no chromium: install Debian's chromium (apt-get install -y chromium) to run this test")
    return pytest.importorskip("playwright.sync_api", reason="playwright-python missing: pip install playwright")


def test_report_draws_charts_without_console_errors(tmp_path: Path) -> None:
    sync_api = _browser()
    results = [
        CheckResult(check_id="gsm8k:peak>=0.93", verdict="pass", metric="val-core/openai/gsm8k/acc/mean@1",
                    statistic="peak", expected=">= 0.93 (tol 0.03)", actual=0.956, source="000_af77aeb111e0721a.txt",
                    why="read off a curve", run="colocated", ref_value=0.93, ref_band=(0.90, 1.0)),
        CheckResult(check_id="kl<=1e-3 <script>alert(1)</script>", verdict="fail", metric="actor/ppo_kl",
                    statistic="mean_last[20]", expected="<= 0.001", actual=0.002, source="article", why="locked",
                    message="actor/ppo_kl mean_last[20] = 0.002 > 0.001", ref_value=1e-3, ref_band=(-np.inf, 1e-3)),
        CheckResult(check_id="speedup", verdict="pass", metric="timing_s/step", statistic="ratio(colocated/fully_async)",
                    expected=">= 1.5", actual=1.8, source="article", why="async overlap", ref_value=1.5),
    ]
    out = render_report(tmp_path / "report.html", title="browser check", runs=_runs(3000), results=results,
                        env={"arch": "gfx950", "device": "AMD Instinct MI355X", "torch": "2.13.0"},
                        provenance={"commit": "abc123", "date": "2026-01-01"})
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(out.as_uri())
        page.wait_for_function("document.querySelectorAll('.rlbench-chart .main-svg').length > 0")
        num_charts = page.locator("div.rlbench-chart").count()
        drawn = page.evaluate(
            "Array.from(document.querySelectorAll('div.rlbench-chart'))"
            ".filter(d => d.querySelector('.main-svg') !== null).length"
        )
        traces = page.evaluate("document.querySelectorAll('.rlbench-chart .scatterlayer .trace').length")
        num_scripts = page.evaluate("document.querySelectorAll('script').length")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert errors == []
    assert num_charts == 4  # 3 checked metrics + the step-time partition
    assert drawn == num_charts
    assert traces >= 6  # two runs on each of the 3 metric charts
    assert num_scripts == 3  # plotly.js, the template, the chart calls: the escaped check id added none
    assert all(not u.startswith(("http://", "https://")) for u in requests), requests
    assert (tmp_path / "report.png").stat().st_size > 10_000


def _reader_report(tmp_path: Path) -> tuple[Path, Tally]:
    """A session report with passes, failures and skips: the Qwen3-8B suite's full profile on a log
    whose GSM8K plateaus at 0.90 (3 published references fail), a device-scoped throughput
    reference skipped, the mini/cpu checks of the suite (other profiles), and a profile that could
    not run here."""
    from rlbench.checks.evaluate import evaluate
    from rlbench.checks.metric import skipped
    from rlbench.ingest.load import load_metrics
    from rlbench.suites.suite import Reference, load_suite
    from tests.helpers.verl_logs import write_qwen3_8b_grpo_log

    suite = load_suite(ROOT / "suites" / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    runs = {"colocated": load_metrics(write_qwen3_8b_grpo_log(tmp_path / "log.jsonl", gsm8k_peak=0.90)).frame}
    results = evaluate(suite, "full", runs, arch="gfx950", device_name="AMD Instinct MI355X")
    ref = Reference(metric="perf/throughput", stat="median", op="approx", value=1200.0, tol=0.15, rel_tol=True,
                    scope="device", device="MI300X", source="002_45dc056033c88adc.txt: rollout throughput",
                    why="measured on one board")
    results.append(skipped(ref, "device-scoped to MI300X; this run is on AMD Instinct MI355X", "device"))
    section = ReportSection(title=f"{suite.title} [full]", runs=runs, results=results,
                            env={"arch": "gfx950", "device_name": "AMD Instinct MI355X", "num_gpus": 8},
                            suite_meta={"suite": suite.id, "profile": "full", "steps": 200})
    out = render_session_report(
        tmp_path / "session.html", [section], title="rlbench suites on gfx950",
        unrun=[UnrunProfile("verl DAPO Qwen2.5-Math-7B fully-async [full]", "needs 32 GPUs of arch gfx942", 18)])
    return out, Tally.of(results)


def test_reader_view_at_1280(tmp_path: Path) -> None:
    sync_api = _browser()
    out, tally = _reader_report(tmp_path)
    assert tally.count("published", "fail") >= 1 and tally.count("published", "pass") >= 1
    assert tally.count(status="skip") >= 1
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(out.as_uri())
        page.wait_for_function("document.querySelectorAll('.rlbench-chart .main-svg').length > 0")
        headline = page.locator(".headline").first.inner_text()
        scroll_width = page.evaluate("document.documentElement.scrollWidth")
        inner_width = page.evaluate("window.innerWidth")
        # Right edge of every verdict cell of the section's verdict table, in page coordinates.
        verdict_right = page.evaluate(
            "Math.max(...Array.from(document.querySelectorAll('section table.verdicts td.c-verdict, "
            "section table.verdicts th.c-verdict')).map(e => e.getBoundingClientRect().right))")
        first_fail = page.evaluate("document.querySelector('section tr.row-fail').getBoundingClientRect().top")
        last_pass = page.evaluate(
            "Math.max(...Array.from(document.querySelectorAll('section tr.row-pass')).map(e => e.getBoundingClientRect().top))")
        first_skip = page.evaluate("document.querySelector('section details.fold').getBoundingClientRect().top")
        val_drawn = page.evaluate(
            "(() => { const h = Array.from(document.querySelectorAll('section h3'))"
            ".find(e => e.textContent === 'Validation accuracy');"
            " let n = h.nextElementSibling, k = 0;"
            " while (n && n.tagName !== 'H3') { if (n.matches('div.rlbench-chart') && n.querySelector('.main-svg')) k++;"
            " n = n.nextElementSibling; } return k; })()")
        page.screenshot(path=str(tmp_path / "reader.png"), full_page=True)
        shot = os.environ.get("RLBENCH_SCREENSHOT")
        if shot:
            page.screenshot(path=shot, full_page=True)
        browser.close()
    assert errors == []
    n_pub = tally.published_evaluated
    assert f"{n_pub} of {tally.published_total} published references (read off the articles) were compared" in headline
    assert "18 checks of verl DAPO Qwen2.5-Math-7B fully-async [full] could not run here" in headline
    assert scroll_width <= inner_width == 1280  # no horizontal scrolling
    assert 0 < verdict_right <= inner_width  # the verdict column is on screen
    assert first_fail < last_pass < first_skip  # failures, then passes, then the folded skips
    assert val_drawn == 2  # GSM8K and MATH validation accuracy, drawn
    assert (tmp_path / "reader.png").stat().st_size > 10_000


def test_trend_charts_at_1280(tmp_path: Path) -> None:
    """The Trends section of a report with a 10-run SQLite history: every small chart drawn, three to a
    row, no horizontal scrolling at 1280 px, each with the 10 earlier runs and this one."""
    from rlbench.report.trends import load_trends
    from rlbench.store.sqlite import CheckRow, ResultsStore, RunRecord

    sync_api = _browser()
    db = tmp_path / "results.sqlite"
    ids = [f"check-{k}:mean_last[3]~=history" for k in range(5)]
    with ResultsStore(db) as store:
        for i in range(10):
            store.append(RunRecord("s", "cpu", "colocated", "cpu", "cpu", "check", "pass", trusted=i % 3 != 0),
                         [CheckRow(c, "pass", 0.9 + i / 100, 0.85, 0.95) for c in ids])
    results = [CheckResult(c, "pass", f"m{k}", "mean_last[3]", "", 0.93, "", "", ref_band=(0.85, 0.95))
               for k, c in enumerate(ids)]
    trends = load_trends(db, suite="s", profile="cpu", mode="colocated", device="cpu")
    out = render_report(tmp_path / "trends.html", title="trends", runs=_runs(20), results=results,
                        env={"arch": "cpu"}, trends=trends)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(out.as_uri())
        page.wait_for_function("Array.from(document.querySelectorAll('.trend div.rlbench-chart'))"
                               ".every(d => d.querySelector('.main-svg') !== null)")
        cells = page.evaluate("Array.from(document.querySelectorAll('.trend')).map(e => e.getBoundingClientRect())"
                              ".map(b => [Math.round(b.left), Math.round(b.top), Math.round(b.width)])")
        points = page.evaluate("Array.from(document.querySelectorAll('.trend div.rlbench-chart'))"
                               ".map(d => d.data.find(t => t.name === 'value').y.length)")
        scroll_width = page.evaluate("document.documentElement.scrollWidth")
        browser.close()
    assert errors == []
    assert len(cells) == 5 and points == [11] * 5
    assert len({top for _, top, _ in cells[:3]}) == 1 and cells[3][1] > cells[0][1]  # three to a row
    assert all(w >= 360 for *_, w in cells)
    assert scroll_width <= 1280
