"""Golden values: record over seeds with a known spread, then check runs against them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.checks.evaluate import evaluate
from rlbench.checks.golden import golden_path, record_golden
from rlbench.suites.suite import Suite
from trainer.errors import ConfigError, DataError


def make_suite(golden_stats: list[dict] | None = None) -> Suite:
    refs: list[dict] = [{"metric": "critic/score/mean", "stat": "final", "op": ">=", "value": 0.0,
                         "profiles": ["cpu"], "source": "rlbench: x", "why": "y"}]
    if golden_stats is not None:
        refs.append({"kind": "golden", "profiles": ["cpu"], "stats": golden_stats,
                     "source": "rlbench: golden", "why": "3x seed spread"})
    prof = {"modes": ["colocated"], "steps": 4}
    return Suite.model_validate({
        "id": "toy", "title": "t", "description": "d", "source": [{"doc": "d.txt", "where": "w"}],
        "published_on": {"arch": "gfx942", "device": "MI300X", "gpus": 8}, "trainer": {},
        "modes": {"colocated": {"gpus": 1}}, "profiles": {"full": prof, "mini": prof, "cpu": prof},
        "references": refs,
    })


def run(score: list[float], length: list[float]) -> dict[str, pd.DataFrame]:
    idx = pd.Index(range(1, len(score) + 1), name="step")
    return {"colocated": pd.DataFrame({"critic/score/mean": score, "response_length/mean": length}, index=idx)}


STATS = [{"metric": "critic/score/mean", "stat": "mean_last", "n": 2},
         {"metric": "response_length/mean", "stat": "mean"}]
# mean_last[2] per seed: 0.5, 0.6, 0.7 -> mean 0.6, spread 0.1, tol 0.3
# response_length mean per seed: 10, 10, 10 -> spread 0, tol = floor 0.01 * 10 = 0.1
SEEDS = [run([0.1, 0.2, 0.4, 0.6], [10, 10, 10, 10]),
         run([0.1, 0.3, 0.5, 0.7], [8, 12, 10, 10]),
         run([0.2, 0.3, 0.6, 0.8], [10, 10, 9, 11])]
PROV = {"machine": "ci-2core", "torch": "2.13.0", "commit": "abc1234def5678", "date": "2026-11-30", "seeds": [0, 1, 2]}


def test_record_then_check_roundtrip(tmp_path: Path) -> None:
    suite = make_suite(STATS)
    path = record_golden(suite, "cpu", "cpu", SEEDS, PROV, tmp_path)
    assert path == tmp_path / "toy.cpu.cpu.json" == golden_path(suite, "cpu", "cpu", tmp_path)
    doc = json.loads(path.read_text())
    assert doc["provenance"] == PROV and doc["num_seeds"] == 3 and doc["safety_factor"] == 3.0
    score = doc["values"]["colocated:critic/score/mean:mean_last[2]"]
    assert score["per_seed"] == pytest.approx([0.5, 0.6, 0.7])
    assert (score["mean"], score["spread"], score["tol"]) == pytest.approx((0.6, 0.1, 0.3))
    length = doc["values"]["colocated:response_length/mean:mean"]
    assert (length["mean"], length["spread"], length["tol"]) == pytest.approx((10.0, 0.0, 0.1))

    res = [r for r in evaluate(suite, "cpu", SEEDS[1], arch="cpu", device_name="cpu", golden_dir=tmp_path)
           if r.scope == "golden"]
    assert [(r.check_id, r.verdict) for r in res] == [
        ("golden:colocated:critic/score/mean:mean_last[2]", "pass"),
        ("golden:colocated:response_length/mean:mean", "pass")]
    assert res[0].ref_band == pytest.approx((0.3, 0.9)) and "toy.cpu.cpu.json (3 seeds, commit abc1234def" in res[0].source

    # 0.95 is outside 0.6 +- 0.3; length 10.2 is outside 10 +- 0.1
    bad = run([0.1, 0.2, 0.9, 1.0], [10.2, 10.2, 10.2, 10.2])
    res = [r for r in evaluate(suite, "cpu", bad, arch="cpu", device_name="cpu", golden_dir=tmp_path)
           if r.scope == "golden"]
    assert [r.verdict for r in res] == ["fail", "fail"]
    assert "mean_last[2] over steps 3-4 = 0.950" in res[0].message and "expected 0.600 +- 0.300" in res[0].message


def test_absent_golden_file_skips_with_how_to_record(tmp_path: Path) -> None:
    suite = make_suite(STATS)
    res = [r for r in evaluate(suite, "cpu", SEEDS[0], arch="gfx950", device_name="MI355X", golden_dir=tmp_path)
           if r.scope == "golden"]
    assert len(res) == 1 and res[0].verdict == "skip"
    assert "no golden values recorded for arch gfx950; record with `rlbench golden" in res[0].message
    # golden references of another profile skip for the profile reason
    res = [r for r in evaluate(suite, "full", SEEDS[0], arch="gfx950", device_name="MI355X", golden_dir=tmp_path)
           if r.scope == "golden"]
    assert res[0].verdict == "skip" and "applies to profile cpu" in res[0].message


def test_golden_file_per_arch(tmp_path: Path) -> None:
    suite = make_suite(STATS)
    record_golden(suite, "cpu", "gfx942", SEEDS, PROV, tmp_path)
    on_942 = [r.verdict for r in evaluate(suite, "cpu", SEEDS[0], arch="gfx942", device_name="MI300X",
                                          golden_dir=tmp_path) if r.scope == "golden"]
    on_950 = [r.verdict for r in evaluate(suite, "cpu", SEEDS[0], arch="gfx950", device_name="MI355X",
                                          golden_dir=tmp_path) if r.scope == "golden"]
    assert on_942 == ["pass", "pass"] and on_950 == ["skip"]


def test_single_seed_gets_the_floor_and_safety_factor_is_used(tmp_path: Path) -> None:
    suite = make_suite([{"metric": "critic/score/mean", "stat": "final"}])
    doc = json.loads(record_golden(suite, "cpu", "cpu", SEEDS[:1], PROV, tmp_path).read_text())
    entry = doc["values"]["colocated:critic/score/mean:final"]
    assert (entry["mean"], entry["tol"]) == pytest.approx((0.6, 0.006))  # 1% of |0.6|
    zero = make_suite([{"metric": "critic/score/mean", "stat": "first"}])
    flat = [run([0.0, 1.0], [1, 1])] * 2
    doc = json.loads(record_golden(zero, "cpu", "cpu", flat, PROV, tmp_path, floor_abs=1e-3).read_text())
    assert doc["values"]["colocated:critic/score/mean:first"]["tol"] == pytest.approx(1e-3)
    doc = json.loads(record_golden(suite, "cpu", "cpu", SEEDS, PROV, tmp_path, safety_factor=2.0).read_text())
    # final per seed 0.6, 0.7, 0.8 -> spread 0.1 -> tol 0.2
    assert doc["values"]["colocated:critic/score/mean:final"]["tol"] == pytest.approx(0.2)


def test_record_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no 'golden' reference for profile cpu"):
        record_golden(make_suite(None), "cpu", "cpu", SEEDS, PROV, tmp_path)
    suite = make_suite([{"metric": "critic/score/maen", "stat": "final"}])
    with pytest.raises(DataError, match=r"seed #0: metric critic/score/maen not in run 'colocated' "
                                        r"\(nearest: critic/score/mean"):
        record_golden(suite, "cpu", "cpu", SEEDS, PROV, tmp_path)
    with pytest.raises(DataError, match="no runs given"):
        record_golden(make_suite(STATS), "cpu", "cpu", [], PROV, tmp_path)


def test_stale_golden_file_errors_on_missing_stat(tmp_path: Path) -> None:
    record_golden(make_suite(STATS[:1]), "cpu", "cpu", SEEDS, PROV, tmp_path)
    res = [r for r in evaluate(make_suite(STATS), "cpu", SEEDS[0], arch="cpu", device_name="cpu",
                               golden_dir=tmp_path) if r.scope == "golden"]
    assert [r.verdict for r in res] == ["pass", "error"]
    assert "has no value for colocated:response_length/mean:mean; re-record" in res[1].message
    assert np.isfinite(res[0].actual)
