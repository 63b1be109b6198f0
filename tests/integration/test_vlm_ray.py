"""Images on the Ray paths: the tiny Qwen2.5-VL on the synthetic geometry task, CPU workers.

Colocated on Ray (one trainer worker with its hf engine, the vision tower trained and synced
in-process) and fully-async (a trainer worker and a rollout worker on their own CPU processes,
the tower frozen, so the bucketed weight broadcast leaves it out on both sides). Each prompt's
pixel values and image grid travel in the items to the engine and in the batch's meta to the
trainer worker, whose log-prob recomputation must then agree with the engine's:
`training/rollout_probs_diff_max` at float32 numerics. ~40-60 s each on 2 cores.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")
pytest.importorskip("PIL", reason="image rows need Pillow (a base dependency: pip install pillow)")

DIFF_MAX = 1e-4  # float32: the hf engine's prefill + decode vs the trainer's one forward, same images and weights


def _cfg(tmp_path: Path, *overrides: str):
    return load_config("trainer/configs/grpo_tiny_vlm_geometry.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.progress=false", "trainer.save_freq=0", "trainer.test_freq=0",
        "trainer.log_val_generations=0", "trainer.total_steps=3", "data.train_files=synthetic:geometry-easy?num=64&num_val=4",
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", "data.max_response_length=6",
        *overrides])


def _check(rows: dict[int, dict], steps: int) -> None:
    assert sorted(s for s in rows if s > 0) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        m = rows[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert m["training/rollout_probs_diff_max"] < DIFF_MAX, (step, m["training/rollout_probs_diff_max"])


def test_colocated_ray_carries_images_and_syncs_the_trained_tower(tmp_path: Path):
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = _cfg(tmp_path, "trainer.use_ray=true", "actor.freeze_vision_tower=false")
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    _check(rows, 3)  # steps 2-3 sample with the synced weights, tower included
    print("colocated Ray, rollout_probs_diff_max per step:",
          [f"{rows[s]['training/rollout_probs_diff_max']:.1e}" for s in (1, 2, 3)])


def test_fully_async_carries_images_through_the_rollout_worker(tmp_path: Path):
    from trainer.modes.fully_async import train_fully_async

    cfg = _cfg(tmp_path, "trainer.mode=fully_async", "async.partial_rollout=false", "async.staleness_threshold=0",
               "async.trigger_parameter_sync_step=1", "actor.freeze_vision_tower=true")
    rows = {r["step"]: r["data"] for r in read_metrics(train_fully_async(cfg))}
    _check(rows, 3)  # staleness 0: every step's groups were sampled with the weights the trainer recomputes with
    assert all(rows[s]["timing_s/update_weights"] > 0 for s in (1, 2, 3))
    print("fully-async, rollout_probs_diff_max per step:",
          [f"{rows[s]['training/rollout_probs_diff_max']:.1e}" for s in (1, 2, 3)])
