"""The whole colocated loop on a tiny random-init Qwen2: GRPO, DAPO and PPO with a critic."""

from __future__ import annotations

import math

import pytest

from trainer.api import train
from trainer.components.metrics import read_metrics

pytestmark = pytest.mark.integration

VARIANTS = {
    "grpo": {},
    "drgrpo": {"algorithm": {"norm_adv_by_std_in_grpo": False}, "actor": {"loss_agg_mode": "seq-mean-token-sum-norm"}},
    "dapo": {"algorithm": {"name": "dapo", "dynamic_sampling": True, "max_num_gen_batches": 3,
                           "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0}},
             "actor": {"clip_ratio_high": 0.28, "loss_agg_mode": "token-mean"}},
    "ppo": {"algorithm": {"name": "ppo", "adv_estimator": "gae", "gamma": 1.0, "lam": 0.95},
            "critic": {"enable": True, "lr": 1e-3}, "actor": {"ppo_epochs": 2}},
    "grpo_kl_tis": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.01, "kl_loss_type": "low_var_kl",
                              "tis_cap": 2.0, "entropy_coeff": 0.001}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_loop_runs_and_logs_verl_metrics(make_config, variant):
    cfg = make_config(**VARIANTS[variant])
    lines = read_metrics(train(cfg))
    steps = [ln["step"] for ln in lines]
    assert steps == [0, 1, 2, 3]  # validation before training, then one line per step
    assert "val-core/synthetic/arithmetic/acc/mean@1" in lines[0]["data"]
    for ln in lines[1:]:
        d = ln["data"]
        for key in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/entropy", "actor/grad_norm", "critic/score/mean",
                    "response_length/mean", "response_length/clip_ratio", "timing_s/gen", "timing_s/update_actor",
                    "timing_s/step", "perf/throughput", "training/rollout_probs_diff_mean",
                    "training/rollout_probs_diff_max"):
            assert key in d, f"{variant}: {key} missing at step {ln['step']}"
            assert isinstance(d[key], (int, float)) and math.isfinite(d[key]), (variant, key, d[key])
        assert d["response_length/mean"] <= cfg.data.max_response_length
    if variant == "ppo":
        assert "critic/vf_loss" in lines[1]["data"] and "critic/values/mean" in lines[1]["data"]
    if variant == "dapo":
        assert 1 <= lines[1]["data"]["train/num_gen_batches"] <= 3
    if variant == "grpo_kl_tis":
        assert "actor/kl_loss" in lines[1]["data"] and "actor/tis_weight_mean" in lines[1]["data"]
    assert "val-core/synthetic/arithmetic/acc/mean@1" in lines[2]["data"]  # test_freq=2


def test_on_policy_first_minibatch_in_fp32(make_config):
    """Two mini-batches force a separate old-log-prob pass; the first mini-batch must be exactly on-policy."""
    cfg = make_config(actor={"ppo_mini_batch_size": 2}, trainer={"total_steps": 2, "test_freq": 0})
    lines = read_metrics(train(cfg))
    for ln in lines:
        d = ln["data"]
        assert abs(d["actor/ppo_kl_first_minibatch"]) <= 1e-6
        assert d["actor/pg_clipfrac_first_minibatch"] == 0.0
        # rollout (hf engine, fp32) and trainer agree to float rounding
        assert d["training/rollout_probs_diff_max"] < 1e-4


def test_update_moves_the_policy(make_config):
    """After the first optimizer step the policy differs from the one that sampled, so the second mini-batch
    is off-policy: the recomputed old log-probs are really used (an entropy bonus guarantees a gradient even
    when a random tiny model earns no reward)."""
    cfg = make_config(actor={"ppo_mini_batch_size": 2, "lr": 5e-3, "entropy_coeff": 0.01},
                      trainer={"total_steps": 2, "test_freq": 0})
    lines = read_metrics(train(cfg))
    assert any(abs(ln["data"]["actor/ppo_kl"]) > 1e-7 for ln in lines)
