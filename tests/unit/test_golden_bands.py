"""Golden band rules (rlbench/checks/golden.py): the prediction band holds its stated false-alarm rate, the
implied rate inverts it, a file re-banded from its per-seed values keeps them and names its rule, and a file
extended by new seeds keeps its seeds only when a witness seed still reproduces them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.checks import bands
from rlbench.checks.golden import band_tolerance, extend_golden, implied_false_alarm, reband
from rlbench.run.runner import find_suite
from trainer.errors import ConfigError, DataError

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


def _frames(first: float, last: float, length: float) -> dict[str, pd.DataFrame]:
    """A GRPO cpu-profile run (8 steps) whose golden statistics are `first` / `last` (4-step means of the
    score) and `length` (the mean response length)."""
    score = [first] * 4 + [last] * 4
    return {"colocated": pd.DataFrame({"critic/score/mean": score, "response_length/mean": [length] * 8},
                                      index=pd.Index(range(1, 9), name="step"))}


def _witness_frames(doc: dict, drift_of_band: float = 0.0) -> dict[str, pd.DataFrame]:
    v = {k.split(":", 2)[2]: e for k, e in doc["values"].items()}
    first, last, length = (v[k]["per_seed"][0] for k in ("mean_first[4]", "mean_last[4]", "mean"))
    return _frames(first + drift_of_band * v["mean_first[4]"]["tol"], last, length)


def test_extend_adds_seeds_after_a_witness_matches_and_refuses_a_moved_code_path(tmp_path: Path):
    """--extend keeps the recorded seeds, appends the new ones, re-derives every band over all of them, and keeps
    both recordings' provenance; a witness 5% of a band away from its recorded value (a changed code path)
    writes nothing and says so."""
    suite = find_suite("verl_grpo_qwen3_8b_sglang_gfx950")
    path = tmp_path / "verl_grpo_qwen3_8b_sglang_gfx950.cpu.cpu.json"
    shutil.copy(GOLDEN / path.name, path)
    before = json.loads(path.read_text())
    text = path.read_text()
    with pytest.raises(DataError, match=r"witness seed 0 colocated:critic/score/mean:mean_first\[4\] = .* 5\.0% of "
                                        r"the band's half-width, over 1%; the code path changed since, or the run "
                                        r"does not reproduce itself"):
        extend_golden(path, suite, "cpu", (0, _witness_frames(before, 0.05)), {5: _frames(0.5, 0.7, 13.0)},
                      {"commit": "new"}, band="prediction")
    assert path.read_text() == text
    with pytest.raises(DataError, match=r"seeds \[4\] are recorded already"):
        extend_golden(path, suite, "cpu", (0, _witness_frames(before)), {4: _frames(0.5, 0.7, 13.0)},
                      {"commit": "new"}, band="prediction")
    new = {5: _frames(0.5, 0.7, 13.0), 6: _frames(0.4, 0.8, 14.0)}
    doc = extend_golden(path, suite, "cpu", (0, _witness_frames(before, 0.005)), new, {"commit": "new"},
                        band="prediction", false_alarm=0.05)
    assert doc == json.loads(path.read_text()) and doc["num_seeds"] == 7
    assert doc["provenance"]["seeds"] == [0, 1, 2, 3, 4, 5, 6]
    first, second = doc["provenance"]["recordings"]
    assert first["commit"] == before["provenance"]["commit"] and second["seeds"] == [5, 6]
    assert second["witness_seed"] == 0 and second["witness_max_drift_of_band"] == pytest.approx(0.005)
    e = doc["values"]["colocated:critic/score/mean:mean_last[4]"]
    assert e["per_seed"] == before["values"]["colocated:critic/score/mean:mean_last[4]"]["per_seed"] + [0.7, 0.8]
    assert e["mean"] == pytest.approx(np.mean(e["per_seed"]))
    assert e["tol"] == pytest.approx(band_tolerance(e["per_seed"], "prediction", num_stats=3, false_alarm=0.05))
