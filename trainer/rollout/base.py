"""Rollout engine interface: sample responses and report the log-probability of every sampled token.

Every engine (the built-in `hf` and `static` engines, `vllm`, `sglang`) returns, per sampled token, the
log-probability the engine itself assigned to it under the *same* temperature scaling the trainer
uses (`log_softmax(logits / temperature)`), so that the rollout-vs-trainer mismatch is always
measured (`training/rollout_probs_diff_*`, and `actor/ppo_kl` at the first mini-batch).

Two interfaces:

- `RolloutEngine`: `generate(prompts, params)`, `update_weights(named_tensors)`, `sleep`/`wake_up`.
- `EngineWrapper`: a mixin for engines that wrap another one (the tool loop's `AgentRolloutEngine`).
- `InterruptibleEngine(RolloutEngine)`: engines whose decode loop runs under host control (`hf`,
  `static`), which is what partial rollout (fully-async mode) needs. They implement one method,
  `decode_rows(rows, budgets, params, should_stop)`, and inherit

      generate(prompts, params, should_stop=fn)       # n rows per prompt; `fn()` is checked before
                                                      # every decode step; when it returns True the
                                                      # unfinished rows come back with finish reason
                                                      # "abort" and the tokens (and log-probs) sampled so far
      continue_generation(prompts, partial_ids, partial_logprobs, params, should_stop=fn)
                                                      # one row per partial response: prefill
                                                      # prompt + partial, sample at most
                                                      # max_new_tokens - len(partial) more tokens under
                                                      # the *current* weights; the partial tokens keep
                                                      # the log-probs they were sampled with

  Comparable across an interruption: with greedy decoding and unchanged weights, generate
  interrupted after k steps and then continued gives the tokens of one uninterrupted call (the
  log-probs agree up to the numerics of prefilling the partial tokens instead of decoding them).
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SamplingParams:
    """How to sample. `n` responses per prompt; `top_k=-1` and `top_p=1.0` disable those filters."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    greedy: bool = False  # validation uses greedy decoding when set (temperature ignored)


@dataclass
class Rollout:
    """The result of one `generate` call, one entry per sampled response (len = num_prompts * n).

    Responses of prompt i are at indices [i*n, (i+1)*n): `group_index[j] == j // n`.
    """

    prompt_ids: list[list[int]]  # token ids of the prompt each response continues
    response_ids: list[list[int]]  # sampled tokens, EOS included when the response stopped on it
    response_logprobs: list[list[float]]  # engine log-prob of each sampled token (temperature-scaled)
    finish_reasons: list[str]  # "stop" (EOS / stop token) or "length" (hit max_new_tokens)
    group_index: list[int]  # which prompt (0..num_prompts-1) each response belongs to
    policy_version: list[int] = field(default_factory=list)  # weights version per response (async)
    # Multi-turn tool use (trainer/agent): 1 = token the policy sampled, 0 = tool-observation token
    # (not trained on, log-prob 0). Empty: every response token was sampled.
    response_mask: list[list[int]] = field(default_factory=list)
    turn_stats: list[dict[str, int]] = field(default_factory=list)  # per response: num_turns, tool_calls, tool_errors
    # Policy version that sampled each response token (partial rollout: tokens sampled before a weight
    # sync keep the older version). Empty: every token has the response's `policy_version`.
    token_versions: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.response_ids)


def engine_model(model: torch.nn.Module, *, dtype: torch.dtype | None, device: torch.device | str | None,
                 share_weights: bool) -> torch.nn.Module:
    """The engine's frozen copy of the policy (the policy itself with `share_weights`), in `dtype` on `device`."""
    model = model if share_weights else copy.deepcopy(model)
    if dtype is not None:
        model.to(dtype)
    if device is not None:
        model.to(device)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def copy_weights_in_place(params: dict[str, torch.Tensor], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy the trainer's tensors into an engine's own parameters (`params`: name -> parameter)."""
    for name, tensor in named_tensors:
        target = params.get(name)
        if target is None:
            raise KeyError(f"rollout engine has no parameter named {name}")
        if target.data_ptr() != tensor.data_ptr():
            target.copy_(tensor, non_blocking=True)


@torch.no_grad()
def weight_sync_metrics(engine: object, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """`training/weight_sync_max_abs_diff`: max over parameters of max |trainer - engine| right after a
    sync (0 when the engine holds the trainer's weights; the engine's dtype rounding otherwise).

    Read from the engine's own parameters (`engine._params`, name -> tensor: the hf and static
    engines); {} for engines whose weights live in another process (vLLM, SGLang).
    """
    params = getattr(engine, "_params", None)
    if not isinstance(params, dict):
        return {}
    worst = 0.0
    for name, tensor in named_tensors:
        target = params.get(name)
        if target is None:
            return {"training/weight_sync_max_abs_diff": float("inf")}  # a weight the engine lacks
        diff = (target.float() - tensor.to(target.device).float()).abs().max()
        worst = max(worst, float(diff))
    return {"training/weight_sync_max_abs_diff": worst}


def engine_facts(engine: RolloutEngine) -> dict[str, object]:
    """What a run records about its engine (`engine.json`): name, device and, for the static engine,
    graph-capture seconds and why capture failed if it did; engines with a `facts()` method (vLLM:
    process layout, whether sleep frees memory, its worker's model class / dtype / threads) add it."""
    out: dict[str, object] = {"engine": engine.name, "device": str(getattr(engine, "device", "")),
                              "use_graphs": bool(getattr(engine, "use_graphs", False)),
                              "graph_capture_s": float(getattr(engine, "compile_s", 0.0)),
                              "graph_error": getattr(engine, "graph_error", None)}
    facts = getattr(engine, "facts", None)
    if callable(facts):
        try:
            out["engine_facts"] = facts()
        except Exception as e:  # noqa: BLE001 -- an engine that died keeps the rest of the record
            out["engine_facts_error"] = f"{type(e).__name__}: {e}"
    return out


class RolloutEngine(abc.ABC):
    """A sampler that holds a copy of the policy weights and can receive new ones."""

    name: str = "base"

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Rollout:
        """Sample `params.n` responses for each prompt (token ids, no padding)."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (names as in the trainer's `model.named_parameters()`)."""

    def sleep(self) -> None:
        """Release device memory (KV cache, graphs) while training runs on the same devices."""

    def wake_up(self) -> None:
        """Re-acquire what `sleep` released."""


class EngineWrapper:
    """Mixin for an engine that wraps another (`self.inner`): the policy version, weight loads,
    sleep / wake-up and any other attribute (generator, model, device, ...) go to the inner engine;
    the wrapper overrides only how it samples."""

    inner: RolloutEngine

    def __getattr__(self, item: str) -> Any:
        if item == "inner":  # not set yet (during unpickling or before __init__)
            raise AttributeError(item)
        return getattr(self.inner, item)

    @property
    def version(self) -> int:
        return self.inner.version  # type: ignore[attr-defined]

    @version.setter
    def version(self, value: int) -> None:
        self.inner.version = value  # type: ignore[attr-defined]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.update_weights(named_tensors)

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()


class InterruptibleEngine(RolloutEngine):
    """An engine that continues token rows by a budget and can be interrupted (`decode_rows`);
    `generate` and `continue_generation` (partial rollout) are built on it. The built-in engines
    decode on the host; vLLM and SGLang abort and resubmit requests of their own."""

    version: int = 0  # policy version of the loaded weights (set by the caller in fully-async mode)

    @abc.abstractmethod
    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                    should_stop: Callable[[], bool] | None) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Continue each token row (`params.n` is ignored) by at most `budgets[i]` sampled tokens.

        Returns per row the new tokens, their log-probs and a finish reason: "stop" (the last token
        is EOS or a stop token), "length" (the budget is used up) or "abort" (`should_stop()`
        returned True before the row finished; it is checked before every decode step).
        """

    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 should_stop: Callable[[], bool] | None = None, **per_prompt: list[Any] | None) -> Rollout:
        """Sample `params.n` responses per prompt; `should_stop` interrupts (rows marked "abort").
        `per_prompt`: inputs with one entry per prompt (an engine's images), repeated for the prompt's
        `n` rows and passed to `decode_rows` under the same names."""
        n = params.n
        rows = [list(p) for p in prompts for _ in range(n)]  # [B] prompts, each repeated n times
        extra = {k: [v for v in vals for _ in range(n)] for k, vals in per_prompt.items() if vals is not None}
        tokens, logps, finish = self.decode_rows(rows, [params.max_new_tokens] * len(rows), params, should_stop,
                                                 **extra)
        return Rollout(prompt_ids=rows, response_ids=tokens, response_logprobs=logps, finish_reasons=finish,
                       group_index=[i // n for i in range(len(rows))], policy_version=[self.version] * len(rows),
                       token_versions=[[self.version] * len(t) for t in tokens])

    def continue_generation(self, prompts: list[list[int]], partial_ids: list[list[int]],
                            partial_logprobs: list[list[float]], params: SamplingParams, *,
                            should_stop: Callable[[], bool] | None = None,
                            partial_versions: list[list[int]] | None = None,
                            partial_masks: list[list[int]] | None = None,
                            partial_turn_stats: list[dict] | None = None) -> Rollout:
        """Resume interrupted responses (one row each; `params.n` is ignored) under the current weights.

        Row i continues `prompts[i] + partial_ids[i]` for at most `max_new_tokens - len(partial_ids[i])`
        tokens. The returned response is the partial one plus the new tokens; the partial tokens keep
        the log-probs they were sampled with (`partial_logprobs`) and their versions
        (`partial_versions`, default: the current one), the new ones get this engine's.
        `partial_masks` / `partial_turn_stats` (multi-turn responses, `trainer.agent.loop`, which
        continues them itself): a single-turn engine's new tokens are all sampled (mask 1) and add
        no turns, so the masks are extended with 1s and the turn counts come back as they were.
        """
        budgets = [params.max_new_tokens - len(p) for p in partial_ids]
        if min(budgets, default=1) < 1:
            raise ValueError("continue_generation: a partial response already has max_new_tokens tokens")
        if any(len(lp) != len(p) for p, lp in zip(partial_ids, partial_logprobs)):
            raise ValueError("continue_generation: partial_logprobs must have one log-prob per partial token")
        rows = [list(p) + list(r) for p, r in zip(prompts, partial_ids)]
        new_tokens, new_logps, finish = self.decode_rows(rows, budgets, params, should_stop)
        return Rollout(prompt_ids=[list(p) for p in prompts],
                       response_ids=[list(r) + t for r, t in zip(partial_ids, new_tokens)],
                       response_logprobs=[list(lp) + n_lp for lp, n_lp in zip(partial_logprobs, new_logps)],
                       finish_reasons=finish, group_index=list(range(len(rows))),
                       policy_version=[self.version] * len(rows),
                       token_versions=[list(v) + [self.version] * len(t) for v, t in zip(
                           partial_versions or [[self.version] * len(p) for p in partial_ids], new_tokens)],
                       response_mask=[list(m) + [1] * len(t) for m, t in zip(partial_masks, new_tokens)]
                       if partial_masks is not None else [],
                       turn_stats=[dict(st) for st in partial_turn_stats] if partial_turn_stats is not None else [])
