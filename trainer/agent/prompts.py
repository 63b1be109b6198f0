"""Turn prompt rows into tool-use prompts: a system message that teaches the call format, and
optionally a different reward (`agent.system_prompt`, `agent.data_source`).

ReTool trains a model that was first SFT-ed on tool-use traces, so its prompts need no format
instructions. A model without that SFT (SmolLM2-135M-Instruct on CPU) only calls a tool if the
prompt shows how; `TOOL_SYSTEM_PROMPT` is the prompt the cpu config uses: the tool, the exact
call syntax, where the output appears, the answer line, and one worked example.

`with_tool_prompt(rows, system_prompt=..., data_source=...)` returns copies of verl-format rows
with the system message put first (replacing a system message the row already has) and
`data_source` replaced when given. Rows are never modified in place. `agent_rows(cfg, *splits)`
applies an `AgentConfig` to each split (the rows unchanged when `agent.enable` is false); the
single-process loop and the Ray colocated driver both use it.
"""

from __future__ import annotations

import copy
from typing import Any

TOOL_SYSTEM_PROMPT = """You can run Python code. To run code, write a tool call on its own line:
<tool_call>{"name": "execute_python_code", "arguments": {"code": "print(12 * 34 + 5)"}}</tool_call>
The output comes back between <tool_response> and </tool_response>. Then write the final line:
Answer: \\boxed{413}"""


def with_tool_prompt(rows: list[dict[str, Any]], *, system_prompt: str | None,
                     data_source: str | None = None) -> list[dict[str, Any]]:
    """Copies of `rows` with `system_prompt` as the first message and `data_source` replaced (when given)."""
    out = []
    for row in rows:
        row = copy.deepcopy(row)
        if system_prompt is not None:
            messages = [m for m in row["prompt"] if m.get("role") != "system"]
            row["prompt"] = [{"role": "system", "content": system_prompt}, *messages]
        if data_source is not None:
            row["data_source"] = data_source
        out.append(row)
    return out


def agent_rows(cfg: Any, *splits: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ...]:
    """Each split rewritten for tool use by the agent config `cfg` (unchanged when it is disabled)."""
    if not cfg.enable:
        return splits
    system = TOOL_SYSTEM_PROMPT if cfg.system_prompt == "builtin" else cfg.system_prompt
    return tuple(with_tool_prompt(rows, system_prompt=system, data_source=cfg.data_source) for rows in splits)
