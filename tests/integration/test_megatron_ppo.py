"""PPO (GAE, critic) with `actor.strategy: megatron` through the single-process colocated loop: the policy is a
`MegatronActor`, the value model a `MegatronCritic` (trainer/backends/megatron/critic.py). Two steps run;
the critic's metrics are logged and finite, it trains (non-zero loss and gradient, step 2's values come from
the updated value model); slow tier: a run stopped after step 1's checkpoint and resumed logs what the
uninterrupted run logs (the critic's weights and AdamW state resumed), and on 2 Ray trainer workers TP=2
equals DP=2 and resumes. Needs megatron-core + mbridge."""

from __future__ import annotations

import math

import pytest

from tests.helpers.configs import tiny_config
from trainer.api import train
from trainer.backends.strategy import megatron_missing
from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(megatron_missing() is not None,
                                 reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")]

SECTIONS = {"model": {"path": "tiny:qwen3"}, "algorithm": {"name": "ppo", "adv_estimator": "gae", "gamma": 1.0,
                                                         "lam": 0.95},
            "critic": {"enable": True, "lr": 1e-3}, "actor": {"strategy": "megatron", "ppo_mini_batch_size": 2},
            "trainer": {"total_steps": 2, "test_freq": 0, "save_freq": 1}}


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


def test_megatron_ppo_with_critic_trains(tmp_path):
    full = read_metrics(train(load_config(tiny_config(str(tmp_path / "full"), **SECTIONS))))
    assert [ln["step"] for ln in full] == [1, 2]
    for ln in full:
        d = ln["data"]
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean",
                    "critic/returns/mean", "critic/advantages/mean", "timing_s/update_critic", "actor/pg_loss"):
            assert key in d and math.isfinite(d[key]), (ln["step"], key)
        assert d["critic/vf_loss"] > 0 and d["critic/grad_norm"] > 0 and d["actor/grad_norm"] > 0
    assert full[0]["data"]["critic/values/mean"] != full[1]["data"]["critic/values/mean"]


@pytest.mark.slow  # three runs (~25 s); the checkpoint's critic state is the plain one, as the FSDP2 critic's
def test_megatron_ppo_with_critic_resumes(tmp_path):
    full = read_metrics(train(load_config(tiny_config(str(tmp_path / "full"), **SECTIONS))))
    part = str(tmp_path / "part")
    train(load_config(tiny_config(part, **SECTIONS), ["trainer.total_steps=1"]))  # "killed" after step 1
    resumed = read_metrics(train(load_config(tiny_config(part, **SECTIONS))))
    assert [ln["step"] for ln in resumed] == [ln["step"] for ln in full] == [1, 2]
    for a, b in zip(full, resumed):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys()
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)


@pytest.mark.slow  # four 2-worker Ray runs (~2 min on 2 busy cores)
def test_ray_megatron_ppo_tp2_equals_dp2_and_resumes(tmp_path):
    """On 2 Ray trainer workers the critic is built in the actor's parallel groups: TP=2 (DP=1; both ranks the whole
    batch, the value head replicated) logs the numbers of TP=1 (DP=2; each rank half of every mini-batch), critic/*
    included (every worker samples its prompts with the same engine seed in both layouts, so the runs compare);
    a TP=2 run stopped after step 1's checkpoint (`critic.pt`: each rank's own state) and resumed logs the same."""
    pytest.importorskip("ray")
    from trainer.components.checkpoint import latest_checkpoint

    def run(out: str, *extra: str) -> list[dict]:
        return read_metrics(train(load_config(tiny_config(str(tmp_path / out), **SECTIONS), [
            "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.num_threads=1", *extra])))

    tp2 = run("tp2", "actor.megatron.tensor_model_parallel_size=2")
    dp2 = run("dp2")
    assert [ln["step"] for ln in tp2] == [ln["step"] for ln in dp2] == [1, 2]
    ckpt = latest_checkpoint(tmp_path / "tp2")
    assert ckpt is not None and (ckpt / "critic.pt").is_file()
    for a, b in zip(tp2, dp2):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys() and "critic/vf_loss" in na
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-4, abs=2e-6), (a["step"], k, na[k], nb[k])
    run("part", "actor.megatron.tensor_model_parallel_size=2", "trainer.total_steps=1")  # "killed" after step 1
    resumed = run("part", "actor.megatron.tensor_model_parallel_size=2")
    assert [ln["step"] for ln in resumed] == [1, 2]
    for a, b in zip(tp2, resumed):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys()
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)
