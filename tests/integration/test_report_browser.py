"""Open a rendered report in headless Chromium: no console errors, every plotly chart drawn, offline.

Needs Debian's chromium (`apt-get install -y chromium`) and playwright-python
(`pip install playwright`; its own browser download is not needed). Skipped when either is
missing. The screenshot is left at <tmp>/report.png.

    OMP_NUM_THREADS=1 python3 -m pytest tests/integration/test_report_browser.py -m integration -q
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.report import render_report
from rlbench.results import CheckResult

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


def test_report_draws_charts_without_console_errors(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium: install Debian's chromium (apt-get install -y chromium) to run this test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright-python missing: pip install playwright")
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
