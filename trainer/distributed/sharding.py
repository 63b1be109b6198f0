"""Split one global batch over N data-parallel trainer workers so the update does not depend on N.

`Actor.update` walks `ppo_mini_batch_size * n` rows per optimizer step. With N workers each
global mini-batch is cut into N equal contiguous pieces, and worker r gets piece r of every
mini-batch, in order; its `ActorConfig` carries `ppo_mini_batch_size / N` (verl normalizes the
mini-batch by the data-parallel size the same way). Token and sequence counts are all-reduced
inside `Actor.update`, and FSDP2 sums the gradients (`trainer/backends/fsdp.py`), so worker r's
k-th optimizer step sees exactly the k-th global mini-batch.

Every worker must run the same number of forward passes (FSDP all-gathers inside each one), so
every piece has the same number of rows: the global batch must hold a multiple of N rows per
mini-batch.
"""

from __future__ import annotations

import torch

from trainer.components.batch import Batch
from trainer.config import ActorConfig
from trainer.errors import ConfigError


def check_divisible(num_prompts: int, n: int, mini_batch_size: int, world_size: int) -> None:
    """Raise ConfigError unless a batch of `num_prompts` groups of `n` shards evenly over the workers."""
    if mini_batch_size % world_size:
        raise ConfigError(f"actor.ppo_mini_batch_size={mini_batch_size} must be a multiple of the {world_size} "
                          f"trainer workers (fix: change actor.ppo_mini_batch_size or the trainer GPU count)")
    if num_prompts % mini_batch_size:
        raise ConfigError(f"{num_prompts} prompts per step is not a multiple of actor.ppo_mini_batch_size="
                          f"{mini_batch_size} (fix: pick a multiple)")


def worker_actor_config(cfg: ActorConfig, world_size: int) -> ActorConfig:
    """The per-worker actor config: the mini-batch divided by the data-parallel size."""
    if world_size == 1:
        return cfg
    return cfg.model_copy(update={"ppo_mini_batch_size": cfg.ppo_mini_batch_size // world_size})


def shard_batch(batch: Batch, *, world_size: int, mini_batch_rows: int) -> list[Batch]:
    """Worker r's rows: piece r of each global mini-batch of `mini_batch_rows` rows, in order."""
    if world_size == 1:
        return [batch]
    n_rows = len(batch)
    if n_rows % mini_batch_rows and n_rows > mini_batch_rows:
        raise ConfigError(f"batch of {n_rows} responses is not a multiple of the mini-batch ({mini_batch_rows}) "
                          f"(fix: make data.train_batch_size a multiple of actor.ppo_mini_batch_size)")
    size = min(mini_batch_rows, n_rows)
    if size % world_size:
        raise ConfigError(f"mini-batch of {size} responses does not split over {world_size} trainer workers "
                          f"(fix: make actor.ppo_mini_batch_size * rollout.n a multiple of the worker count)")
    piece = size // world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for start in range(0, n_rows, size):
        for r in range(world_size):
            out[r].extend(range(start + r * piece, start + (r + 1) * piece))
    return [batch.select(torch.tensor(idx, dtype=torch.long)) for idx in out]


def unshard_rows(pieces: list[torch.Tensor], *, world_size: int, mini_batch_rows: int) -> torch.Tensor:
    """Inverse of `shard_batch` for a per-row tensor: the workers' pieces back in global order."""
    if world_size == 1:
        return pieces[0]
    n_rows = sum(p.shape[0] for p in pieces)
    size = min(mini_batch_rows, n_rows)
    piece = size // world_size
    parts = []
    for k in range(n_rows // size):
        for r in range(world_size):
            parts.append(pieces[r][k * piece:(k + 1) * piece])
    return torch.cat(parts)
