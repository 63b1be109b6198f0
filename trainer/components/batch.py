"""The training batch: a rollout turned into padded tensors, in verl's layout.

    input_ids      [N, P+R]  prompt left-padded to P, response right-padded to R
    attention_mask [N, P+R]  1 on real tokens
    position_ids   [N, P+R]  cumsum(attention_mask) - 1, clamped at 0
    responses      [N, R]    response tokens (pad after the end)
    response_mask  [N, R]    1 on response tokens that count in the loss (0 on padding and on
                             tool-observation tokens of multi-turn rollouts, `Rollout.response_mask`)

Every response starts at column P, so the logits that predict response token t sit at column
P - 1 + t: one slice `hidden[:, P-1:-1]` serves the whole batch. Per-sequence fields (`scores`,
`group_index`, ...) are `[N]`; per-token fields computed later (`old_logprobs`, `advantages`, ...)
are `[N, R]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from trainer.rollout.base import Rollout


@dataclass
class Batch:
    input_ids: torch.Tensor  # [N, P+R] long
    attention_mask: torch.Tensor  # [N, P+R] long
    position_ids: torch.Tensor  # [N, P+R] long
    responses: torch.Tensor  # [N, R] long
    response_mask: torch.Tensor  # [N, R] float
    rollout_logprobs: torch.Tensor  # [N, R] float, engine log-probs of the sampled tokens
    group_index: torch.Tensor  # [N] long, which prompt each response answers
    scores: torch.Tensor | None = None  # [N] raw reward (critic/score)
    token_rewards: torch.Tensor | None = None  # [N, R] reward placed on the last response token (+ KL penalty)
    old_logprobs: torch.Tensor | None = None  # [N, R]
    ref_logprobs: torch.Tensor | None = None  # [N, R]
    values: torch.Tensor | None = None  # [N, R]
    advantages: torch.Tensor | None = None  # [N, R]
    returns: torch.Tensor | None = None  # [N, R]
    policy_version: torch.Tensor | None = None  # [N] long, weights version that sampled each response
    meta: dict[str, list[Any]] = field(default_factory=dict)  # per-sequence python values (data_source, text, ...)

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.responses.shape[1]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | list[int]) -> Batch:
        """Rows `index` of every per-sequence field."""
        idx = torch.as_tensor(index, dtype=torch.long)
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif f.name == "meta":
                out[f.name] = {k: [vals[i] for i in idx.tolist()] for k, vals in v.items()}
            else:
                out[f.name] = v
        return replace(self, **out)

    def chunks(self, size: int) -> list[Batch]:
        """Consecutive slices of at most `size` rows."""
        return [self.select(list(range(i, min(i + size, len(self))))) for i in range(0, len(self), size)]

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


def batch_from_rollout(rollout: Rollout, *, pad_token_id: int, max_response_length: int | None = None) -> Batch:
    """Pad a rollout into verl's layout (see the module docstring)."""
    n = len(rollout)
    p = max(len(x) for x in rollout.prompt_ids)
    r = max(1, max(len(x) for x in rollout.response_ids))
    if max_response_length is not None:
        r = max(r, 1) if r <= max_response_length else max_response_length
    input_ids = torch.full((n, p + r), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p + r), dtype=torch.long)
    responses = torch.full((n, r), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((n, r), dtype=torch.float32)
    logprobs = torch.zeros((n, r), dtype=torch.float32)
    masks = rollout.response_mask or [None] * n  # multi-turn: 0 on tool-observation tokens
    for i, (prompt, resp, lps, m) in enumerate(zip(rollout.prompt_ids, rollout.response_ids, rollout.response_logprobs,
                                                   masks)):
        resp, lps = resp[:r], lps[:r]
        input_ids[i, p - len(prompt):p] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[i, p - len(prompt):p] = 1
        if resp:
            t = torch.tensor(resp, dtype=torch.long)
            input_ids[i, p:p + len(resp)] = t
            attention_mask[i, p:p + len(resp)] = 1
            responses[i, :len(resp)] = t
            response_mask[i, :len(resp)] = 1.0 if m is None else torch.tensor(m[:r], dtype=torch.float32)
            logprobs[i, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
            logprobs[i] *= response_mask[i]  # observation tokens carry no rollout log-prob
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    version = torch.tensor(rollout.policy_version, dtype=torch.long) if rollout.policy_version else None
    return Batch(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, responses=responses,
                 response_mask=response_mask, rollout_logprobs=logprobs,
                 group_index=torch.tensor(rollout.group_index, dtype=torch.long), policy_version=version)


def concat_batches(batches: list[Batch], *, pad_token_id: int) -> Batch:
    """Stack batches whose prompt/response widths may differ (re-pads to the widest)."""
    if len(batches) == 1:
        return batches[0]
    p = max(b.prompt_len for b in batches)
    r = max(b.responses.shape[1] for b in batches)

    def pad(t: torch.Tensor, left: int, right: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (left, right), value=value)

    out: dict[str, Any] = {}
    for f in fields(Batch):
        vals = [getattr(b, f.name) for b in batches]
        if f.name == "meta":
            out["meta"] = {k: sum((b.meta.get(k, []) for b in batches), []) for k in batches[0].meta}
        elif vals[0] is None:
            out[f.name] = None
        elif f.name in ("input_ids", "attention_mask", "position_ids"):
            fill = pad_token_id if f.name == "input_ids" else 0
            parts = []
            for b, v in zip(batches, vals):
                rp = r - b.responses.shape[1]
                parts.append(pad(v, p - b.prompt_len, rp, fill))
            out[f.name] = torch.cat(parts)
        elif vals[0].dim() == 2:
            fill = pad_token_id if f.name == "responses" else 0
            out[f.name] = torch.cat([pad(v, 0, r - v.shape[1], fill) for v in vals])
        elif f.name == "group_index":  # groups of different generate calls must stay distinct
            offsets = torch.tensor([0] + [int(v.max()) + 1 for v in vals[:-1]]).cumsum(0)
            out[f.name] = torch.cat([v + o for v, o in zip(vals, offsets.tolist())])
        else:
            out[f.name] = torch.cat(vals)
    out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return Batch(**out)
