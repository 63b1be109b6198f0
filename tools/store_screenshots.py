"""The screenshots of docs/store.md, made the way tests/integration/test_report_browser.py makes
reports/report_screenshot.png: the page opened from disk in Debian's headless chromium through
playwright-python, at 1280 px wide, after every plotly chart is drawn.

    python tools/store_screenshots.py            # writes reports/compare_screenshot.png, reports/trend_screenshot.png
    python tools/store_screenshots.py --keep /tmp/shots   # and keeps the pages, the store and the run folders

- compare: `rlbench compare` of the DAPO mini seed sets of reports/sm90/async_static (max response
  768, seeds 0 and 1, against 512, seed 0), the command docs/store.md shows;
- trends: the report of `rlbench check reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl --store`
  after a SQLite history of 12 runs of the same log, each with one training step left out (run k
  without step k + 5, so each statistic is a real one), runs 4, 8 and 12 untrusted; the screenshot is
  the report's Trends section.

Needs `apt-get install -y chromium` (.ci/run does it) and `pip install playwright`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"
SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"


def screenshot(page_path: Path, png: Path, selector: str | None = None) -> None:
    """`page_path` at 1280 px, every chart drawn: the full page, or from `selector`'s first match to its last."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(page_path.as_uri())
        page.wait_for_function("Array.from(document.querySelectorAll('div.rlbench-chart'))"
                               ".every(d => d.querySelector('.main-svg') !== null)", timeout=120_000)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 1280:
            raise SystemExit(f"{page_path}: {width} px wide at a 1280 px window (horizontal scrolling)")
        if selector is None:
            page.screenshot(path=str(png), full_page=True)
        else:
            box = page.evaluate(
                "(sel) => { const els = Array.from(document.querySelectorAll(sel));"
                " const r = els.map(e => e.getBoundingClientRect());"
                " const top = Math.min(...r.map(b => b.top)) + window.scrollY;"
                " const bottom = Math.max(...r.map(b => b.bottom)) + window.scrollY;"
                " return {x: 0, y: top - 8, width: 1280, height: bottom - top + 16}; }", selector)
            page.screenshot(path=str(png), full_page=True, clip=box)
        browser.close()
    if errors:
        raise SystemExit(f"{page_path}: errors in the page: {errors}")
    print(f"{png} ({png.stat().st_size // 1024} KiB)")


def compare_page(work: Path) -> Path:
    from rlbench.cli import main

    runs = ROOT / "reports/sm90/async_static"
    sides = {"r768": ["r768_seed0", "r768_seed1"], "r512": ["r512_seed0"]}
    for name, seeds in sides.items():
        (work / name).mkdir()
        for s in seeds:
            (work / name / s).symlink_to(runs / s, target_is_directory=True)
    out = work / "compare.html"
    rc = main(["compare", str(work / "r768"), str(work / "r512"), "--suite",
               "verl_dapo_qwen25_math_7b_fully_async_gfx942", "--profile", "mini", "--arch", "sm_90",
               "--device", "H200", "--out", str(out)])
    if rc != 0:
        raise SystemExit(f"rlbench compare exited {rc}")
    return out


def trend_page(work: Path, n: int = 12) -> Path:
    from rlbench.cli import main
    from rlbench.ingest.load import load_metrics
    from rlbench.run.record import record_outcome
    from rlbench.run.runner import evaluate_runs, find_suite
    from rlbench.store.target import StoreTarget

    db = work / "results.sqlite"
    suite = find_suite(SUITE)
    frame = load_metrics(LOG).frame
    for k in range(n):
        target = StoreTarget(path=db, trusted=(k + 1) % 4 != 0, source="check")
        outcome = evaluate_runs(suite, "cpu", {0: {"colocated": frame.drop(index=k + 5)}}, arch="cpu", device_name="",
                                folder=work / f"history{k + 1}", env={"arch": "cpu"},
                                provenance={"logs": {"colocated": f"{LOG} without step {k + 5}"}},
                                status=lambda line: None, store=db)
        record_outcome(target, outcome)
    rc = main(["check", str(LOG), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu", "--out",
               str(work / "check"), "--store", str(db)])
    if rc not in (0, 1):
        raise SystemExit(f"rlbench check exited {rc}")
    return work / "check" / "report.html"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, removed)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports", help="where the PNGs go (default reports/)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="rlbench-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        (work / "compare").mkdir(exist_ok=True)
        screenshot(compare_page(work / "compare"), args.out / "compare_screenshot.png")
        (work / "trends").mkdir(exist_ok=True)
        screenshot(trend_page(work / "trends"), args.out / "trend_screenshot.png",
                   selector="h3.trends-head, .trends")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
