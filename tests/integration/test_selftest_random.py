"""`rlbench selftest --random` end to end on two mutants (slow tier; `make selftest-random` runs 40)."""

from __future__ import annotations

import json
import random

import pytest

from rlbench.run.runner import find_suite
from rlbench.selftest.random_mutants import enumerate_mutants, run_random

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_random_selftest_scores_its_draw(tmp_path):
    result = run_random(find_suite("verl_grpo_qwen3_8b_sglang_gfx950"), "cpu", num=2, seed=3, work=tmp_path / "work",
                        out=tmp_path / "out", status=lambda line: None)
    s = result["summary"]
    assert s["mutants"] == 2 and s["killed"] + s["equivalent"] + s["survived"] == 2
    assert {m["status"] for m in result["mutants"]} <= {"killed", "killed-crash", "killed-timeout", "equivalent",
                                                         "survived"}
    saved = json.loads((tmp_path / "out" / "verl_grpo_qwen3_8b_sglang_gfx950.cpu.random2.seed3.json").read_text())
    assert saved["seed"] == 3 and [m["id"] for m in saved["mutants"]] == [m["id"] for m in result["mutants"]]
    # the same seed draws the same mutants
    assert [m.id for m in random.Random(3).sample(enumerate_mutants(), 2)] == [m["id"] for m in result["mutants"]]
