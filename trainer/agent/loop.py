"""Multi-turn tool use as a rollout engine: generate, run the tool, append its output, continue.

`AgentRolloutEngine` wraps any `InterruptibleEngine` (`hf`, `static`, `vllm`, `sglang`: one
interface, `decode_rows(rows, budgets, params, should_stop)`) and turns one `generate` call into the
ReTool loop (Feng et al. 2025, "ReTool"; the Miles `retool` example and verl's tool agent loop).
Each sample is a `Trajectory` (trainer/agent/trajectory.py) that is either decoding, waiting for its
tool, or done; the loop runs them all at once:

    while a trajectory is not done:
        collect finished tool calls: append "\n<tool_response>\n" + output + "\n</tool_response>\n"
                                     (mask 0, log-prob 0); the trajectory decodes again
        if some trajectories are decoding:
            one decode_rows call over all of them (each with the token budget it has left), until
            </tool_call>, EOS or the budget; while it runs, the tool calls already submitted keep
            running in the tool pool (`agent.max_parallel_tools` threads over the sandbox's zygote)
            each segment ending in a complete tool call submits its call to the pool
        else: wait for the first tool call to finish (and for the others as long again)

So tool calls run concurrently with the decoding of the other samples: a sample whose tool is slow
does not hold back the samples whose tools are done. The response is one token stream per sample,
assistant segments interleaved with observations, and `Rollout.response_mask` marks which tokens
the policy sampled (1) and which the tool wrote (0). The trainer computes log-probs over the whole
stream (observations are context), but losses, KL and entropy only count mask-1 tokens. The whole
response, observations included, stays within `max_new_tokens` (`data.max_response_length`); an
observation that does not fit is cut and ends the sample (finish reason "length").

Stopping at ``</tool_call>``: when the tag is one token in the vocabulary (Qwen2.5 has it) its id
is a stop token; otherwise the engine may run past it and the segment is cut right after the
first token whose decoded prefix contains the tag (what follows was sampled after the call and is
dropped with its log-probs).

Partial rollout (fully-async mode): `generate(..., should_stop=fn)` passes `fn` to every decode
call and checks it before each one and, while only tools run, every 20 ms. Once it returns True, the
decode in flight stops at its next step, tool calls already running finish and their
observations are appended (a sync waits for them, at most `agent.tool_timeout_s`), calls still
queued are dropped, and every unfinished trajectory comes back with finish reason "abort".
`continue_generation(prompts, partial_ids, partial_logprobs, params, partial_versions=,
partial_masks=, partial_turn_stats=)` rebuilds each trajectory from those (`Trajectory.resume`)
and goes on under the current weights: a segment cut short continues (its tokens extend it, no
new turn), a call whose tool had not run runs first. Every token keeps the log-prob and policy
version that sampled it (`Rollout.token_versions`; observation tokens get the version in force
when they were appended), and the turn counts carry over.

Per sample, `Rollout.turn_stats` records (`trajectory.TURN_KEYS`): ``num_turns`` (verl's count:
the user message, each assistant segment and each tool response; a direct answer is 2, one tool
round trip then an answer is 4; the ReTool reward reads it), ``tool_calls`` (complete
``<tool_call>`` spans, malformed ones included), ``tool_errors`` (calls whose output is an error:
malformed, unknown tool, non-zero exit, timeout, a sandbox limit), ``tool_s`` (the sandbox's own
seconds for the sample's calls), ``tool_overlap_s`` (the part of those calls' run time during
which a decode call was running: tool time hidden behind decoding) and ``tool_wall_s`` (the
sample's share of the time the loop was blocked on tools with nothing to decode, split evenly over
the samples it waited for; the sum over a batch is `timing_s/tool`).

The tool runs in `trainer.agent.sandbox` (a warm zygote, confined per call, safe to call from
several threads); building the engine runs the sandbox's self-test, records its layers in
``<out_dir>/env.json`` and refuses to start when no isolating layer is in force unless
``agent.sandbox_allow_unisolated`` is set.

Departures: observations are plain text inside the assistant turn (as Miles' retool example
does), not a chat-template tool role; `n` samples of a prompt are independent rows (no prefix
sharing across turns); a decode call runs until every row in it stops (a row whose segment ends
early waits for the call to return before its tool starts), where verl submits each sample's next
request to a continuously batching server on its own; prompts with images are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

import torch

from trainer.agent.sandbox import check_isolation, format_observation, get_sandbox
from trainer.agent.tool_call import TOOL_CALL_CLOSE, ToolCall
from trainer.agent.trajectory import TURN_KEYS, Trajectory
from trainer.config import AgentConfig
from trainer.rollout.base import EngineWrapper, InterruptibleEngine, Rollout, RolloutEngine, SamplingParams

OBS_OPEN = "\n<tool_response>\n"
OBS_CLOSE = "\n</tool_response>\n"
_POLL_S = 0.02  # while only tools run, `should_stop` is checked this often
__all__ = ["OBS_CLOSE", "OBS_OPEN", "TURN_KEYS", "AgentRolloutEngine"]


def overlap_s(span: tuple[float, float], others: list[tuple[float, float]]) -> float:
    """Seconds of `span` covered by the (disjoint, in order) intervals `others`."""
    a, b = span
    return sum(max(0.0, min(b, d) - max(a, c)) for c, d in others)


class AgentRolloutEngine(EngineWrapper, RolloutEngine):
    """A `RolloutEngine` whose responses are multi-turn tool-use trajectories (module docstring)."""

    name = "agent"

    def __init__(self, inner: RolloutEngine, tokenizer: Any, cfg: AgentConfig, *, out_dir: str | None = None) -> None:
        self.inner = inner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.sandbox_layers = check_isolation(cfg, out_dir)  # self-test; refuses an unisolated machine
        ids = tokenizer.encode(TOOL_CALL_CLOSE, add_special_tokens=False)
        self.stop_ids = list(ids) if len(ids) == 1 else []  # the closing tag is one token: stop on it
        self._open_ids = list(tokenizer.encode(OBS_OPEN, add_special_tokens=False))
        self._close_ids = list(tokenizer.encode(OBS_CLOSE, add_special_tokens=False))

    def _engine(self) -> InterruptibleEngine:
        if not isinstance(self.inner, InterruptibleEngine):
            raise TypeError(f"agent.enable: the tool loop drives an InterruptibleEngine (decode_rows); "
                            f"{type(self.inner).__name__} is not one")
        return self.inner

    # ------------------------------------------------------------ pieces
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

    def _decode_text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def run_tool(self, call: ToolCall) -> tuple[str, bool, float]:
        """`(observation text, is_error, sandbox seconds)` for one parsed call."""
        if not call.ok:
            return call.error or "Error: invalid tool call", True, 0.0
        c = self.cfg
        result = get_sandbox(c.sandbox_user).run(call.arguments["code"], timeout_s=c.tool_timeout_s,
                                                 memory_mb=c.tool_memory_mb, max_procs=c.tool_max_procs,
                                                 disk_mb=c.tool_disk_mb)
        return format_observation(result, timeout_s=c.tool_timeout_s), not result.ok, result.seconds

    def _timed_tool(self, call: ToolCall) -> tuple[str, bool, float, tuple[float, float]]:
        t0 = time.perf_counter()
        text, is_error, seconds = self.run_tool(call)
        return text, is_error, seconds, (t0, time.perf_counter())

    def observation_ids(self, text: str) -> list[int]:
        """Tokens of one wrapped observation, the tool output cut to `max_observation_tokens`."""
        body = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(body) > self.cfg.max_observation_tokens:
            body = body[: self.cfg.max_observation_tokens]
        return self._open_ids + body + self._close_ids

    # ------------------------------------------------------------ the interface
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 should_stop: Callable[[], bool] | None = None, multi_modal_inputs: Any = None) -> Rollout:
        """`params.n` trajectories per prompt; `should_stop` interrupts them (finish reason "abort")."""
        if multi_modal_inputs is not None and any(m is not None for m in multi_modal_inputs):
            raise ValueError("agent.enable: the tool loop does not take prompts with images (fix: set "
                             "agent.enable=false for vision-language data)")
        n = params.n
        trajs = [Trajectory(prompt=list(p), budget=params.max_new_tokens) for p in prompts for _ in range(n)]
        return self._run(trajs, params, should_stop, group_index=[i // n for i in range(len(trajs))])

    @torch.no_grad()
    def continue_generation(self, prompts: list[list[int]], partial_ids: list[list[int]],
                            partial_logprobs: list[list[float]], params: SamplingParams, *,
                            should_stop: Callable[[], bool] | None = None,
                            partial_versions: list[list[int]] | None = None,
                            partial_masks: list[list[int]] | None = None,
                            partial_turn_stats: list[dict[str, Any]] | None = None) -> Rollout:
        """Resume interrupted trajectories (one row each; `params.n` is ignored) under the current weights."""
        if partial_masks is None or partial_turn_stats is None:
            raise ValueError("agent continue_generation: a trajectory resumes from its mask and turn counts "
                             "(pass partial_masks and partial_turn_stats, as the rollout worker does)")
        versions = partial_versions or [[self.version] * len(p) for p in partial_ids]
        trajs = [Trajectory.resume(p, params.max_new_tokens, ids, lps, v, m, st, cut_at_call=self.cut_at_tool_call,
                                   decode=self._decode_text)
                 for p, ids, lps, v, m, st in zip(prompts, partial_ids, partial_logprobs, versions, partial_masks,
                                                  partial_turn_stats)]
        return self._run(trajs, params, should_stop, group_index=list(range(len(trajs))))

    # ------------------------------------------------------------ the loop
    def _run(self, trajs: list[Trajectory], params: SamplingParams, should_stop: Callable[[], bool] | None,
             group_index: list[int]) -> Rollout:
        engine = self._engine()
        sub = replace(params, n=1, stop_token_ids=sorted(set(params.stop_token_ids) | set(self.stop_ids)))
        decode_spans: list[tuple[float, float]] = []  # wall-clock intervals of the decode calls
        tool_spans: list[tuple[Trajectory, tuple[float, float]]] = []
        pending: dict[Future, Trajectory] = {}
        stopped = False

        def stop_now() -> bool:
            return should_stop is not None and should_stop()

        def collect(futures: Iterable[Future]) -> None:
            for fut in futures:
                t = pending.pop(fut)
                text, is_error, seconds, span = fut.result()
                tool_spans.append((t, span))
                t.add_observation(self.observation_ids(text), is_error, seconds, engine.version)

        with ThreadPoolExecutor(max_workers=self.cfg.max_parallel_tools, thread_name_prefix="rlbench-tool") as pool:
            def submit(ts: Iterable[Trajectory]) -> None:
                for t in ts:
                    if t.call is not None and t not in pending.values():
                        pending[pool.submit(self._timed_tool, t.call)] = t

            submit(trajs)  # resumed trajectories whose call had not run yet
            while True:
                collect([f for f in list(pending) if f.done()])
                ready = [t for t in trajs if t.decoding]
                if not ready and not pending:
                    break
                if stop_now():
                    stopped = True
                    break
                if not ready:  # nothing to decode: wait for a tool call, and as long again for the others
                    t0 = time.perf_counter()
                    waited = list(pending.values())
                    first: set[Future] = set()
                    while not first and not stop_now():  # an interrupt is seen within _POLL_S
                        first, _ = wait(list(pending), timeout=_POLL_S, return_when=FIRST_COMPLETED)
                    if first:
                        wait([f for f in pending if f not in first], timeout=time.perf_counter() - t0)
                    blocked = time.perf_counter() - t0
                    for t in waited:
                        t.stats["tool_wall_s"] += blocked / len(waited)
                    continue
                t0 = time.perf_counter()
                toks, lps, fin = engine.decode_rows([t.context() for t in ready], [t.left for t in ready], sub,
                                                    should_stop)
                decode_spans.append((t0, time.perf_counter()))
                for t, tk, lp, reason in zip(ready, toks, lps, fin):
                    t.add_segment(list(tk), list(lp), reason, engine.version, max_turns=self.cfg.max_turns,
                                  cut_at_call=self.cut_at_tool_call, decode=self._decode_text)
                if "abort" in fin:
                    stopped = True
                    break
                submit(ready)
            if stopped:  # calls not started yet run after the sync; the running ones finish now
                for fut in list(pending):
                    if fut.cancel():
                        pending.pop(fut)
                collect(list(pending))
        for t, span in tool_spans:
            t.stats["tool_overlap_s"] += overlap_s(span, decode_spans)
        return Rollout(prompt_ids=[t.prompt for t in trajs], response_ids=[t.ids for t in trajs],
                       response_logprobs=[t.lps for t in trajs],
                       finish_reasons=[t.finish if t.done else "abort" for t in trajs], group_index=group_index,
                       policy_version=[engine.version] * len(trajs), response_mask=[t.mask for t in trajs],
                       turn_stats=[dict(t.stats) for t in trajs], token_versions=[t.vers for t in trajs])
