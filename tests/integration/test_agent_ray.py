"""The multi-turn tool loop on the Ray colocated path: 2 CPU trainer workers, each with an agent engine.

    python3 -m pytest -q tests/integration/test_agent_ray.py

A random-init tiny model rarely closes a well-formed tool call, so the first two check the wiring
(each worker's engine is the agent loop with its own sandbox, rank 0 records the layers in
env.json, the driver logs the multi-turn metrics for the gathered batch); the third runs the
scripted-weights policy of tests/helpers/tool_policy.py, which calls the tool in every trajectory,
through fully-async partial rollout. The loop itself, tool errors and `timing_s/tool` under
hostile code are tested on scripted engines in tests/unit/test_agent.py and test_agent_partial.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

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


@pytest.mark.slow  # the partial-rollout test below covers the fully-async tool loop in the default tier
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


def test_tool_trajectories_cross_weight_syncs_in_the_fully_async_rollouter(tmp_path: Path):
    """Partial rollout of tool-use trajectories on Ray: the scripted-weights policy of
    tests/helpers/tool_policy.py calls a tool that takes 0.5 s in every trajectory, so weight syncs
    land while tools run; the trajectories continue under the new weights and complete."""
    from tests.helpers.tool_policy import ToolPolicy
    from trainer.modes.fully_async import train_fully_async

    folder = ToolPolicy(code="import time; time.sleep(0.5); print(42)").save(tmp_path / "policy")
    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path / 'run'}", f"model.path={folder}", "trainer.mode=fully_async",
        "trainer.progress=false", "trainer.save_freq=0", "trainer.test_freq=0", "trainer.total_steps=3",
        "data.max_response_length=64", "async.partial_rollout=true", "async.staleness_threshold=1.0",
        "async.trigger_parameter_sync_step=1", "agent.enable=true", "agent.max_turns=3"])
    rows = [r["data"] for r in read_metrics(train_fully_async(cfg)) if r["step"] > 0]
    assert len(rows) == 3
    for m in rows:  # every trajectory: prompt, call, observation, answer
        assert m["num_turns/min"] == m["num_turns/max"] == 4 and m["agent/tool_calls/mean"] == 1
        assert m["agent/tool_errors/total"] == 0
        assert m["fully_async/partial/invalid_token_versions"] == 0
    assert sum(m["fully_async/partial/total_partial_num"] for m in rows) > 0  # some crossed a sync mid-trajectory
    assert max(m["fully_async/partial/max_partial_span"] for m in rows) >= 1
