"""The colocated loop through Ray workers: 2 CPU trainer workers (FSDP2 over gloo), each with an engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config
from trainer.errors import ConfigError

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")


def test_two_worker_colocated_run_writes_every_step(tmp_path: Path):
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.total_steps=2", "trainer.test_freq=2", "data.num_val_samples=6"])
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    assert sorted(rows) == [0, 1, 2]
    assert "val-core/synthetic/arithmetic/acc/mean@1" in rows[0] and "val-core/synthetic/arithmetic/acc/mean@1" in rows[2]
    for step in (1, 2):
        m = rows[step]
        assert math.isfinite(m["actor/grad_norm"]) and m["timing_s/update_weights"] > 0
        # 4 prompts x n=4 from both workers' engines are in the batch
        assert m["perf/throughput"] == pytest.approx(m["perf/total_num_tokens"] / (m["perf/time_per_step"] * 2))
        # old log-probs are the update forward's own (one mini-batch): the mismatch is rollout vs trainer numerics
        assert m["training/rollout_probs_diff_max"] < 1e-3


def test_static_engine_on_two_workers_follows_the_weight_updates(tmp_path: Path):
    """Each worker's static engine gets the updated weights in place (fused Q/K/V and gate/up included):
    at step 2 the rollout log-probs still match the trainer's to float32 numerics."""
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.total_steps=2", "trainer.test_freq=0", "rollout.engine=static",
        "actor.lr=0.01", "actor.entropy_coeff=0.1"])  # entropy: a gradient even when every reward is 0
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    assert sorted(rows) == [1, 2]
    assert rows[1]["actor/grad_norm"] > 0
    for step in (1, 2):
        assert rows[step]["training/rollout_probs_diff_max"] < 1e-3
    facts = json.loads((tmp_path / "engine.json").read_text())
    assert [f["engine"] for f in facts] == ["static", "static"]


def test_critic_in_fully_async_mode_is_refused_with_a_one_line_error(tmp_path: Path):
    from trainer.modes.fully_async import train_fully_async

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.mode=fully_async", "algorithm.name=ppo", "algorithm.adv_estimator=gae",
        "critic.enable=true"])
    with pytest.raises(ConfigError, match=r"^critic\.enable: .*fully-async.*fix: use trainer\.mode=colocated") as e:
        train_fully_async(cfg)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before the run started


def test_ppo_with_a_critic_on_two_workers(tmp_path: Path):
    """PPO (GAE) with the critic sharded over 2 workers: `critic/*` metrics are written and finite, the value
    model trains (its loss and gradient are non-zero), and `timing_s/update_critic` is logged. That the update
    does not depend on N is checked exactly in tests/unit/test_fsdp_critic_equivalence.py (the rollouts do:
    each rank's engine samples with its own seed); test_ray_resume.py checks the critic's checkpoint."""
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.total_steps=2", "trainer.test_freq=0", "algorithm.name=ppo",
        "algorithm.adv_estimator=gae", "critic.enable=true", "critic.lr=1e-3", "actor.ppo_mini_batch_size=2"])
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    assert sorted(rows) == [1, 2]
    for step in (1, 2):
        m = rows[step]
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean",
                    "critic/returns/mean", "critic/advantages/mean", "timing_s/update_critic", "timing_s/values"):
            assert key in m and math.isfinite(m[key]), (step, key)
        assert m["critic/vf_loss"] > 0 and m["critic/grad_norm"] > 0
    # the critic learned between the steps: step 2's values come from the updated value model
    assert rows[1]["critic/values/mean"] != rows[2]["critic/values/mean"]


def test_kl_loss_against_the_reference_on_two_workers(tmp_path: Path):
    """The reference policy lives on the trainer workers (sharded like the policy): at step 1 the policy still
    equals the reference, so KL(policy || ref) is 0 on the first mini-batch and the loss is logged every step."""
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.total_steps=2", "trainer.test_freq=0", "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.1", "actor.ppo_mini_batch_size=2", "actor.entropy_coeff=0.01"])
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    assert sorted(rows) == [1, 2]
    assert all(math.isfinite(rows[s]["actor/kl_loss"]) and rows[s]["timing_s/ref"] > 0 for s in (1, 2))
    assert rows[2]["actor/kl_loss"] > 0  # two optimizer steps later the policy has left the reference
