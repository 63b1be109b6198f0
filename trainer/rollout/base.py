"""Rollout engine interface: sample responses and report the log-probability of every sampled token.

Every engine (the built-in `hf` engine, `vllm`, `sglang`) returns, per sampled token, the
log-probability the engine itself assigned to it under the *same* temperature scaling the trainer
uses (`log_softmax(logits / temperature)`), so that the rollout-vs-trainer mismatch is always
measured (`training/rollout_probs_diff_*`, and `actor/ppo_kl` at the first mini-batch).
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

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
