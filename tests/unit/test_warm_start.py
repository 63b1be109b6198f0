"""The supervised warm start (`trainer/models/warm_start.py`) and its tool-use traces (`trainer/data/tool_traces.py`).

Tiny random-init models only: the traces' layout, the masked loss going down, the cache (built
once, then read), and the config errors that name `model.warm_start`.
"""

from __future__ import annotations

import json

import pytest
import torch

from trainer.agent.tool_call import last_tool_call
from trainer.config import ModelConfig, WarmStartConfig
from trainer.data.tiny_tokenizer import build_tiny_tokenizer
from trainer.data.tool_traces import tool_trace_examples
from trainer.errors import ConfigError, ModelError


def test_traces_match_the_tool_loop_layout_and_mix():
    tok = build_tiny_tokenizer()
    rows, traces = tool_trace_examples(tok, num=20, difficulty="hard", tool_fraction=0.7, seed=3,
                                       max_observation_tokens=64)
    assert sum(t.uses_tool for t in traces) == 14 and len(traces) == len(rows) == 20
    for row, t in zip(rows, traces):
        gt = row["reward_model"]["ground_truth"]
        text = tok.decode(t.response_ids, skip_special_tokens=True)
        assert text.endswith(f"Answer: \\boxed{{{gt}}}")
        assert t.response_ids[-1] == tok.eos_token_id and len(t.response_mask) == len(t.response_ids)
        if not t.uses_tool:
            assert set(t.response_mask) == {1} and "<tool_call>" not in text
            continue
        call = last_tool_call(text)
        assert call is not None and call.ok, text
        ops, vals = row["extra_info"]["operators"], row["extra_info"]["operands"]
        assert eval(call.arguments["code"].removeprefix("print(").removesuffix(")")) == int(gt)  # noqa: S307
        # the tool's output is context, not a target: exactly its tokens are mask 0, and they hold the value
        masked = [i for i, m in zip(t.response_ids, t.response_mask) if m == 0]
        assert tok.decode(masked).strip() == f"<tool_response>\n{gt}\n</tool_response>"
        assert len(vals) == 3 and len(ops) == 2


def test_observation_cut_like_the_rollout():
    tok = build_tiny_tokenizer()
    _, long = tool_trace_examples(tok, num=8, difficulty="hard", tool_fraction=1.0, seed=0, max_observation_tokens=64)
    _, short = tool_trace_examples(tok, num=8, difficulty="hard", tool_fraction=1.0, seed=0, max_observation_tokens=1)
    for a, b in zip(long, short):
        assert sum(1 for m in a.response_mask if m == 0) > sum(1 for m in b.response_mask if m == 0)


def test_warm_start_trains_caches_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBENCH_CACHE", str(tmp_path))
    from trainer.models.loading import load_model_and_tokenizer
    from trainer.models.warm_start import cache_folder, read_facts

    cfg = ModelConfig(path="tiny:llama", warm_start=WarmStartConfig(steps=6, batch_size=4, lr=3e-3, num_examples=16))
    base, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama"), seed=0)
    model, _ = load_model_and_tokenizer(cfg, seed=0)
    facts = read_facts(cfg, 0)
    assert facts is not None and facts["loss_last"] < facts["loss_first"]
    assert facts["setting"]["steps"] == 6 and facts["num_traces"] == 16
    assert 0.0 <= facts["tool_first_token_prob_before"] <= 1.0 and 0.0 <= facts["tool_first_token_prob_after"] <= 1.0
    # the returned model is the trained one, not the base
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), base.parameters()))
    assert diff > 0
    folder = cache_folder(cfg, 0)
    stamp = (folder / "warm_start.json").stat().st_mtime_ns
    again, _ = load_model_and_tokenizer(cfg, seed=0)  # from the cache: not rebuilt
    assert (folder / "warm_start.json").stat().st_mtime_ns == stamp
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    # another setting, or another random init of a tiny base, is another folder
    other = ModelConfig(path="tiny:llama", warm_start=WarmStartConfig(steps=7, batch_size=4, num_examples=16))
    assert cache_folder(other, 0) != folder and cache_folder(cfg, 1) != folder
    assert json.loads((folder / "warm_start.json").read_text())["tool_traces"] == round(16 * 0.6)


def test_config_errors_name_the_field(make_config):
    ws = {"warm_start": {"steps": 2}}
    with pytest.raises(ConfigError, match=r"model.warm_start.data=tool-arithmetic .* agent.enable is false"):
        make_config(model=ws)
    with pytest.raises(ConfigError, match=r"model.warm_start.max_observation_tokens=8 differs from "
                                          r"agent.max_observation_tokens=64"):
        make_config(model=ws, agent={"enable": True})
    with pytest.raises(ConfigError, match=r"model.warm_start.steps"):
        make_config(model={"warm_start": {"steps": 0}}, agent={"enable": True, "max_observation_tokens": 8})
    with pytest.raises(ConfigError, match=r"model.warm_start.tool_fraction"):
        make_config(model={"warm_start": {"tool_fraction": 1.5}}, agent={"enable": True, "max_observation_tokens": 8})
    cfg = make_config(model=ws, agent={"enable": True, "max_observation_tokens": 8})
    assert cfg.model.warm_start.steps == 2


def test_vision_language_models_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBENCH_CACHE", str(tmp_path))
    from trainer.models.loading import load_model_and_tokenizer

    with pytest.raises(ModelError, match=r"model.warm_start: tiny:qwen2.5-vl is a vision-language model"):
        load_model_and_tokenizer(ModelConfig(path="tiny:qwen2.5-vl", warm_start=WarmStartConfig(steps=1)))


def test_tool_call_ratio_counts_trajectories_with_a_call():
    from types import SimpleNamespace

    from trainer.modes.steps import turn_metrics

    meta = {"num_turns": [2, 4, 4, 2], "tool_calls": [0, 1, 2, 0], "tool_errors": [0, 1, 0, 0],
            "tool_s": [0.0] * 4, "tool_wall_s": [0.0] * 4}
    m = turn_metrics(SimpleNamespace(meta=meta))
    assert m["agent/tool_call_ratio"] == 0.5 and m["agent/tool_calls/mean"] == 0.75 and m["num_turns/mean"] == 3.0


def test_tool_first_prob_batched_equals_one_prompt_at_a_time():
    from trainer.agent.tool_call import TOOL_CALL_OPEN
    from trainer.models.loading import load_model_and_tokenizer
    from trainer.models.warm_start import tool_first_prob

    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:llama"), seed=0)
    prompts = [list(r.prompt_ids) for r in tool_trace_examples(tok, num=5, difficulty="hard", tool_fraction=0.5,
                                                               seed=0)[1]]
    prompts[0] = prompts[0][:-3]  # lengths differ, so the batch pads
    first = tok.encode(TOOL_CALL_OPEN, add_special_tokens=False)[0]
    with torch.no_grad():
        one = [float(torch.softmax(model(input_ids=torch.tensor([p])).logits[0, -1].float(), -1)[first]) for p in prompts]
    assert tool_first_prob(model, tok, prompts) == pytest.approx(sum(one) / len(one), rel=1e-4)
    assert tool_first_prob(model, tok, []) == 0.0
