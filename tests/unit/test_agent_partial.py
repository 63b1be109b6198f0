"""The tool loop interrupted by a weight sync and continued under new weights, and tools overlapping decode.

    python3 -m pytest -q tests/unit/test_agent_partial.py

Real engines (`hf`, `static` on CPU) and the real sandbox run the policy of
tests/helpers/tool_policy.py, a tiny Llama whose weights write a tool call and, after the tool's
output, an answer that depends on the weights' version ("41" under version 0, "42" under version
1): which answer a trajectory ends with says which weights sampled it. The weight update between
the interrupted call and its continuation is the engines' own `update_weights`.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers.tool_policy import InterruptInAnswer, ToolPolicy, call_text
from trainer.agent.loop import AgentRolloutEngine
from trainer.agent.trajectory import Trajectory
from trainer.config import AgentConfig
from trainer.rollout.base import InterruptibleEngine, SamplingParams
from trainer.rollout.hf import HFRolloutEngine
from trainer.rollout.static import StaticRolloutEngine

SLOW = "import time; time.sleep(0.4); print(42)"


def make_engine(kind: str, policy: ToolPolicy) -> InterruptibleEngine:
    if kind == "hf":
        return HFRolloutEngine(policy.model, pad_token_id=policy.tok.pad_token_id, eos_token_ids=[policy.eos])
    return StaticRolloutEngine(policy.model, pad_token_id=policy.tok.pad_token_id, eos_token_ids=[policy.eos])


class FlagAgent(AgentRolloutEngine):
    """The agent loop, with an event set when a tool call starts running."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tool_started = threading.Event()

    def run_tool(self, call):
        self.tool_started.set()
        return super().run_tool(call)


def params(p: ToolPolicy, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, max_new_tokens=80, temperature=1.0, stop_token_ids=[p.eos])


def resume(agent: AgentRolloutEngine, p: ToolPolicy, out, rows: list[int], n: int = 1):
    return agent.continue_generation(
        [out.prompt_ids[i] for i in rows], [out.response_ids[i] for i in rows],
        [out.response_logprobs[i] for i in rows], params(p, n), partial_versions=[out.token_versions[i] for i in rows],
        partial_masks=[out.response_mask[i] for i in rows], partial_turn_stats=[out.turn_stats[i] for i in rows])


def sync(engine: InterruptibleEngine, p: ToolPolicy, version: int) -> None:
    engine.update_weights(p.named_weights(version))
    engine.version = version


@pytest.fixture(scope="module")
def policy() -> ToolPolicy:
    return ToolPolicy()


@pytest.mark.parametrize("kind", ["hf", "static"])
def test_uninterrupted_trajectory_follows_the_weights(policy: ToolPolicy, kind: str) -> None:
    agent = AgentRolloutEngine(make_engine(kind, policy), policy.tok, AgentConfig(enable=True))
    out = agent.generate([policy.prompt()], params(policy, n=2))
    obs = agent.observation_ids("42")
    for i in range(2):
        assert out.response_ids[i] == [policy.call, *obs, policy.so, policy.answers[0], policy.eos]
        assert out.response_mask[i] == [1] + [0] * len(obs) + [1, 1, 1]
        assert out.token_versions[i] == [0] * len(out.response_ids[i])
        assert {k: out.turn_stats[i][k] for k in ("num_turns", "tool_calls", "tool_errors")} == \
            {"num_turns": 4, "tool_calls": 1, "tool_errors": 0}
    assert out.finish_reasons == ["stop", "stop"]


@pytest.mark.parametrize("kind", ["hf", "static"])
def test_interrupt_between_turns_continues_under_new_weights(kind: str) -> None:
    p = ToolPolicy(code=SLOW)
    engine = make_engine(kind, p)
    agent = FlagAgent(engine, p.tok, AgentConfig(enable=True))
    out = agent.generate([p.prompt()], params(p), should_stop=agent.tool_started.is_set)  # a sync while the tool runs
    obs = agent.observation_ids("42")
    assert out.finish_reasons == ["abort"]
    assert out.response_ids[0] == [p.call, *obs]  # the running tool finished; its output is in
    assert out.turn_stats[0]["num_turns"] == 3 and out.turn_stats[0]["tool_calls"] == 1
    sync(engine, p, 1)
    cont = resume(agent, p, out, [0])
    ids = cont.response_ids[0]
    assert ids == [p.call, *obs, p.so, p.answers[1], p.eos]  # the answer of the new weights
    assert cont.token_versions[0] == [0] * (1 + len(obs)) + [1, 1, 1]
    assert cont.response_logprobs[0][: len(out.response_ids[0])] == out.response_logprobs[0]  # kept as sampled
    assert all(-1e-3 < lp < 0 for lp in cont.response_logprobs[0][-3:])  # the new weights' own log-probs
    assert cont.response_mask[0] == [1] + [0] * len(obs) + [1, 1, 1]
    assert {k: cont.turn_stats[0][k] for k in ("num_turns", "tool_calls", "tool_errors")} == \
        {"num_turns": 4, "tool_calls": 1, "tool_errors": 0}
    assert cont.finish_reasons == ["stop"] and cont.policy_version == [1]


@pytest.mark.parametrize("kind", ["hf", "static"])
def test_interrupt_mid_segment_extends_the_segment(policy: ToolPolicy, kind: str) -> None:
    engine = InterruptInAnswer(make_engine(kind, policy), policy.obs_end)
    agent = AgentRolloutEngine(engine, policy.tok, AgentConfig(enable=True))
    out = agent.generate([policy.prompt()], params(policy), should_stop=lambda: False)
    obs = agent.observation_ids("42")
    assert out.finish_reasons == ["abort"] and out.response_ids[0] == [policy.call, *obs, policy.so]
    assert out.turn_stats[0]["num_turns"] == 4  # the answer segment got its first token
    sync(engine, policy, 1)
    cont = resume(agent, policy, out, [0])
    assert cont.response_ids[0] == [policy.call, *obs, policy.so, policy.answers[1], policy.eos]
    assert cont.token_versions[0] == [0] * (2 + len(obs)) + [1, 1]
    assert cont.turn_stats[0]["num_turns"] == 4  # the continued segment is the same turn
    assert cont.response_mask[0] == [1] + [0] * len(obs) + [1, 1, 1]


def test_a_queued_call_is_dropped_at_the_interrupt_and_runs_after_it() -> None:
    p = ToolPolicy(code=SLOW)
    engine = make_engine("hf", p)
    agent = FlagAgent(engine, p.tok, AgentConfig(enable=True, max_parallel_tools=1))
    out = agent.generate([p.prompt()], params(p, n=2), should_stop=agent.tool_started.is_set)
    obs = agent.observation_ids("42")
    assert out.finish_reasons == ["abort", "abort"]
    assert out.response_ids == [[p.call, *obs], [p.call]]  # row 1's call was queued behind row 0's: not run
    assert [st["tool_calls"] for st in out.turn_stats] == [1, 1] and out.turn_stats[1]["tool_s"] == 0
    sync(engine, p, 1)
    cont = resume(agent, p, out, [0, 1])
    for i in range(2):
        assert cont.response_ids[i] == [p.call, *obs, p.so, p.answers[1], p.eos]
        assert {k: cont.turn_stats[i][k] for k in ("num_turns", "tool_calls", "tool_errors")} == \
            {"num_turns": 4, "tool_calls": 1, "tool_errors": 0}
    assert cont.token_versions[1] == [0] + [1] * (len(obs) + 3)  # the observation was appended under version 1
    assert cont.turn_stats[1]["tool_s"] > 0.4


def test_resume_reads_the_state_from_the_tokens(policy: ToolPolicy) -> None:
    agent = AgentRolloutEngine(make_engine("hf", policy), policy.tok, AgentConfig(enable=True))
    kw = {"cut_at_call": agent.cut_at_tool_call, "decode": agent._decode_text}
    obs = agent.observation_ids("42")
    fresh = Trajectory.resume([1], 50, [], [], [], [], {"num_turns": 1}, **kw)
    assert fresh.decoding and not fresh.open and fresh.segments == 0
    call = Trajectory.resume([1], 50, [policy.call], [-0.1], [0], [1], {"num_turns": 2, "tool_calls": 1}, **kw)
    assert call.call is not None and call.call.ok and call.call.arguments["code"] == "print(6 * 7)"
    after_obs = Trajectory.resume([1], 50, [policy.call, *obs], [0.0] * (1 + len(obs)), [0] * (1 + len(obs)),
                                  [1] + [0] * len(obs), {"num_turns": 3, "tool_calls": 1}, **kw)
    assert after_obs.decoding and not after_obs.open and after_obs.segments == 1
    half = policy.tok.encode(call_text("print(1)")[:20], add_special_tokens=False)  # a call cut short mid-way
    open_seg = Trajectory.resume([1], 50, half, [0.0] * len(half), [0] * len(half), [1] * len(half),
                                 {"num_turns": 2}, **kw)
    assert open_seg.open and open_seg.seg_start == 0 and open_seg.segments == 1
    with pytest.raises(ValueError, match="must agree"):
        Trajectory.resume([1], 50, [5, 6], [0.0], [0, 0], [1, 1], {}, **kw)
    with pytest.raises(ValueError, match="partial_masks and partial_turn_stats"):
        agent.continue_generation([[1]], [[5]], [[0.0]], params(policy))


class SlowDecode(InterruptibleEngine):
    """Scripted decode that takes DECODE_S per call: row 0 calls a 1 s tool once; row 1 calls a fast tool 3 times."""

    DECODE_S = 0.15

    def __init__(self, tok, eos: int) -> None:
        self.tok, self.eos, self.version = tok, eos, 0
        self.spans: list[tuple[float, float]] = []

    def decode_rows(self, rows, budgets, params, should_stop):
        t0 = time.perf_counter()
        time.sleep(self.DECODE_S)
        out = []
        for row in rows:
            text = self.tok.decode(row)
            turns = text.count("<tool_response>")
            if "slow" in text:
                seg = call_text("import time; time.sleep(1.0); print(0)") if turns == 0 else "done"
            else:
                seg = call_text(f"print({turns})") if turns < 3 else "done"
            out.append(self.tok.encode(seg, add_special_tokens=False) + [self.eos])
        self.spans.append((t0, time.perf_counter()))
        return out, [[-0.5] * len(t) for t in out], ["stop"] * len(out)

    def update_weights(self, named_tensors) -> None:
        pass


@pytest.mark.timing  # the overlap it measures shrinks when another worker shares the cores
def test_tool_calls_run_while_other_samples_decode(policy: ToolPolicy) -> None:
    from trainer.components.batch import batch_from_rollout
    from trainer.modes.steps import turn_metrics

    tok = policy.tok
    engine = SlowDecode(tok, policy.eos)
    agent = AgentRolloutEngine(engine, tok, AgentConfig(enable=True, max_turns=4))
    out = agent.generate([tok.encode("slow", add_special_tokens=False), tok.encode("fast", add_special_tokens=False)],
                         SamplingParams(max_new_tokens=400, stop_token_ids=[policy.eos]))
    assert [st["tool_calls"] for st in out.turn_stats] == [1, 3] and out.finish_reasons == ["stop", "stop"]
    assert [st["num_turns"] for st in out.turn_stats] == [4, 8]
    # row 1's three decode calls after its fast tools ran while row 0's 1 s tool was running
    assert out.turn_stats[0]["tool_overlap_s"] >= 2 * SlowDecode.DECODE_S
    assert len(engine.spans) == 5  # both rows, row 1 three times, then row 0's answer: no lockstep turns
    batch = batch_from_rollout(out, pad_token_id=tok.pad_token_id)
    batch.meta = {k: [st[k] for st in out.turn_stats] for k in out.turn_stats[0]}
    m = turn_metrics(batch)
    assert 0.2 < m["agent/tool_overlap_ratio"] <= 1.0
    # the loop was blocked on tools for less than the slow tool took: part of it was hidden behind decoding
    assert m["timing_s/tool"] < out.turn_stats[0]["tool_s"] - SlowDecode.DECODE_S


def test_rollout_worker_continues_tool_trajectories_across_a_weight_sync(tmp_path) -> None:
    """The fully-async rollouter (in this process, no Ray): a sync lands while tools run; every
    trajectory finishes under the new weights, each token tagged with the version that sampled it."""
    from tests.helpers.configs import tiny_config
    from trainer.distributed.rollout_worker import RolloutWorker

    p = ToolPolicy(code=SLOW)
    folder = p.save(tmp_path / "policy")
    cfg = tiny_config(str(tmp_path / "run"), model={"path": folder, "dtype": "float32"},
                      data={"train_files": "synthetic:arithmetic-easy?num=16&num_val=4", "max_response_length": 80},
                      rollout={"n": 2}, trainer={"mode": "fully_async", "test_freq": 0},
                      agent={"enable": True, "max_turns": 3}, **{"async": {"partial_rollout": True}})
    worker = RolloutWorker(cfg, max_required_groups=2, groups_per_call=2)
    agent = worker.engine
    started = threading.Event()
    run_tool = agent.run_tool
    agent.run_tool = lambda call: (started.set(), run_tool(call))[1]
    worker.start()
    try:
        assert started.wait(120), "no tool call started"
        worker.begin_sync()  # interrupts the tool loop: running calls finish, queued ones wait for the new weights
        assert len(worker.pending) == 2 and not worker.queue  # both groups are mid-trajectory
        worker.engine.update_weights(p.named_weights(1))  # what receive_weights does after the broadcast
        worker.end_sync(1)
        groups = worker.get_groups(2)[0]
    finally:
        worker.stop()
    obs = agent.observation_ids("42")
    for facts, batch in groups:
        assert facts["start_version"] == 0 and facts["end_version"] == [1, 1] and facts["interrupted"]
        assert batch.meta["num_turns"] == [4, 4] and batch.meta["tool_calls"] == [1, 1]
        assert batch.meta["finish_reason"] == ["stop", "stop"]
        for j in range(2):
            ids = batch.responses[j][batch.attention_mask[j, -batch.responses.shape[1]:].bool()].tolist()
            assert ids == [p.call, *obs, p.so, p.answers[1], p.eos]  # answered by the new weights
            versions = facts["token_versions"][j]
            assert versions[0] == 0 and versions[-3:] == [1, 1, 1]  # the call by version 0, the answer by 1
            assert batch.response_mask[j, : len(ids)].tolist() == [1] + [0] * len(obs) + [1, 1, 1]


# ---------------------------------------------------------------- SGLang, through its fakes (sglang is not installed here)
def sglang_agent(p: ToolPolicy, **agent_cfg):
    """The agent loop on `SGLangRolloutEngine` over the SGLang-shaped fake of tests/helpers/engines.py,
    whose requests follow the policy's script for the weights version it was sent last (log-prob -0.01)."""
    from tests.helpers.engines import FakeSGLangEngine
    from trainer.rollout.sglang_engine import SGLangRolloutEngine

    fake = FakeSGLangEngine()

    def script(row: list[int], sp: dict) -> tuple[list[int], list[float], str]:
        table = p.table(sum(1 for c in fake.calls if c[0] == "update" and c[2]))
        out, last = [], row[-1]
        while len(out) < sp["max_new_tokens"] and (not out or out[-1] not in sp["stop_token_ids"]):
            last = table.get(last, p.eos)
            out.append(last)
        return out, [-0.01] * len(out), "stop" if out[-1] in sp["stop_token_ids"] else "length"
    fake.script = script
    engine = SGLangRolloutEngine(fake, eos_token_ids=[p.eos])
    return FlagAgent(engine, p.tok, AgentConfig(enable=True, **agent_cfg)), engine, fake


def test_sglang_tool_loop_interrupted_between_turns_and_mid_segment() -> None:
    p = ToolPolicy(code=SLOW)
    agent, engine, fake = sglang_agent(p)
    obs = agent.observation_ids("42")
    whole = agent.generate([p.prompt()], params(p))
    assert whole.response_ids == [[p.call, *obs, p.so, p.answers[0], p.eos]] and whole.finish_reasons == ["stop"]
    assert whole.turn_stats[0]["num_turns"] == 4 and not fake.aborted
    # a sync while the tool runs
    agent.tool_started.clear()
    out = agent.generate([p.prompt()], params(p), should_stop=agent.tool_started.is_set)
    assert out.finish_reasons == ["abort"] and out.response_ids[0] == [p.call, *obs]
    engine.update_weights(p.named_weights(1))
    cont = resume(agent, p, out, [0])
    assert cont.response_ids[0] == [p.call, *obs, p.so, p.answers[1], p.eos]
    assert cont.token_versions[0] == [0] * (1 + len(obs)) + [1, 1, 1] and cont.turn_stats[0]["num_turns"] == 4
    # mid-segment: SGLang's own abort (tokenizer_manager.abort_request) after the answer's first streamed token
    agent2, engine2, fake2 = sglang_agent(p)
    agent2.inner = InterruptInAnswer(engine2, p.obs_end, steps=0)  # should_stop is checked after each chunk
    out = agent2.generate([p.prompt()], params(p), should_stop=lambda: False)
    assert fake2.aborted and out.finish_reasons == ["abort"] and out.response_ids[0] == [p.call, *obs, p.so]
    engine2.update_weights(p.named_weights(1))
    cont = resume(agent2, p, out, [0])
    assert cont.response_ids[0] == [p.call, *obs, p.so, p.answers[1], p.eos]
    assert cont.token_versions[0] == [0] * (2 + len(obs)) + [1, 1] and cont.turn_stats[0]["num_turns"] == 4
