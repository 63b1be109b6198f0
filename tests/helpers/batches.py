"""A small batch with unequal response lengths for the data-parallel equivalence tests.

8 responses = 4 prompts x n=2, prompts of P tokens, responses of up to R tokens with lengths
6, 2, 4, 1, 5, 3, 6, 2: unequal, so a token mean differs from a mean of per-worker means.
"""

from __future__ import annotations

import torch

from trainer.components.batch import Batch
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer

N_RESP, P, R, N = 8, 5, 6, 2  # 8 responses = 4 prompts x n=2


def unequal_lengths_batch(seed: int) -> tuple[Batch, torch.Generator]:
    """The batch (ids, masks, positions, group index) and the generator that drew it, for the caller's
    own fields (advantages, values, ...) drawn from the same stream."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (N_RESP, P + R), generator=g)
    attn = torch.ones(N_RESP, P + R, dtype=torch.long)
    lengths = torch.tensor([6, 2, 4, 1, 5, 3, 6, 2])
    mask = (torch.arange(R)[None] < lengths[:, None]).float()
    attn[:, P:] = mask.long()
    batch = Batch(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                  responses=ids[:, P:], response_mask=mask, rollout_logprobs=torch.zeros(N_RESP, R),
                  group_index=torch.arange(N_RESP) // N)
    return batch, g


def tiny_qwen2() -> torch.nn.Module:
    """A random-init tiny Qwen2 (seed 0)."""
    model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    return model
