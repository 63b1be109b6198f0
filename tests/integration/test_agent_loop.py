"""Multi-turn tool use through the real loop on a tiny random-init Qwen2 (CPU, seconds)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainer.agent.loop import AgentRolloutEngine
from trainer.api import train
from trainer.components.metrics import read_metrics
from trainer.modes.steps import build_components, generate_scored_batch
from trainer.rollout.base import InterruptibleEngine, SamplingParams

pytestmark = pytest.mark.integration

AGENT = {"enable": True, "max_turns": 3, "max_observation_tokens": 8}


def test_training_run_with_the_agent_logs_turn_metrics(make_config):
    cfg = make_config(agent=AGENT, data={"max_response_length": 16})
    lines = read_metrics(train(cfg))
    assert [ln["step"] for ln in lines] == [0, 1, 2, 3]
    assert "val-aux/num_turns/mean" in lines[0]["data"]
    for ln in lines[1:]:
        d = ln["data"]
        for key in ("num_turns/mean", "num_turns/max", "agent/tool_calls/mean", "agent/tool_errors/mean",
                    "actor/pg_loss", "critic/score/mean"):
            assert math.isfinite(d[key]), (key, d)
        assert 2 <= d["num_turns/mean"] <= d["num_turns/max"] <= 1 + 2 * AGENT["max_turns"] - 1
        assert d["response_length/mean"] <= 16


class CallThenModel(InterruptibleEngine):
    """Turn 1 of every row: a fixed tool call (log-prob -1 per token); later turns: the real engine."""

    name = "call-then-model"

    def __init__(self, inner: InterruptibleEngine, tokenizer, code: str) -> None:
        self.inner, self.tok = inner, tokenizer
        call = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
        self.call_ids = tokenizer.encode(f"<tool_call>{call}</tool_call>", add_special_tokens=False)
        self.version = 0

    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams, should_stop=None):
        fresh = [i for i, p in enumerate(rows) if not _contains(p, self.call_ids)]
        if len(fresh) == len(rows):
            k = len(rows)
            return [list(self.call_ids)] * k, [[-1.0] * len(self.call_ids)] * k, ["stop"] * k
        assert not fresh, "rows move through turns together here"
        return self.inner.decode_rows(rows, budgets, params, should_stop)

    def update_weights(self, named_tensors) -> None:
        self.inner.update_weights(named_tensors)


def _contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_tool_round_trip_in_a_training_batch(make_config):
    cfg = make_config(agent={**AGENT, "data_source": "retool"}, data={"max_response_length": 140})
    c = build_components(cfg)
    assert isinstance(c.engine, AgentRolloutEngine)
    c.engine.inner = CallThenModel(c.engine.inner, c.tokenizer, "print(6 * 7)")
    batch, stats = generate_scored_batch(c, c.train_data.next_batch)
    n = len(batch)
    assert stats["agent/tool_calls/mean"] == 1.0 and stats["agent/tool_errors/mean"] == 0.0
    assert stats["num_turns/min"] >= 4  # user, call, observation, answer (or more turns)
    assert all(e["num_turns"] == t for e, t in zip(batch.meta["extra_info"], batch.meta["num_turns"]))
    # the observation holds the tool output and is masked out; the call itself is trained on
    call_len = len(c.engine.inner.call_ids)
    obs_len = len(c.engine.observation_ids("42"))
    obs_text = c.tokenizer.decode(batch.responses[0][call_len:call_len + obs_len])
    assert obs_text == "\n<tool_response>\n42\n</tool_response>\n"
    assert torch.all(batch.response_mask[:, :call_len] == 1)
    assert torch.all(batch.rollout_logprobs[:, :call_len] == -1.0)
    assert torch.all(batch.response_mask[:, call_len:call_len + obs_len] == 0)
    assert torch.all(batch.rollout_logprobs[:, call_len:call_len + obs_len] == 0)
    # retool reward on a wrong answer: -1 + (num_turns - 2) / 2 * 0.1, capped at -0.6
    turns = torch.tensor(batch.meta["num_turns"], dtype=torch.float32)
    expected = torch.clamp(-1 + (turns - 2) / 2 * 0.1, max=-0.6)
    assert torch.allclose(batch.scores, expected)  # a random tiny model never boxes 42
    # the trainer's log-probs run over the whole stream; one update is finite
    lp = c.actor.compute_logprobs(batch)  # [N, R]
    assert lp.shape == batch.responses.shape and torch.isfinite(lp).all()
    assert n == cfg.data.train_batch_size * cfg.rollout.n
