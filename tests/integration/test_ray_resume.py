"""Checkpoint/resume on the Ray paths (CPU workers, tiny model) and DAPO dynamic sampling on Ray workers.

Colocated on 2 workers (FSDP2 over gloo): a run stopped after step 2's checkpoint and rerun logs the same
numbers as an uninterrupted run, for GRPO and for PPO with the critic (its weights and AdamW state resumed). Fully-async: the resumed run continues at the checkpointed step and
policy version, with the checkpointed weights in the rollout worker. Each run takes ~15-40 s on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.components.checkpoint import latest_checkpoint
from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


def _colocated(out: Path, *overrides: str):
    return load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={out}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.total_steps=4", "trainer.save_freq=2", "trainer.test_freq=2", "data.num_val_samples=6",
        # two optimizer steps per step (AdamW moments matter) and large enough steps that weights visibly move
        "actor.ppo_mini_batch_size=2", "actor.lr=0.01", "actor.entropy_coeff=0.1", *overrides])


# PPO with the value model sharded over the 2 workers: its weights and AdamW state are in critic.pt
PPO = ("algorithm.name=ppo", "algorithm.adv_estimator=gae", "critic.enable=true", "critic.lr=1e-3")


# ppo_critic resumes the actor and the critic, so the default tier runs it alone (CI time); grpo is slow
@pytest.mark.parametrize("extra", [pytest.param((), marks=pytest.mark.slow), PPO], ids=["grpo", "ppo_critic"])
def test_colocated_resume_reproduces_uninterrupted_run(tmp_path: Path, extra: tuple[str, ...]):
    from trainer.distributed.colocated_ray import train_colocated_ray

    full = read_metrics(train_colocated_ray(_colocated(tmp_path / "full", *extra)))
    part = tmp_path / "part"
    train_colocated_ray(_colocated(part, "trainer.total_steps=2", *extra))  # "killed" right after step 2's checkpoint
    ckpt = latest_checkpoint(part)
    assert ckpt is not None and ckpt.name == "step_000002"
    assert (ckpt / "state.pt").is_file() and (ckpt / "actor.pt").is_file()
    assert (ckpt / "critic.pt").is_file() == bool(extra)
    resumed = read_metrics(train_colocated_ray(_colocated(part, *extra)))
    if extra:  # the critic trained and its numbers are among those compared below
        assert full[4]["data"]["critic/grad_norm"] > 0 and "critic/vf_loss" in resumed[3]["data"]

    assert [ln["step"] for ln in resumed] == [0, 1, 2, 3, 4]  # nothing lost, nothing duplicated
    assert [ln["step"] for ln in full] == [0, 1, 2, 3, 4]
    # deterministic on CPU (seeded engines, gloo reductions in a fixed order): the same numbers to
    # float32 rounding, and the updates really changed the policy (else equality would prove little)
    assert full[4]["data"]["actor/grad_norm"] > 0
    for a, b in zip(full, resumed):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys(), a["step"]
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)
    assert "timing_s/save_checkpoint" in resumed[4]["data"]


def test_colocated_resume_refuses_another_worker_count(tmp_path: Path):
    from trainer.distributed.colocated_ray import train_colocated_ray
    from trainer.errors import ConfigError

    train_colocated_ray(_colocated(tmp_path, "trainer.total_steps=1", "trainer.save_freq=1", "trainer.test_freq=0"))
    with pytest.raises(ConfigError, match="written by 2 trainer workers, this run has 1"):
        train_colocated_ray(_colocated(tmp_path, "trainer.n_gpus_per_node=1", "trainer.test_freq=0"))


def test_dynamic_sampling_on_two_workers(tmp_path: Path):
    """DAPO filter_groups through the shared `collect_scored_batch`: every kept group has unequal scores,
    the kept count is whole mini-batches (it shards over the 2 workers), refills are counted."""
    from trainer.distributed.colocated_ray import train_colocated_ray

    # a random tiny model mostly scores 0, so most groups are filtered and refills happen; which groups
    # survive is checked exactly in tests/unit/test_collect_scored_batch.py, this run checks the Ray wiring
    cfg = _colocated(tmp_path, "algorithm.dynamic_sampling=true", "algorithm.max_num_gen_batches=3",
                     "trainer.total_steps=2", "trainer.save_freq=0", "trainer.test_freq=0")
    rows = [r["data"] for r in read_metrics(train_colocated_ray(cfg))]
    assert len(rows) == 2
    for r in rows:
        assert 1 <= r["train/num_gen_batches"] <= 3
        assert r["train/kept_groups"] in (2, 4)  # multiples of ppo_mini_batch_size=2, at most train_batch_size
        assert r["perf/total_num_tokens"] > 0


def _async(out: Path, *overrides: str):
    return load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={out}", "trainer.mode=fully_async", "trainer.progress=false", "trainer.test_freq=0",
        "trainer.total_steps=4", "trainer.save_freq=2", "data.max_response_length=48",
        "async.trigger_parameter_sync_step=2", "async.staleness_threshold=0.5", "async.partial_rollout=true",
        "actor.lr=0.01", "actor.entropy_coeff=0.1", *overrides])


def test_fully_async_resume_continues_at_the_checkpointed_step_and_version(tmp_path: Path):
    import torch

    from trainer.modes.fully_async import train_fully_async

    first = read_metrics(train_fully_async(_async(tmp_path, "trainer.total_steps=2")))
    assert [r["step"] for r in first] == [1, 2]
    assert first[1]["data"]["fully_async/checkpoint/unsaved_groups"] >= 0
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_000002"
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert state["version"] == 1 and state["world_size"] == 1  # saved after the first sync, by 1 trainer worker
    # the checkpointed policy is not the initial one: a rollouter that kept its initial weights would disagree
    assert first[1]["data"]["actor/grad_norm"] > 0

    lines = read_metrics(train_fully_async(_async(tmp_path)))
    assert [r["step"] for r in lines] == [1, 2, 3, 4]  # steps 1-2 kept from the first run, 3-4 appended once
    assert lines[:2] == first
    r3, r4 = lines[2]["data"], lines[3]["data"]
    # the first samples after the resume were started under the checkpointed version (1), so none is stale,
    # and the rollouter samples with the checkpointed weights: its log-probs match the trainer's
    assert r3["fully_async/count/current_param_version"] == 1.0
    assert r3["fully_async/staleness/max_version_lag"] == 0.0
    assert r3["training/rollout_probs_diff_max"] < 1e-3
    assert r4["fully_async/count/current_param_version"] == 1.0  # step 4 trains, then syncs version 2
    bound = 0.5 * 4 * 2
    for r in (r3, r4):
        assert r["fully_async/staleness/stale_groups_in_window"] <= bound
        assert r["fully_async/staleness/max_version_lag"] <= 1
    # counters continue from the checkpoint instead of restarting
    assert r3["fully_async/count/total_generated_samples"] > first[1]["data"]["fully_async/count/total_generated_samples"]
    assert latest_checkpoint(tmp_path).name == "step_000004"
