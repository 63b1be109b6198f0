"""Golden band rules (rlbench/checks/golden.py): the prediction band holds its stated false-alarm rate, the
implied rate inverts it, and a file re-banded from its per-seed values keeps them and names its rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rlbench.checks import bands
from rlbench.checks.golden import band_tolerance, implied_false_alarm, reband
from trainer.errors import ConfigError

GOLDEN = Path(__file__).resolve().parents[2] / "reports" / "golden"


@pytest.mark.parametrize(("seeds", "rate"), [(3, 0.1), (5, 0.05), (10, 0.02)])
def test_prediction_band_holds_its_false_alarm_rate(seeds: int, rate: float):
    """200,000 simulated histories of `seeds` normal seeds: a new clean run falls outside the band at the stated
    rate, within 4 binomial standard errors (0.27, 0.20 and 0.13 points)."""
    rng = np.random.default_rng(0)
    draws = rng.normal(3.0, 0.7, size=(200_000, seeds + 1))
    hist, new = draws[:, :-1], draws[:, -1]
    # the band is a fixed multiple of the seeds' sample std: take it from band_tolerance, check it on 50 histories
    k = band_tolerance([0.0, 1.0] + [0.5] * (seeds - 2), "prediction", num_stats=1, false_alarm=rate,
                       floor_abs=0.0, floor_rel=0.0) / np.std([0.0, 1.0] + [0.5] * (seeds - 2), ddof=1)
    tol = k * hist.std(axis=1, ddof=1)
    for h, t in zip(hist[:50], tol[:50]):
        assert band_tolerance(h, "prediction", num_stats=1, false_alarm=rate, floor_abs=0.0, floor_rel=0.0) == \
            pytest.approx(t, rel=1e-9)
    outside = np.abs(new - hist.mean(axis=1)) > tol
    assert outside.mean() == pytest.approx(rate, abs=4 * np.sqrt(rate * (1 - rate) / len(draws)))


def test_implied_false_alarm_inverts_the_prediction_band():
    x = [0.42, 0.41, 0.53, 0.49, 0.50]
    for rate in (0.01, 0.05, 0.2):
        tol = band_tolerance(x, "prediction", num_stats=1, false_alarm=rate, floor_abs=0.0, floor_rel=0.0)
        assert implied_false_alarm(x, tol) == pytest.approx(rate, rel=1e-6)
    # K statistics share the file's rate (Bonferroni): each band is wider than one alone would be
    assert band_tolerance(x, "prediction", num_stats=6) > band_tolerance(x, "prediction", num_stats=1)
    assert implied_false_alarm([1.0, 1.0], 0.1) == 0.0 and np.isnan(implied_false_alarm([1.0], 0.1))


def test_reband_keeps_the_seeds_and_names_the_rule(tmp_path: Path):
    path = tmp_path / "g.json"
    shutil.copy(GOLDEN / "verl_grpo_qwen3_8b_sglang_gfx950.cpu.cpu.json", path)
    before = json.loads(path.read_text())["values"]
    doc = reband(path, "prediction", false_alarm=0.05)
    assert doc["band"] == {"rule": "prediction", "false_alarm": 0.05} and json.loads(path.read_text()) == doc
    for key, e in doc["values"].items():
        assert e["per_seed"] == before[key]["per_seed"] and e["tol_before"] == before[key]["tol"]
        assert implied_false_alarm(e["per_seed"], e["tol"]) == pytest.approx(0.05 / len(before), rel=1e-6)


def test_bad_band_settings_name_the_fix():
    with pytest.raises(ConfigError, match=r"^band='mad': not a band rule \(fix: one of max_dev, prediction\)"):
        band_tolerance([1.0, 2.0], "mad", num_stats=1)
    with pytest.raises(ConfigError, match=r"^false_alarm=5.0: a probability"):
        band_tolerance([1.0, 2.0], "prediction", num_stats=1, false_alarm=5.0)


def test_bands_table_lists_every_recorded_statistic():
    text = bands.table(GOLDEN, 0.05)
    rows = [ln for ln in text.splitlines() if ln.count(" | `") == 1]  # one row per statistic
    want = sum(len(json.loads(p.read_text())["values"]) for p in GOLDEN.glob("*.json"))
    assert len(rows) == want > 0
