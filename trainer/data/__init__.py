"""Prompt data: verl-format files and synthetic tasks, tokenized and batched for rollout.

    from trainer.data import PromptDataset, load_rows
    rows = load_rows("synthetic:arithmetic-easy?num=2000&seed=0", field="data.train_files")
    ds = PromptDataset(rows, tokenizer, max_prompt_length=256, batch_size=8, seed=0)
    batch = ds.next_batch()

The synthetic helpers are imported on first use, so ``python -m trainer.data.synthetic`` runs
the module once, as its own ``__main__``.

May import: `trainer.errors`, `trainer.config`, `trainer.rewards`, `trainer.agent` (the tool traces).
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.data.chat import tokenize_prompt
from trainer.data.dataset import PromptDataset, load_rows, validate_rows
from trainer.data.sampler import EpochSampler
from trainer.data.splits import write_rows

_SYNTHETIC = ("ensure_synthetic", "make_arithmetic_rows", "split_rows")

__all__ = [
    "EpochSampler", "PromptDataset", "ensure_synthetic", "load_rows", "make_arithmetic_rows", "split_rows",
    "tokenize_prompt", "validate_rows", "write_rows",
]


def __getattr__(name: str) -> Any:
    if name in _SYNTHETIC:
        return getattr(importlib.import_module("trainer.data.synthetic"), name)
    raise AttributeError(f"module 'trainer.data' has no attribute {name!r}")
