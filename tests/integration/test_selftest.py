"""The selftest's fast subset: three planted bugs and one clean run on the tiny model (about a minute).

Runs in `make test` (integration marker). The whole set on SmolLM2 is `make selftest`.
"""

from __future__ import annotations

import json

import pytest

from rlbench.run.runner import find_suite
from rlbench.selftest.run import DEFAULT_SUITE, exit_code, run_selftest

pytestmark = pytest.mark.integration

FAST = ["weights_never_synced", "response_mask_shifted", "trainer_logprobs_ignore_temperature"]


def test_fast_subset_catches_each_mutation_without_false_alarms(tmp_path):
    result = run_selftest(find_suite(DEFAULT_SUITE), "cpu", mutations=FAST, clean_seeds=[5], tiny=True, steps=2,
                          work=tmp_path / "work", out=tmp_path / "out",
                          status=lambda line: None)
    by_name = {r["mutation"]: r for r in result["mutations"]}
    assert set(by_name) == set(FAST)
    assert not any(r["crashed"] for r in result["mutations"]), [r["crashed"] for r in result["mutations"]]
    assert "training/weight_sync_max_abs_diff" in " ".join(by_name["weights_never_synced"]["caught_by"])
    assert "training/rollout_probs_diff_max" in " ".join(by_name["response_mask_shifted"]["caught_by"])
    assert "training/rollout_probs_diff_max" in " ".join(by_name["trainer_logprobs_ignore_temperature"]["caught_by"])
    clean = result["clean"][0]
    assert clean["crashed"] is None and clean["checks"] >= 5 and clean["false_alarms"] == []
    assert exit_code(result) == 0
    written = json.loads((tmp_path / "out" / f"{DEFAULT_SUITE}.cpu.2steps.tiny.json").read_text())
    assert written["summary"] == result["summary"]
    assert "| weights_never_synced | sync |" in (tmp_path / "out" / f"{DEFAULT_SUITE}.cpu.2steps.tiny.md").read_text()
