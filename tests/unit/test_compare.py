"""`rlbench compare` (rlbench/report/compare.py) on real logs: two seed sets of the DAPO suite's mini profile
run on 2x H200 (reports/sm90/async_static: max response 768, seeds 0 and 1, against 512, seed 0).

    pytest tests/unit/test_compare.py -q
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rlbench.cli import main
from rlbench.report.compare import welch_interval

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "reports/sm90/async_static"
ARGS = ["--suite", "verl_dapo_qwen25_math_7b_fully_async_gfx942", "--profile", "mini", "--arch", "sm_90",
        "--device", "H200"]


def seed_set(tmp_path: Path, name: str, runs: list[str]) -> Path:
    d = tmp_path / name
    d.mkdir()
    for r in runs:
        (d / r).symlink_to(RUNS / r, target_is_directory=True)
    return d


def test_two_seed_sets_of_real_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = seed_set(tmp_path, "r768", ["r768_seed0", "r768_seed1"])
    b = seed_set(tmp_path, "r512", ["r512_seed0"])
    out = tmp_path / "compare.html"
    assert main(["compare", str(a), str(b), *ARGS, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "A: r768 (2 run(s): r768_seed0, r768_seed1)" in text
    # both verdicts per check: the learning check fails on every run of both sides (8 steps at mini scale)
    assert "critic/score/mean:delta>=0.1@colocated\n    A fail 2/2" in text and "| B fail 1/1" in text
    # throughput as a ratio of the medians (the md's table: 512 tokens runs faster than 768)
    line = next(ln for ln in text.splitlines() if ln.startswith("perf/throughput:median@colocated"))
    ratio = float(text.split(line)[1].split("B/A = ")[1].split("x")[0])
    assert 1.2 < ratio < 1.5
    assert "no interval: 2 and 1 seeds" in text
    page = out.read_text()
    assert page.count('class="rlbench-chart"') >= 3 and "A: r768_seed1 \\u002f fully_async" in page


def test_same_seeds_on_both_sides_give_an_interval_around_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = seed_set(tmp_path, "a", ["r768_seed0", "r768_seed1"])
    b = seed_set(tmp_path, "b", ["r768_seed1", "r768_seed0"])
    assert main(["compare", str(a), str(b), *ARGS, "--out", str(tmp_path / "c.html")]) == 0
    text = capsys.readouterr().out
    line = text.split("critic/score/mean:delta>=0.1@fully_async\n")[1].splitlines()[0]
    assert "B-A = +0, 95% Welch interval [-" in line, line


def test_welch_interval_is_scipys() -> None:
    a, b = [0.25, 0.27, 0.22], [0.31, 0.29]
    lo, hi = welch_interval(a, b)
    d = np.mean(b) - np.mean(a)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 2
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 1)
    half = stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    assert (lo, hi) == pytest.approx((d - half, d + half))
    assert welch_interval([1.0], [1.0, 2.0]) is None


def test_a_folder_without_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), str(RUNS / "r512_seed0"), *ARGS]) == 2
    assert "no checks.json and no <mode>.jsonl" in capsys.readouterr().err
    assert main(["compare", str(RUNS / "r512_seed0"), str(RUNS / "r768_seed0")]) == 2
    assert "give --suite and --profile" in capsys.readouterr().err


def test_two_boards_each_checked_against_its_own_references(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The DAPO suite's full profile states step times for MI300X (gfx942) and for the upstream H20 run (sm_90):
    with --arch-b/--device-b each side's logs meet their own board's references. Logs generated here."""
    import json

    for side, steps in (("mi300x", {"colocated": 394.0, "fully_async": 219.0}),
                        ("h20", {"colocated": 790.0, "fully_async": 450.0})):
        (tmp_path / side).mkdir()
        for mode, step_s in steps.items():
            rows = [{"step": s, "data": {"timing_s/step": step_s, "perf/throughput": 1e5 / step_s}} for s in range(1, 65)]
            (tmp_path / side / f"{mode}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--suite", "verl_dapo_qwen25_math_7b_fully_async_gfx942", "--profile", "full", "--arch", "gfx942",
            "--device", "MI300X", "--arch-b", "sm_90", "--device-b", "H20", "--out", str(tmp_path / "c.html")]
    assert main(["compare", str(tmp_path / "mi300x"), str(tmp_path / "h20"), *args]) == 0
    text = capsys.readouterr().out
    assert "A: mi300x (1 run(s): mi300x); checked as arch gfx942, device MI300X" in text
    assert "B: h20 (1 run(s): h20); checked as arch sm_90, device H20" in text
    mi300x = text.split("timing_s/step:median[1:64]~=394@colocated\n")[1].splitlines()[0]
    h20 = text.split("timing_s/step:mean~=790.1@colocated\n")[1].splitlines()[0]
    assert mi300x.startswith("    A pass 1/1") and "not evaluated on B" in mi300x, mi300x
    assert "| B pass 1/1" in h20 and "not evaluated on A" in h20, h20
    assert "timing_s/step:mean~=294.77@fully_async\n    A - (mean -) | B fail 1/1" in text  # 450 s vs H20's 294.77
    line = text.split("perf/throughput:median@colocated\n")[1].splitlines()[0]
    assert "B/A = 0.499x" in line
    assert main(["compare", str(tmp_path / "mi300x"), str(tmp_path / "h20"), "--arch-b", "sm_90"]) == 2
    assert "--arch-b/--device-b given without --suite" in capsys.readouterr().err
