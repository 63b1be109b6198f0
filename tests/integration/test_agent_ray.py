"""The multi-turn tool loop on the Ray colocated path: 2 CPU trainer workers, each with an agent engine.

    python3 -m pytest -q tests/integration/test_agent_ray.py

A random-init tiny model rarely closes a well-formed tool call, so this checks the wiring (each
worker's engine is the agent loop with its own sandbox, rank 0 records the layers in env.json, the
driver logs the multi-turn metrics for the gathered batch); the loop itself, tool errors and
`timing_s/tool` under hostile code are tested on a scripted engine in tests/unit/test_agent.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.metrics import read_metrics

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")


def test_agent_loop_on_two_ray_workers(tmp_path: Path):
    from trainer.distributed.colocated_ray import train_colocated_ray

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.use_ray=true", "trainer.n_gpus_per_node=2", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.total_steps=1", "trainer.test_freq=0", "agent.enable=true",
        "agent.max_turns=2"])
    rows = {r["step"]: r["data"] for r in read_metrics(train_colocated_ray(cfg))}
    m = rows[1]
    for key in ("num_turns/mean", "num_turns/max", "agent/tool_calls/mean", "agent/tool_errors/total", "timing_s/tool"):
        assert key in m, key
    assert m["num_turns/min"] >= 2
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["sandbox"]["isolating"] and "subreaper" in env["sandbox"]["in_force"]


def test_agent_loop_in_the_fully_async_rollouter(tmp_path: Path):
    from trainer.modes.fully_async import train_fully_async

    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.mode=fully_async", "trainer.progress=false", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.total_steps=2", "data.max_response_length=48", "async.partial_rollout=false",
        "async.trigger_parameter_sync_step=1", "agent.enable=true", "agent.max_turns=2"])
    rows = [r["data"] for r in read_metrics(train_fully_async(cfg)) if r["step"] > 0]
    assert len(rows) == 2
    for m in rows:
        assert m["num_turns/min"] >= 2 and "agent/tool_errors/total" in m and "timing_s/tool" in m
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["sandbox"]["isolating"]
