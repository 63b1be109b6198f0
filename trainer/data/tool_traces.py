"""Synthetic tool-use trajectories for a supervised warm start: arithmetic solved by calling Python.

The case study's policy was SFT-ed on tool-use traces before RL. This module writes such traces
for the synthetic arithmetic problems of `trainer.data.synthetic`, token for token in the layout
the multi-turn loop (`trainer.agent.loop`) produces, so a model trained on them continues a
rollout the way it was shown:

    tool trace (a fraction `tool_fraction` of the rows)
      <tool_call>{"name": "execute_python_code", "arguments": {"code": "print(12 * 34 + 56)"}}</tool_call>   mask 1
      \\n<tool_response>\\n464\\n</tool_response>\\n                                                     mask 0
      Answer: \\boxed{464}<eos>                                                                     mask 1
    direct trace (the rest)
      Answer: \\boxed{464}<eos>                                                                     mask 1

The call is the Miles JSON call inside Hermes/Qwen ``<tool_call>`` tags (what
`trainer.agent.tool_call` parses); the observation is what the sandbox returns for that program
(`format_observation` of its stdout, the program's value plus a newline), wrapped as the loop
wraps it and cut to `max_observation_tokens`. Observation tokens have mask 0: the warm start does
not train on text the tool writes, as RL does not. Direct traces carry the right answer too; on
multi-digit problems a small model cannot compute it without the tool, so a warm start with both
kinds leaves a policy that calls the tool only sometimes: RL has the tool habit to learn.

    rows, traces = tool_trace_examples(tokenizer, num=256, difficulty="hard", tool_fraction=0.6, seed=0)
    traces[0].prompt_ids, traces[0].response_ids, traces[0].response_mask, traces[0].uses_tool

Prompts are the rows' chat-templated user message (`tokenize_prompt`, as `PromptDataset` builds them).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from trainer.data.chat import tokenize_prompt
from trainer.data.synthetic import evaluate, make_arithmetic_rows


@dataclass
class ToolTrace:
    """One supervised example: prompt tokens, response tokens, and which response tokens are trained on."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1: the policy writes it (trained), 0: the tool wrote it (context only)
    uses_tool: bool


def call_text(code: str) -> str:
    """The tool call the loop stops at (``</tool_call>`` ends the assistant segment)."""
    from trainer.agent.tool_call import PYTHON_TOOL_NAME, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

    return TOOL_CALL_OPEN + json.dumps({"name": PYTHON_TOOL_NAME, "arguments": {"code": code}}) + TOOL_CALL_CLOSE


def answer_text(value: str) -> str:
    """The final line the ReTool reward reads (strict ``\\boxed{}``)."""
    return f"Answer: \\boxed{{{value}}}"


def expression(row: dict[str, Any]) -> str:
    """``12 * 34 + 56`` from a synthetic arithmetic row's operands and operators."""
    info = row["extra_info"]
    ops, vals = info["operators"], info["operands"]
    return str(vals[0]) + "".join(f" {op} {v}" for op, v in zip(ops, vals[1:]))


def trace_for_row(row: dict[str, Any], tokenizer: Any, *, uses_tool: bool, max_observation_tokens: int,
                  eos_token_id: int) -> ToolTrace:
    """The trace of one row: its prompt, then a tool round trip and the answer, or the answer alone."""
    from trainer.agent.loop import OBS_CLOSE, OBS_OPEN

    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))
    prompt_ids = tokenize_prompt(tokenizer, row["prompt"])
    value = str(evaluate(row["extra_info"]["operands"], row["extra_info"]["operators"]))
    ids: list[int] = []
    mask: list[int] = []
    if uses_tool:
        call = enc(call_text(f"print({expression(row)})"))
        obs = enc(OBS_OPEN) + enc(value)[:max_observation_tokens] + enc(OBS_CLOSE)  # stdout "464\n" -> "464"
        ids += call + obs
        mask += [1] * len(call) + [0] * len(obs)
    answer = enc(answer_text(value)) + [eos_token_id]
    ids += answer
    mask += [1] * len(answer)
    return ToolTrace(prompt_ids, ids, mask, uses_tool)


def tool_trace_examples(tokenizer: Any, *, num: int, difficulty: str, tool_fraction: float, seed: int,
                        max_observation_tokens: int = 64, eos_token_id: int | None = None
                        ) -> tuple[list[dict[str, Any]], list[ToolTrace]]:
    """`num` training-split rows and their traces; round(num * tool_fraction) of them (chosen at random) call the tool."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    rows = make_arithmetic_rows(num, difficulty=difficulty, seed=seed, split="train")
    order = list(range(num))
    random.Random(f"tool-traces/{seed}").shuffle(order)
    with_tool = set(order[: round(num * tool_fraction)])
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    traces = [trace_for_row(r, tokenizer, uses_tool=i in with_tool, max_observation_tokens=max_observation_tokens,
                            eos_token_id=eos) for i, r in enumerate(rows)]
    return rows, traces
