"""Parse tool calls out of generated text and validate them against the Python tool's schema.

The model calls the tool the way Qwen2.5's chat format and the ReTool/Miles recipes do:

    <tool_call>{"name": "execute_python_code", "arguments": {"code": "print(12 * 34)"}}</tool_call>

`parse_tool_calls(text)` returns one `ToolCall` per ``<tool_call>...</tool_call>`` span (in order);
a span whose body is not a JSON object, names no tool, or whose arguments fail the schema still
yields a `ToolCall`, with `error` set to the message the tool returns as its output. That is what
the published sample trajectory shows: a call that passes `code` outside `arguments` comes back as

    Error: Validation failed for input parameters: 1 validation error for ExecutePythonCodeArgs
    code
      Field required [type=missing, ...]

so the policy sees (and can learn from) its own schema mistake instead of the rollout failing.
The argument schema is a pydantic model, so the message is pydantic's own.

Robustness: surrounding whitespace and a Markdown code fence (```json ... ```) inside the tags
are accepted; `arguments` may also be a JSON-encoded string (as some chat templates emit).
An opening tag with no closing tag (generation ran out of tokens) is not a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
PYTHON_TOOL_NAME = "execute_python_code"

_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.DOTALL)


class ExecutePythonCodeArgs(BaseModel):
    """Arguments of `execute_python_code`: the program to run (its stdout is the tool output)."""

    model_config = ConfigDict(extra="forbid")
    code: str


@dataclass
class ToolCall:
    """One parsed call: `arguments` is validated when `error` is None, else `error` is the tool output."""

    name: str | None
    arguments: dict[str, Any]
    raw: str  # the text between the tags
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _strip_fence(body: str) -> str:
    body = body.strip()
    m = _FENCE_RE.match(body)
    return m.group(1).strip() if m else body


def validate_call(obj: Any, raw: str) -> ToolCall:
    """Check a decoded JSON value against the tool schema (see the module docstring)."""
    if not isinstance(obj, dict):
        return ToolCall(None, {}, raw, error=f"Error: a tool call must be a JSON object with 'name' and 'arguments' "
                                             f"(got {type(obj).__name__})")
    name = obj.get("name")
    if name != PYTHON_TOOL_NAME:
        return ToolCall(name if isinstance(name, str) else None, {}, raw,
                        error=f"Error: unknown tool {name!r} (available: {PYTHON_TOOL_NAME})")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # arguments serialized twice
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        args = {}
    try:
        parsed = ExecutePythonCodeArgs.model_validate(args)
    except ValidationError as e:
        return ToolCall(name, {}, raw, error=f"Error: Validation failed for input parameters: {e}")
    return ToolCall(name, parsed.model_dump(), raw)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every complete ``<tool_call>...</tool_call>`` in `text`, in order (malformed ones carry `error`)."""
    calls: list[ToolCall] = []
    for m in _CALL_RE.finditer(text):
        raw = m.group(1)
        body = _strip_fence(raw)
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall(None, {}, raw, error=f"Error: the tool call is not valid JSON ({e.msg} at line "
                                                       f"{e.lineno} column {e.colno})"))
            continue
        calls.append(validate_call(obj, raw))
    return calls


def last_tool_call(text: str) -> ToolCall | None:
    """The last complete call in `text` (a turn ends at its first closing tag, so it has at most one)."""
    calls = parse_tool_calls(text)
    return calls[-1] if calls else None
