"""`model.warm_start` in the fully-async mode: the rollouter and the trainer load one cached warm start.

    python3 -m pytest -q tests/integration/test_warm_start_ray.py -m slow

Both Ray workers load the model at once; the file lock in `trainer.models.warm_start.build_cached` lets
one of them build the warm start and the other read it, so the cache holds exactly one folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ray = pytest.importorskip("ray")


def test_fully_async_workers_share_one_warm_start(tmp_path: Path, monkeypatch):
    from trainer.modes.fully_async import train_fully_async

    monkeypatch.setenv("RLBENCH_CACHE", str(tmp_path / "cache"))
    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path / 'run'}", "trainer.mode=fully_async", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.test_freq=0", "trainer.total_steps=2", "data.max_response_length=48",
        "async.partial_rollout=false", "async.trigger_parameter_sync_step=1", "agent.enable=true", "agent.max_turns=2",
        "model.warm_start={steps: 2, batch_size: 4, num_examples: 8, max_observation_tokens: 64}"])
    rows = [r["data"] for r in read_metrics(train_fully_async(cfg)) if r["step"] > 0]
    assert len(rows) == 2 and all("agent/tool_call_ratio" in m for m in rows)
    folders = [p for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()]
    assert len(folders) == 1 and folders[0].name.split("-sft-")[1].startswith("tool-arithmetic-")
    facts = json.loads((folders[0] / "warm_start.json").read_text())
    assert facts["setting"]["steps"] == 2 and facts["loss_last"] < facts["loss_first"]
