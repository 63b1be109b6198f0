"""Multi-turn tool use (ReTool): tool-call parsing, a sandboxed Python tool, and the agent rollout loop.

    tool_call.py  parse <tool_call>{...}</tool_call>, validate against the tool schema
    sandbox.py    the tool's sandbox: a warm zygote forking one confined process per call, its self-test
    zygote.py     the zygote and per-call supervisor (run as its own interpreter)
    confine.py    the confinement layers: rlimits, uid, Landlock, seccomp, cgroups
    loop.py       AgentRolloutEngine: generate -> run tool -> append masked observation -> continue, on any
                  InterruptibleEngine; tool calls overlap decoding; interruptible and resumable (partial rollout)
    trajectory.py one trajectory's tokens, mask, versions and turn counts; resuming one from its tokens
    prompts.py    the tool-format system prompt and row rewriting

Enable with `agent.enable=true` (see `trainer.config.AgentConfig`).

May import: `trainer.errors`, `trainer.config`, `trainer.rollout.base` (the engine interface it drives).
"""

from trainer.agent.loop import AgentRolloutEngine
from trainer.agent.prompts import TOOL_SYSTEM_PROMPT, with_tool_prompt
from trainer.agent.sandbox import ToolResult, format_observation, run_python, sandbox_layers
from trainer.agent.tool_call import ToolCall, parse_tool_calls

__all__ = [
           "TOOL_SYSTEM_PROMPT",
           "AgentRolloutEngine",
           "ToolCall",
           "ToolResult",
           "format_observation",
           "parse_tool_calls",
           "run_python",
           "sandbox_layers",
           "with_tool_prompt",
]
