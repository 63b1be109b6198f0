"""Pipeline parallelism (`actor.megatron.pipeline_model_parallel_size=2`) on the Ray trainer workers
(CPU, gloo, tiny:qwen3 with tied embeddings, one decoder layer per stage).

Colocated on 2 workers (PP=2, DP=1): the same per-step numbers as the FSDP2 run of the same config and seed
(`tests/integration/test_megatron_ray.py`'s bound), and after every update the engines hold the trainer's
weights (the export gathers both stages onto every rank). Fully-async with 1 rollout + 2 trainer workers
at PP=2, strictly on-policy: the broadcast from trainer rank 0 (first stage) reaches the rollout worker at
every version. Slow tier (16-28 s each on 2 busy cores): `python3 -m pytest -m slow tests/integration/test_megatron_pipeline_ray.py`
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_megatron_ray import ABS, REL, WEIGHTS_REACHED, _cfg, _numbers, _run
from trainer.backends.strategy import megatron_missing
from trainer.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(megatron_missing() is not None,
                                 reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")]
pytest.importorskip("ray")
PP2 = "actor.megatron.pipeline_model_parallel_size=2"


def test_colocated_ray_pipeline_equals_fsdp2(tmp_path: Path):
    meg = _run(_cfg(tmp_path / "megatron", "tiny:qwen3", "megatron", PP2))
    ref = _run(_cfg(tmp_path / "fsdp2", "tiny:qwen3", "fsdp2"))
    assert [ln["step"] for ln in meg] == [ln["step"] for ln in ref] == [1, 2, 3]
    for a, b in zip(meg, ref):
        na, nb = _numbers(a), _numbers(b)
        assert set(na) == set(nb), set(na) ^ set(nb)
        assert na["training/rollout_probs_diff_max"] < WEIGHTS_REACHED, a["step"]
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=REL, abs=ABS), (a["step"], k, na[k], nb[k])


def test_fully_async_pipeline_two_trainer_workers(tmp_path: Path):
    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "model.path=tiny:qwen3", "actor.strategy=megatron", PP2,
        "trainer.mode=fully_async", "async.train_gpus=2", "async.staleness_threshold=0",
        "async.trigger_parameter_sync_step=1", "trainer.progress=false", "trainer.save_freq=0", "trainer.test_freq=0",
        "trainer.total_steps=3", "trainer.num_threads=1", "actor.lr=0.01", "actor.entropy_coeff=0.01"])
    rows = [ln["data"] for ln in _run(cfg)]
    assert [r["fully_async/count/current_param_version"] for r in rows] == [0.0, 1.0, 2.0]
    for r in rows:
        assert r["fully_async/staleness/max_version_lag"] == 0 and 0 < r["actor/grad_norm"] < 10
        assert r["training/rollout_probs_diff_max"] < WEIGHTS_REACHED
