"""One multi-turn tool-use trajectory as the agent loop builds it, and how one resumes from its tokens.

A trajectory is a prompt and one response token stream: assistant segments (mask 1, the log-prob
and policy version of the weights that sampled each token) interleaved with tool observations
(mask 0, log-prob 0, the version in force when they were appended). `Trajectory` holds that
stream, its turn counts (`stats`, the keys of `TURN_KEYS`) and where it stands:

    decode          the next tokens come from the engine: a new segment, or (``open``) more of a
                    segment an interrupt cut short, whose tokens extend it (no new turn)
    call            a complete tool call ends the last segment and its observation is not yet
                    appended: the tool runs next (``call`` holds the parsed call)
    done            EOS, the token budget, a call in the last allowed turn (counted, not run), or
                    an observation that filled the budget

Everything but the timing counters is a function of the tokens, so a trajectory interrupted at a
weight sync (fully-async partial rollout) is rebuilt from what the rollout worker keeps
(`Trajectory.resume`: response ids, log-probs, versions, mask, turn counts): the number of
segments is the number of mask-1 runs; a last run that ends exactly where ``</tool_call>`` is
first complete is a call whose tool has not run; any other last run is an open segment; a last
observation (or no response yet) means a new segment is next.

Counting (verl's `num_turns`): 1 for the prompt, +1 when a segment gets its first token, +1 per
observation. A segment interrupted before its first token is not counted (it starts again after
the sync), so counts never double across an interruption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.agent.tool_call import TOOL_CALL_CLOSE, ToolCall, last_tool_call

# per-trajectory counters (`Rollout.turn_stats`); trainer.modes.steps and the rollout worker copy them into batch.meta
TURN_KEYS = ("num_turns", "tool_calls", "tool_errors", "tool_s", "tool_wall_s", "tool_overlap_s")


def fresh_stats() -> dict[str, Any]:
    return {"num_turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_s": 0.0, "tool_wall_s": 0.0,
            "tool_overlap_s": 0.0}


def unclosed_call_error() -> ToolCall:
    return ToolCall(None, {}, "", error=f"Error: {TOOL_CALL_CLOSE} without a matching <tool_call>")


@dataclass(eq=False)  # compared by identity
class Trajectory:
    prompt: list[int]
    budget: int  # max response tokens, observations included
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=fresh_stats)
    segments: int = 0  # assistant segments with at least one token
    seg_start: int = 0  # index in `ids` where the last segment starts
    open: bool = False  # the last segment was cut short by an interrupt: new tokens extend it
    call: ToolCall | None = None  # a call whose observation is not appended yet
    done: bool = False
    finish: str = "abort"  # once done: "stop" or "length"

    @property
    def left(self) -> int:
        return self.budget - len(self.ids)

    @property
    def decoding(self) -> bool:
        return not self.done and self.call is None

    def context(self) -> list[int]:
        return self.prompt + self.ids

    # ------------------------------------------------------------ building
    def add_segment(self, toks: list[int], lps: list[float], reason: str, version: int, *, max_turns: int,
                    cut_at_call: Callable[[list[int]], int | None], decode: Callable[[list[int]], str]) -> None:
        """Append what the engine sampled for this trajectory (`reason` is its finish reason)."""
        if not self.open:
            if not toks and reason == "abort":
                return  # interrupted before the segment's first token: it starts again later
            self.seg_start = len(self.ids)
            self.segments += 1
            self.stats["num_turns"] += 1
        self.ids += toks
        self.lps += list(lps)
        self.vers += [version] * len(toks)
        self.mask += [1] * len(toks)
        cut = cut_at_call(self.ids[self.seg_start:])
        if cut is None:
            self.open = reason == "abort"
            if not self.open:
                self.done, self.finish = True, reason
            return
        end = self.seg_start + cut  # what was sampled after the closing tag is dropped with its log-probs
        del self.ids[end:], self.lps[end:], self.vers[end:], self.mask[end:]
        self.open = False
        self.stats["tool_calls"] += 1
        call = last_tool_call(decode(self.ids[self.seg_start:])) or unclosed_call_error()
        if self.segments < max_turns and len(self.ids) < self.budget:
            self.call = call
        else:  # a call in the last allowed turn (or at the budget) is counted, not run
            self.done, self.finish = True, "stop"

    def add_observation(self, obs: list[int], is_error: bool, seconds: float, version: int) -> None:
        """Append the tool's wrapped output (mask 0); an observation that fills the budget ends the trajectory."""
        self.call = None
        self.stats["tool_errors"] += int(is_error)
        self.stats["tool_s"] += seconds
        self.stats["num_turns"] += 1
        room = self.left
        if len(obs) >= room:  # no room left to answer
            obs = obs[:room]
            self.done, self.finish = True, "length"
        self.ids += obs
        self.lps += [0.0] * len(obs)
        self.vers += [version] * len(obs)
        self.mask += [0] * len(obs)

    # ------------------------------------------------------------ resuming
    @classmethod
    def resume(cls, prompt: list[int], budget: int, ids: list[int], lps: list[float], vers: list[int],
               mask: list[int], stats: dict[str, Any], *, cut_at_call: Callable[[list[int]], int | None],
               decode: Callable[[list[int]], str]) -> Trajectory:
        """The trajectory an interrupted response stands for (module docstring)."""
        if not (len(ids) == len(lps) == len(vers) == len(mask)):
            raise ValueError(f"agent continue_generation: a partial response has {len(ids)} tokens, {len(lps)} "
                             f"log-probs, {len(vers)} versions and {len(mask)} mask entries (they must agree)")
        if len(ids) >= budget:
            raise ValueError("agent continue_generation: a partial response already has max_new_tokens tokens")
        t = cls(prompt=list(prompt), budget=budget, ids=list(ids), lps=list(lps), vers=list(vers), mask=list(mask),
                stats={**fresh_stats(), **stats})
        t.segments = sum(1 for k, m in enumerate(mask) if m == 1 and (k == 0 or mask[k - 1] != 1))
        if not mask or mask[-1] != 1:
            return t  # nothing yet, or an observation last: a new segment is next
        start = len(mask)
        while start > 0 and mask[start - 1] == 1:
            start -= 1
        t.seg_start = start
        seg = t.ids[t.seg_start:]
        if cut_at_call(seg) == len(seg):
            t.call = last_tool_call(decode(seg)) or unclosed_call_error()
        else:
            t.open = True
        return t
