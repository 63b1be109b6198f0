"""Seeded, resumable batch sampler: which dataset rows make up each training step's batch.

Epoch ``e`` visits the rows in the order ``numpy.random.default_rng([seed, e]).permutation(n)``
(or ``0..n-1`` with ``shuffle=False``) and cuts it into consecutive batches of `batch_size`. A
batch never straddles two epochs: when fewer than `batch_size` rows are left, they are skipped
and the next epoch starts (like ``DataLoader(drop_last=True)``; a different tail is skipped each
epoch because the order changes).

The whole state is ``(seed, epoch, position)``, so a resumed run that loads `state_dict()`
draws exactly the batches the uninterrupted run would have drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer.errors import DataError


class EpochSampler:
    """Yields lists of row indices, `batch_size` at a time, epoch after epoch."""

    def __init__(self, num_items: int, batch_size: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if num_items < batch_size:
            raise DataError(
                f"dataset has {num_items} usable prompts, fewer than one batch of {batch_size} "
                "(fix: lower data.train_batch_size or add data)"
            )
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(num_items)

    @property
    def batches_per_epoch(self) -> int:
        return self.num_items // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        """The row order of `epoch`."""  # [num_items]
        if not self.shuffle:
            return np.arange(self.num_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_items)

    def next_indices(self) -> list[int]:
        """The next batch's row indices; advances the state."""
        if self.position + self.batch_size > self.num_items:
            self.epoch += 1
            self.position = 0
        if self._order_epoch != self.epoch:
            self._order = self.order(self.epoch)
            self._order_epoch = self.epoch
        batch = self._order[self.position : self.position + self.batch_size]  # [batch_size]
        self.position += self.batch_size
        return [int(i) for i in batch]

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_items": self.num_items,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`; DataError if the dataset size changed since it was saved."""
        if int(state["num_items"]) != self.num_items:
            raise DataError(
                f"sampler state was saved for {state['num_items']} prompts but the dataset now has "
                f"{self.num_items} (fix: resume with the same data files and max_prompt_length, or start fresh)"
            )
        position = int(state["position"])
        if not 0 <= position <= self.num_items:
            raise DataError(f"sampler state position {position} is outside 0..{self.num_items} (fix: start fresh)")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = position
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._order_epoch = -1
