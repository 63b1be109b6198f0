"""Multi-turn tool use as a rollout engine: generate, run the tool, append its output, continue.

`AgentRolloutEngine` wraps any `RolloutEngine` (the `hf` engine on CPU, vLLM/SGLang on GPUs) and
turns one `generate` call into the ReTool loop (Feng et al. 2025, "ReTool"; the Miles `retool`
example and verl's tool agent loop):

    for turn in 1..max_turns:                       # every sample still going, in one batch
        segment = engine.generate(prompt + response so far, n=1)   until </tool_call>, EOS or budget
        response += segment                          (mask 1, the engine's log-probs)
        if the segment ends in a tool call and turns remain:
            obs = run the call (sandboxed Python), or the validation error of a malformed call
            response += "\n<tool_response>\n" + obs + "\n</tool_response>\n"   (mask 0, log-prob 0)
        else: the sample is done

So the response is one token stream per sample, assistant segments interleaved with tool
observations, and `Rollout.response_mask` marks which tokens the policy sampled (1) and which the
tool wrote (0). The trainer computes log-probs over the whole stream (observations are context),
but losses, KL and entropy only count mask-1 tokens; rollout log-probs of observation tokens are 0.
The whole response, observations included, stays within `max_new_tokens`
(`data.max_response_length`): each turn gets the budget left, and an observation that does not
fit is cut and ends the sample (finish reason "length").

Stopping at ``</tool_call>``: when the tag is one token in the vocabulary (Qwen2.5 has it) its id
is a stop token; otherwise the engine may run past it and the segment is cut right after the
first token whose decoded prefix contains the tag (what follows was sampled after the call and
is dropped with its log-probs; a prefix's probability does not depend on what follows).

Per sample, `Rollout.turn_stats` records ``num_turns`` (verl's count: the user message, each
assistant segment and each tool response; a direct answer is 2, one tool round trip then an
answer is 4; the ReTool reward reads it), ``tool_calls`` (complete ``<tool_call>`` spans,
malformed ones included), ``tool_errors`` (calls whose output is an error: malformed, unknown
tool, non-zero exit, timeout, a sandbox limit), ``tool_s`` (the sandbox's own seconds for the
sample's calls) and ``tool_wall_s`` (the sample's share of the wall-clock time generation waited
for tools: each tool phase's time split evenly over the samples whose calls ran in it, so the sum
over a batch is the batch's tool wall time; `timing_s/tool`). A call written in the last allowed
turn is counted but not run.

The tool runs in `trainer.agent.sandbox` (a warm zygote, confined per call); building the engine
runs the sandbox's self-test, records its layers in ``<out_dir>/env.json`` and refuses to start
when no isolating layer is in force unless ``agent.sandbox_allow_unisolated`` is set.

Departures: observations are plain text inside the assistant turn (as Miles' retool example
does), not a chat-template tool role; `n` samples of a prompt are independent rows (no prefix
sharing across turns); the loop does not support interrupting a generation (`should_stop`), so
the fully-async mode runs it with `async.partial_rollout=false` only (the config rejects the
rest): a trajectory started before a weight sync finishes under the old weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from trainer.agent.sandbox import check_isolation, format_observation, get_sandbox
from trainer.agent.tool_call import TOOL_CALL_CLOSE, ToolCall, last_tool_call
from trainer.config import AgentConfig
from trainer.rollout.base import Rollout, RolloutEngine, SamplingParams

OBS_OPEN = "\n<tool_response>\n"
OBS_CLOSE = "\n</tool_response>\n"


class AgentRolloutEngine(RolloutEngine):
    """A `RolloutEngine` whose responses are multi-turn tool-use trajectories (module docstring)."""

    name = "agent"
    continue_generation = None  # no partial rollout: a trajectory is not resumed across a weight sync

    def __init__(self, inner: RolloutEngine, tokenizer: Any, cfg: AgentConfig, *, out_dir: str | None = None) -> None:
        self.inner = inner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.sandbox_layers = check_isolation(cfg, out_dir)  # self-test; refuses an unisolated machine
        ids = tokenizer.encode(TOOL_CALL_CLOSE, add_special_tokens=False)
        self.stop_ids = list(ids) if len(ids) == 1 else []  # the closing tag is one token: stop on it
        self._open_ids = list(tokenizer.encode(OBS_OPEN, add_special_tokens=False))
        self._close_ids = list(tokenizer.encode(OBS_CLOSE, add_special_tokens=False))

    # ------------------------------------------------------------ the wrapped engine
    def __getattr__(self, item: str) -> Any:  # generator, model, device, ... of the inner engine
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    @property
    def version(self) -> int:
        return self.inner.version

    @version.setter
    def version(self, value: int) -> None:
        self.inner.version = value

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()

    # ------------------------------------------------------------ the loop
    def cut_at_tool_call(self, tokens: list[int]) -> int | None:
        """Length of the shortest prefix of `tokens` whose text contains ``</tool_call>``; None if none does."""
        decode = lambda k: self.tokenizer.decode(tokens[:k], skip_special_tokens=False)
        if TOOL_CALL_CLOSE not in decode(len(tokens)):
            return None
        lo, hi = 1, len(tokens)  # invariant: the prefix of length hi contains the tag
        while lo < hi:
            mid = (lo + hi) // 2
            if TOOL_CALL_CLOSE in decode(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def run_tool(self, call: ToolCall) -> tuple[str, bool, float]:
        """`(observation text, is_error, sandbox seconds)` for one parsed call."""
        if not call.ok:
            return call.error or "Error: invalid tool call", True, 0.0
        c = self.cfg
        result = get_sandbox(c.sandbox_user).run(call.arguments["code"], timeout_s=c.tool_timeout_s,
                                                 memory_mb=c.tool_memory_mb, max_procs=c.tool_max_procs,
                                                 disk_mb=c.tool_disk_mb)
        return format_observation(result, timeout_s=c.tool_timeout_s), not result.ok, result.seconds

    def observation_ids(self, text: str) -> list[int]:
        """Tokens of one wrapped observation, the tool output cut to `max_observation_tokens`."""
        body = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(body) > self.cfg.max_observation_tokens:
            body = body[: self.cfg.max_observation_tokens]
        return self._open_ids + body + self._close_ids

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, **kwargs: Any) -> Rollout:
        if kwargs.get("should_stop") is not None:
            raise NotImplementedError("the agent loop cannot be interrupted (fully-async mode is not supported)")
        n = params.n
        rows = [list(p) for p in prompts for _ in range(n)]  # [B] prompts, each repeated n times
        b = len(rows)
        budget = params.max_new_tokens
        ids: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        mask: list[list[int]] = [[] for _ in range(b)]
        finish = ["length"] * b
        stats: list[dict[str, Any]] = [{"num_turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_s": 0.0,
                                        "tool_wall_s": 0.0} for _ in range(b)]
        versions = [0] * b
        active = list(range(b))
        for turn in range(self.cfg.max_turns):
            if not active:
                break
            left = [budget - len(ids[i]) for i in active]
            sub = replace(params, n=1, max_new_tokens=max(left),
                          stop_token_ids=sorted(set(params.stop_token_ids) | set(self.stop_ids)))
            out = self.inner.generate([rows[i] + ids[i] for i in active], sub)
            calls: list[tuple[int, ToolCall]] = []
            for k, i in enumerate(active):
                toks, seg_lps, reason = out.response_ids[k][: left[k]], out.response_logprobs[k][: left[k]], out.finish_reasons[k]
                if len(out.response_ids[k]) > left[k]:
                    reason = "length"
                cut = self.cut_at_tool_call(toks)
                if cut is not None:
                    toks, seg_lps = toks[:cut], seg_lps[:cut]
                ids[i] += toks
                lps[i] += list(seg_lps)
                mask[i] += [1] * len(toks)
                stats[i]["num_turns"] += 1
                versions[i] = out.policy_version[k] if out.policy_version else getattr(self.inner, "version", 0)
                finish[i] = reason
                if cut is None:
                    continue  # EOS or budget: the sample is done
                call = last_tool_call(self.tokenizer.decode(toks, skip_special_tokens=False))
                if call is None:  # the closing tag without an opening one
                    call = ToolCall(None, {}, "", error=f"Error: {TOOL_CALL_CLOSE} without a matching <tool_call>")
                stats[i]["tool_calls"] += 1
                finish[i] = "stop"
                if turn + 1 < self.cfg.max_turns and len(ids[i]) < budget:
                    calls.append((i, call))
            t_tools = time.perf_counter()
            with ThreadPoolExecutor(max_workers=max(1, min(self.cfg.max_parallel_tools, len(calls) or 1))) as pool:
                results = list(pool.map(lambda ic: self.run_tool(ic[1]), calls))
            t_tools = time.perf_counter() - t_tools
            active = []
            for (i, _), (text, is_error, seconds) in zip(calls, results):
                stats[i]["tool_errors"] += int(is_error)
                stats[i]["tool_s"] += seconds
                stats[i]["tool_wall_s"] += t_tools / len(calls)
                obs = self.observation_ids(text)
                room = budget - len(ids[i])
                stats[i]["num_turns"] += 1
                if len(obs) >= room:  # the observation fills the budget: no room to answer
                    obs, finish[i] = obs[:room], "length"
                else:
                    active.append(i)
                ids[i] += obs
                lps[i] += [0.0] * len(obs)
                mask[i] += [0] * len(obs)
        return Rollout(prompt_ids=rows, response_ids=ids, response_logprobs=lps, finish_reasons=finish,
                       group_index=[i // n for i in range(b)], policy_version=versions, response_mask=mask,
                       turn_stats=stats)
