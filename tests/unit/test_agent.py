"""Multi-turn tool use: call parsing, the sandbox, and the agent loop on a scripted engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from trainer.agent.loop import OBS_CLOSE, OBS_OPEN, AgentRolloutEngine
from trainer.agent.prompts import TOOL_SYSTEM_PROMPT, with_tool_prompt
from trainer.agent.sandbox import format_observation, run_python
from trainer.agent.tool_call import parse_tool_calls
from trainer.algorithms.aggregation import agg_loss
from trainer.components.batch import batch_from_rollout
from trainer.config import AgentConfig, load_config
from trainer.data.tiny_tokenizer import build_tiny_tokenizer
from trainer.errors import ConfigError
from trainer.rollout.base import InterruptibleEngine, SamplingParams


def _call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "execute_python_code", "arguments": {"code": code}}) + "</tool_call>"


# ----------------------------------------------------------------------------- parsing

def test_parse_valid_call() -> None:
    calls = parse_tool_calls("Let me compute.\n" + _call("print(12 * 34)") + "\nmore")
    assert len(calls) == 1 and calls[0].ok
    assert calls[0].name == "execute_python_code"
    assert calls[0].arguments == {"code": "print(12 * 34)"}


def test_parse_fenced_and_string_arguments() -> None:
    fenced = '<tool_call>\n```json\n{"name": "execute_python_code", "arguments": {"code": "x=1"}}\n```\n</tool_call>'
    stringly = '<tool_call>{"name": "execute_python_code", "arguments": "{\\"code\\": \\"y=2\\"}"}</tool_call>'
    assert parse_tool_calls(fenced)[0].arguments == {"code": "x=1"}
    assert parse_tool_calls(stringly)[0].arguments == {"code": "y=2"}


def test_parse_malformed_json() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "execute_python_code", "arguments": {"code": </tool_call>')
    assert not call.ok and call.error.startswith("Error: the tool call is not valid JSON")


def test_parse_missing_code_gives_the_articles_validation_error() -> None:
    # the article's turn 2: `code` outside `arguments`
    (call,) = parse_tool_calls('<tool_call>{"name": "execute_python_code", "code": "print(1)"}</tool_call>')
    assert not call.ok
    assert call.error.startswith("Error: Validation failed for input parameters: 1 validation error")
    assert "code" in call.error and "Field required" in call.error


def test_parse_unknown_tool_and_non_object() -> None:
    (unknown,) = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>')
    (array,) = parse_tool_calls("<tool_call>[1, 2]</tool_call>")
    assert "unknown tool 'search'" in unknown.error
    assert "JSON object" in array.error


def test_parse_several_calls_and_unclosed() -> None:
    text = _call("print(1)") + " then " + _call("print(2)") + " and <tool_call>{\"name\": "
    calls = parse_tool_calls(text)
    assert [c.arguments["code"] for c in calls] == ["print(1)", "print(2)"]  # the unclosed one is not a call


# ----------------------------------------------------------------------------- sandbox

def test_sandbox_output_and_error() -> None:
    ok = run_python("print(12 * 34 + 5)")
    assert ok.ok and ok.stdout == "413\n"
    bad = run_python("print('before')\n1/0")
    assert not bad.ok and bad.returncode == 1
    obs = format_observation(bad, timeout_s=5)
    assert obs.startswith("before\n") and obs.endswith("ZeroDivisionError: division by zero")
    assert format_observation(run_python("x = 1"), timeout_s=5).startswith("(no output")


def test_sandbox_timeout() -> None:
    res = run_python("import time\ntime.sleep(30)", timeout_s=0.5)
    assert res.timed_out and res.returncode is None
    assert format_observation(res, timeout_s=0.5) == "Error: timed out after 0.5 s"


def test_sandbox_memory_limit() -> None:
    res = run_python("x = bytearray(600 * 1024 * 1024)\nprint('allocated')", memory_mb=200)
    assert not res.ok and "MemoryError" in res.stderr and "allocated" not in res.stdout


def test_sandbox_is_isolated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBENCH_SECRET", "s3cret")
    res = run_python("import os; print(os.environ.get('RLBENCH_SECRET')); print(os.getcwd())")
    out, cwd = res.stdout.splitlines()
    assert out == "None" and "rlbench-tool-" in cwd


# ----------------------------------------------------------------------------- the loop

class ScriptedEngine(InterruptibleEngine):
    """Returns pre-set texts, one per `decode_rows` call and row; log-prob of the k-th token is -(k+1)/100."""

    name = "scripted"

    def __init__(self, tokenizer, script: list[list[str]], eos_id: int) -> None:
        self.tok, self.script, self.eos_id = tokenizer, script, eos_id
        self.calls: list[tuple[list[list[int]], list[int], SamplingParams]] = []
        self.version = 3

    def decode_rows(self, rows, budgets, params, should_stop=None):
        texts = self.script[len(self.calls)]
        self.calls.append((rows, budgets, params))
        ids, lps, fin = [], [], []
        for text, budget in zip(texts, budgets):
            t = self.tok.encode(text, add_special_tokens=False) + [self.eos_id]
            t = t[:budget]
            ids.append(t)
            lps.append([-(k + 1) / 100 for k in range(len(t))])
            fin.append("stop" if t[-1] == self.eos_id else "length")
        return ids, lps, fin

    def update_weights(self, named_tensors) -> None:
        pass


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_agent_loop_masks_logprobs_turns(tok) -> None:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    seg1 = "Compute it. " + _call("print(6 * 7)")
    # row 0 calls the tool, then answers; row 1 answers at once (one turn)
    script = [[seg1 + " trailing junk", "Answer: 5"], ["Answer: \\boxed{42}"]]
    inner = ScriptedEngine(tok, script, eos)
    agent = AgentRolloutEngine(inner, tok, AgentConfig(enable=True, max_turns=3))
    prompts = [_enc(tok, "What is 6 * 7?"), _enc(tok, "What is 2 + 3?")]
    out = agent.generate(prompts, SamplingParams(n=1, max_new_tokens=200, stop_token_ids=[eos]))

    s1, obs = _enc(tok, seg1), agent.observation_ids("42")
    s2 = _enc(tok, "Answer: \\boxed{42}") + [eos]
    assert tok.decode(out.response_ids[0]) == seg1 + OBS_OPEN + "42" + OBS_CLOSE + "Answer: \\boxed{42}<|im_end|>"
    assert out.response_ids[0] == s1 + obs + s2  # the junk after </tool_call> is dropped
    assert out.response_mask[0] == [1] * len(s1) + [0] * len(obs) + [1] * len(s2)
    # sampled tokens keep the engine's log-probs (per segment), observation tokens get 0
    assert out.response_logprobs[0] == ([-(k + 1) / 100 for k in range(len(s1))] + [0.0] * len(obs)
                                        + [-(k + 1) / 100 for k in range(len(s2))])
    assert out.response_mask[1] == [1] * len(out.response_ids[1])
    counts = [{k: st[k] for k in ("num_turns", "tool_calls", "tool_errors")} for st in out.turn_stats]
    assert counts == [{"num_turns": 4, "tool_calls": 1, "tool_errors": 0},
                      {"num_turns": 2, "tool_calls": 0, "tool_errors": 0}]
    # sandbox time of row 0's call; row 1 ran no tool; the loop's wait for it (nothing else to decode) goes to
    # row 0, and no decode call ran while it ran (row 1 was done)
    assert out.turn_stats[0]["tool_s"] > 0 and out.turn_stats[1]["tool_s"] == 0
    assert 0 < out.turn_stats[0]["tool_wall_s"] <= out.turn_stats[0]["tool_s"] + 0.05
    assert out.turn_stats[1]["tool_wall_s"] == 0 and out.turn_stats[0]["tool_overlap_s"] == 0
    assert out.finish_reasons == ["stop", "stop"] and out.policy_version == [3, 3]
    # turn 2 continues only row 0, from its whole context, with the budget left
    (ctx,), (budget,), params = inner.calls[1]
    assert ctx == prompts[0] + s1 + obs and params.n == 1
    assert budget == 200 - len(s1) - len(obs)
    assert out.token_versions == [[3] * len(out.response_ids[0]), [3] * len(out.response_ids[1])]


def test_observation_tokens_never_count_in_the_loss(tok) -> None:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    seg1 = _call("print('x' * 500)")  # long output: cut to max_observation_tokens
    agent = AgentRolloutEngine(ScriptedEngine(tok, [[seg1], ["ok"]], eos), tok,
                               AgentConfig(enable=True, max_turns=2, max_observation_tokens=5))
    out = agent.generate([_enc(tok, "hi")], SamplingParams(max_new_tokens=300, stop_token_ids=[eos]))
    obs_len = len(agent._open_ids) + 5 + len(agent._close_ids)
    assert out.response_mask[0].count(0) == obs_len
    batch = batch_from_rollout(out, pad_token_id=tok.pad_token_id)
    mask = batch.response_mask  # [1, R]
    obs_cols = (mask[0] == 0).nonzero().squeeze(-1)[:obs_len]
    assert batch.rollout_logprobs[0, obs_cols].abs().sum() == 0
    # a per-token loss that is huge on observation tokens leaves the aggregated loss unchanged
    loss = torch.ones_like(mask)
    loss_poisoned = loss.clone()
    loss_poisoned[0, obs_cols] = 1e6
    assert agg_loss(loss_poisoned, mask, "token-mean") == agg_loss(loss, mask, "token-mean") == 1.0


def test_malformed_call_returns_error_and_last_turn_call_not_run(tok) -> None:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    bad = '<tool_call>{"name": "execute_python_code", "code": "print(1)"}</tool_call>'
    agent = AgentRolloutEngine(ScriptedEngine(tok, [[bad], [_call("print(2)")]], eos), tok,
                               AgentConfig(enable=True, max_turns=2))
    out = agent.generate([_enc(tok, "q")], SamplingParams(max_new_tokens=400, stop_token_ids=[eos]))
    text = tok.decode(out.response_ids[0])
    assert OBS_OPEN + "Error: Validation failed for input parameters" in text
    assert text.endswith(_call("print(2)"))  # written in the last turn: counted, not executed
    assert {k: out.turn_stats[0][k] for k in ("num_turns", "tool_calls", "tool_errors")} == \
        {"num_turns": 4, "tool_calls": 2, "tool_errors": 1}


def test_total_response_respects_the_budget(tok) -> None:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    seg1 = _call("print(123456789 * 987654321)")
    budget = len(_enc(tok, seg1)) + 6  # room for part of the observation only
    agent = AgentRolloutEngine(ScriptedEngine(tok, [[seg1]], eos), tok, AgentConfig(enable=True, max_turns=4))
    out = agent.generate([_enc(tok, "q")], SamplingParams(max_new_tokens=budget, stop_token_ids=[eos]))
    assert len(out.response_ids[0]) == budget and out.finish_reasons == ["length"]
    assert out.response_mask[0][-6:] == [0] * 6


def test_tool_prompt_rows_and_config_checks() -> None:
    rows = [{"data_source": "synthetic/arithmetic", "prompt": [{"role": "system", "content": "old"},
                                                               {"role": "user", "content": "What is 1 + 2?"}]}]
    out = with_tool_prompt(rows, system_prompt=TOOL_SYSTEM_PROMPT, data_source="retool")
    assert out[0]["prompt"][0] == {"role": "system", "content": TOOL_SYSTEM_PROMPT}
    assert out[0]["prompt"][1:] == [rows[0]["prompt"][1]] and out[0]["data_source"] == "retool"
    assert rows[0]["data_source"] == "synthetic/arithmetic"  # input untouched
    cfg = load_config(None, ["agent.enable=true", "trainer.mode=fully_async"])  # partial rollout of tool loops
    assert cfg.async_.partial_rollout
    with pytest.raises(ConfigError, match="agent.max_turns"):
        load_config(None, ["agent.max_turns=0"])


# ----------------------------------------------------------------------------- sandbox guard, timing, training

def test_multi_turn_training_refuses_an_unisolated_sandbox(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json as _json

    import trainer.agent.sandbox as sbx

    class Unisolated:
        layers: ClassVar[dict] = {"in_force": ["rlimits", "subreaper", "disk"], "isolating": False, "details": {},
                  "not_in_force": {"seccomp": "ModuleNotFoundError: No module named 'pyseccomp'"}}

    monkeypatch.setattr(sbx, "_SHARED", Unisolated())
    with pytest.raises(ConfigError, match="agent.sandbox_allow_unisolated=true"):
        sbx.check_isolation(AgentConfig(enable=True), tmp_path)
    assert _json.loads((tmp_path / "env.json").read_text())["sandbox"]["isolating"] is False  # recorded even so
    layers = sbx.check_isolation(AgentConfig(enable=True, sandbox_allow_unisolated=True), tmp_path)
    assert layers["in_force"] == ["rlimits", "subreaper", "disk"]


def test_sandbox_layers_in_env_json_and_turn_metrics(tmp_path, tok) -> None:
    import json as _json

    from trainer.agent.sandbox import sandbox_layers
    from trainer.modes.steps import turn_metrics

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    (tmp_path / "env.json").write_text(_json.dumps({"python": "3"}))
    # the fast failing call's row answers while the slow call still runs; then the slow row answers
    script = [[_call("import time; time.sleep(0.3); print(1)"), _call("1/0")], ["b"], ["a"]]
    agent = AgentRolloutEngine(ScriptedEngine(tok, script, eos), tok, AgentConfig(enable=True, max_turns=2),
                               out_dir=str(tmp_path))
    env = _json.loads((tmp_path / "env.json").read_text())
    assert env["python"] == "3" and env["sandbox"] == sandbox_layers() and env["sandbox"]["isolating"]
    out = agent.generate([_enc(tok, "q")], SamplingParams(n=2, max_new_tokens=300, stop_token_ids=[eos]))
    batch = batch_from_rollout(out, pad_token_id=tok.pad_token_id)
    batch.meta = {k: [st[k] for st in out.turn_stats] for k in out.turn_stats[0]}
    m = turn_metrics(batch)
    assert m["agent/tool_errors/total"] == 1 and m["agent/tool_calls/mean"] == 1
    assert m["agent/tool_error_ratio"] == 0.5  # 1 of the 2 calls failed: a per-call rate, not a count
    assert 0.25 <= m["timing_s/tool"] and 0.15 <= m["agent/tool_seconds/mean"] <= m["timing_s/tool"]


class HostileEngine(InterruptibleEngine):
    """Every response calls the tool once with one of `PROGRAMS` (by row), then answers."""

    name = "hostile"
    PROGRAMS: ClassVar[list[str]] = [
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        "open('/etc/shadow').read()",
        "import os\nwhile True:\n    os.fork()",
        "while True:\n    pass",
        "x = b'x' * (2 << 30)",
        "import os\nos.kill(os.getppid(), 9)\nraise SystemExit(3)",
        "open('/tmp/rlbench-hostile-train', 'w').write('x')",
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parents[2])!r})\nimport trainer",
    ]

    def __init__(self, tok, eos_id: int) -> None:
        self.tok, self.eos_id, self.version = tok, eos_id, 0

    def decode_rows(self, rows, budgets, params, should_stop=None):
        ids, lps = [], []
        for i, (p, budget) in enumerate(zip(rows, budgets)):
            text = "Answer: \\boxed{3}" if "<tool_response>" in self.tok.decode(p) else \
                _call(self.PROGRAMS[i % len(self.PROGRAMS)])
            t = (self.tok.encode(text, add_special_tokens=False) + [self.eos_id])[:budget]
            ids.append(t)
            lps.append([-0.5] * len(t))
        return ids, lps, ["stop"] * len(ids)

    def update_weights(self, named_tensors) -> None:
        for _ in named_tensors:
            pass


def test_hostile_tool_code_inside_a_training_run(make_config) -> None:
    from trainer.components.metrics import read_metrics
    from trainer.modes.colocated import train_colocated
    from trainer.modes.steps import build_components

    cfg = make_config(agent={"enable": True, "max_turns": 2, "tool_timeout_s": 1.0, "max_parallel_tools": 4},
                      data={"max_response_length": 256, "max_prompt_length": 96},
                      trainer={"total_steps": 2, "test_freq": 0})
    c = build_components(cfg)
    eos = c.eos_ids[0]
    c.engine.inner = HostileEngine(c.tokenizer, eos)
    lines = [m["data"] for m in read_metrics(train_colocated(c)) if "agent/tool_errors/total" in m["data"]]
    assert len(lines) == 2  # the run finished both steps
    n = cfg.data.train_batch_size * cfg.rollout.n
    for m in lines:
        assert m["agent/tool_calls/mean"] == 1.0
        assert m["agent/tool_errors/total"] == n  # every hostile program failed inside the sandbox
        assert m["timing_s/tool"] > 0 and m["num_turns/mean"] == 4.0
    assert not __import__("os").path.exists("/tmp/rlbench-hostile-train")
