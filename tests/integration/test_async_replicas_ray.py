"""Fully-async mode with several rollout replicas (tiny model, CPU workers on a local Ray cluster):
two replicas feed one queue, every sync reaches both (their weight digests agree), the staleness
bound holds for the run as a whole, and every token keeps a valid policy version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")


def _cfg(tmp_path: Path, *overrides: str):
    return load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.mode=fully_async", "trainer.progress=false", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.total_steps=4", "data.max_response_length=48",
        "async.trigger_parameter_sync_step=2", "async.staleness_threshold=0.5", "async.partial_rollout=true",
        "async.rollout_gpus=2", *overrides])


# two trainer workers exercise what one does and the broadcast to both replicas; one worker is slow (CI time)
@pytest.mark.parametrize("train_gpus", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_two_rollout_replicas_feed_one_queue(tmp_path: Path, train_gpus: int):
    from trainer.modes.fully_async import train_fully_async

    rows = [r["data"] for r in read_metrics(train_fully_async(_cfg(tmp_path, f"async.train_gpus={train_gpus}")))]
    assert len(rows) == 4
    # both replicas produced the samples the trainer consumed, and each step took required = 4 groups
    consumed = [sum(r[f"fully_async/count/replica_{i}/consumed_groups"] for r in rows) for i in (0, 1)]
    assert all(c > 0 for c in consumed), consumed
    assert all(r["fully_async/count/replica_0/consumed_groups"] + r["fully_async/count/replica_1/consumed_groups"]
               == 4 for r in rows)
    assert all(r[f"fully_async/count/replica_{i}/total_generated_samples"] > 0 for r in rows[-1:] for i in (0, 1))
    # every weight sync (steps 2 and 4) reached both replicas: their weight digests agree
    synced = [r for r in rows if "timing_s/update_weights" in r]
    assert len(synced) == 2 and all(r["fully_async/rollouter/replicas_out_of_sync"] == 0 for r in synced)
    # the run-wide staleness bound: 0.5 * 4 * 2 = 4 stale groups per window; the cap 4 * 1.5 * 2 = 12 split 6 + 6
    assert all(r["fully_async/staleness/stale_groups_in_window"] <= 4 for r in rows)
    assert all(r["fully_async/rollouter/max_required_groups"] == 12 for r in synced)
    assert all(r["fully_async/rollouter/window_started_groups"] <= 12 for r in synced)
    assert max(r["fully_async/staleness/max_version_lag"] for r in rows) <= 1
    # each token's policy version lies within its group's start..end and never goes backwards
    assert all(r["fully_async/partial/invalid_token_versions"] == 0 for r in rows)
    facts = json.loads((tmp_path / "engine.json").read_text())
    assert isinstance(facts, list) and len(facts) == 2 and all(f["engine"] == "hf" for f in facts)


@pytest.mark.slow  # ~3 min
def test_two_replicas_resume_from_a_checkpoint_and_refuse_another_replica_count(tmp_path: Path):
    import torch

    from trainer.components.checkpoint import latest_checkpoint
    from trainer.errors import ConfigError
    from trainer.modes.fully_async import train_fully_async

    first = read_metrics(train_fully_async(_cfg(tmp_path, "trainer.total_steps=2", "trainer.save_freq=2")))
    state = torch.load(latest_checkpoint(tmp_path) / "state.pt", weights_only=False)
    assert len(state["rollouters"]) == 2  # each replica's prompt position and sampling generator
    assert state["rollouters"][0]["data"] != state["rollouters"][1]["data"]  # their own prompt shards
    lines = read_metrics(train_fully_async(_cfg(tmp_path, "trainer.save_freq=2")))
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and lines[:2] == first
    r3 = lines[2]["data"]
    # both replicas resumed on the checkpointed weights and version: on-policy, in step with the trainer
    assert r3["fully_async/staleness/max_version_lag"] == 0.0 and r3["training/rollout_probs_diff_max"] < 1e-3
    assert all(r3[f"fully_async/count/replica_{i}/total_generated_samples"] > 0 for i in (0, 1))
    assert lines[3]["data"]["fully_async/rollouter/replicas_out_of_sync"] == 0
    with pytest.raises(ConfigError, match="written by 2 rollout workers") as e:
        train_fully_async(_cfg(tmp_path, "trainer.total_steps=6", "async.rollout_gpus=1"))
    assert "\n" not in str(e.value) and "async.rollout_gpus=2" in str(e.value)
