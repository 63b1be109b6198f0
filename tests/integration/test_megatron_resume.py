"""`actor.strategy: megatron` through the colocated loop: it trains, and a run stopped after a
checkpoint and resumed logs exactly what an uninterrupted run logs (qwen2; qwen3_moe with the router
load-balancing loss 0.01 and the actor/moe/* metrics). Needs megatron-core + mbridge."""

from __future__ import annotations

import pytest

from tests.helpers.configs import tiny_config
from trainer.api import train
from trainer.backends.strategy import megatron_missing
from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(megatron_missing() is not None,
                                 reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")]


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


@pytest.mark.parametrize("arch", ["qwen2", "qwen3_moe"])
def test_megatron_resume_reproduces_uninterrupted_run(tmp_path, arch):
    sections = {"model": {"path": f"tiny:{arch}"}, "trainer": {"total_steps": 4, "save_freq": 2, "test_freq": 2},
                "actor": {"ppo_mini_batch_size": 2, "strategy": "megatron",
                          "entropy_coeff": 0.01,  # a gradient even when every reward is equal
                          "moe_aux_loss_coeff": 0.01 if "moe" in arch else 0.0}}  # megatron's aux loss, actor/moe/*
    full = read_metrics(train(load_config(tiny_config(str(tmp_path / "full"), **sections))))
    part_dir = str(tmp_path / "part")
    train(load_config(tiny_config(part_dir, **sections), ["trainer.total_steps=2"]))  # "killed" after step 2
    resumed = read_metrics(train(load_config(tiny_config(part_dir, **sections))))
    assert [ln["step"] for ln in resumed] == [0, 1, 2, 3, 4]
    assert all(ln["data"]["actor/grad_norm"] > 0 for ln in full if ln["step"] > 0)  # optimizer state matters
    if "moe" in arch:  # the router statistics of the Megatron path are logged (and resume like the rest)
        assert "actor/moe/load_balancing_loss" in full[-1]["data"]
    for a, b in zip(full, resumed):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys()
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)
