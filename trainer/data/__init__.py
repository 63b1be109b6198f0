"""Prompt data: verl-format files and synthetic tasks, tokenized and batched for rollout.

    from trainer.data import PromptDataset, load_rows
    rows = load_rows("synthetic:arithmetic-easy?num=2000&seed=0", field="data.train_files")
    ds = PromptDataset(rows, tokenizer, max_prompt_length=256, batch_size=8, seed=0)
    batch = ds.next_batch()
"""

from __future__ import annotations

from trainer.data.dataset import PromptDataset, load_rows, tokenize_prompt, validate_rows
from trainer.data.sampler import EpochSampler
from trainer.data.synthetic import ensure_synthetic, make_arithmetic_rows, split_rows, write_rows

__all__ = [
    "EpochSampler",
    "PromptDataset",
    "ensure_synthetic",
    "load_rows",
    "make_arithmetic_rows",
    "split_rows",
    "tokenize_prompt",
    "validate_rows",
    "write_rows",
]
