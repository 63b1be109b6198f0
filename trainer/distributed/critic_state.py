"""PPO's value model on N trainer workers: build it sharded like the policy, run its two per-step calls,
save and load its full training state.

    actor, critic = build_worker_models(model, cfg, world_size, device)   # trainer/distributed/worker_actor.py
    values = critic_values(critic, piece)                            # [rows, R], this worker's rows
    metrics = critic_update(critic, piece, n)                        # critic/* (already summed over ranks)
    save_critic_state(critic, folder / CRITIC_FILE, rank)            # every rank; rank 0 writes
    load_critic_state(critic, folder / CRITIC_FILE, rank)            # every rank; rank 0 reads

The value model (`trainer/backends/critic.py`) is a copy of the initial policy's body plus a scalar
head, built from the *unsharded* policy on every rank (same seed, so the same head initialization),
then sharded with FSDP2 when N > 1 (`trainer/backends/fsdp.py`: one unit per decoder layer, gradients
summed over the ranks). Its mini-batch is `actor.ppo_mini_batch_size / N` prompts per worker, so the
driver's shards (`trainer/distributed/sharding.py`, the actor's) give worker r piece r of every global
mini-batch and the k-th optimizer step sees the k-th global mini-batch, as for the actor. Counts and
loss statistics are all-reduced inside `Critic.update`, so N workers make one worker's update.

The per-step order on the driver (`trainer/distributed/colocated_ray.py`): values on every worker's
shard -> gathered into the whole batch -> GAE advantages/returns on the driver -> each worker's shard
(now carrying values and returns) -> `Critic.update`, then `Actor.update`, as in the single-process loop.

`actor.strategy: megatron`: a `MegatronCritic` (`trainer/backends/megatron/critic.py`) in the actor's
parallel groups (built after the actor, which makes them): TP / EP as the policy, data parallel over the
same N / TP ranks, the mini-batch divided by that data-parallel size; the ranks of a TP group get the same
piece, as for the actor.

Checkpoint: `critic.pt` beside `actor.pt`, the full weights and AdamW state gathered to rank 0 with the
helpers of `trainer/distributed/actor_state.py` (same format choice, same layout check); under Megatron,
as the actor's, every rank's own state in one list (layout `megatron_tp<T>_pp1_ep<E>_world<N>`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from trainer.backends.critic import Critic
from trainer.components.batch import Batch
from trainer.distributed.actor_state import (
    gather_full_state,
    gather_rank_states,
    read_state,
    scatter_full_state,
    scatter_rank_state,
)

CRITIC_FILE = "critic.pt"


def critic_values(critic: Critic, piece: Batch) -> dict[str, Any]:
    """Values `[rows, R]` of this worker's rows (a collective when sharded) and `timing_s/values`."""
    t0 = time.perf_counter()
    values = critic.compute_values(piece)  # [rows, R]
    if critic.device.type == "cuda":
        torch.cuda.synchronize(critic.device)
    return {"values": values, "timing_s/values": time.perf_counter() - t0}


def critic_update(critic: Critic, piece: Batch, n: int) -> dict[str, Any]:
    """`Critic.update` on this worker's rows (values and returns set): `critic/*` metrics and its time."""
    t0 = time.perf_counter()
    metrics = critic.update(piece, n)
    if critic.device.type == "cuda":
        torch.cuda.synchronize(critic.device)
    return {"metrics": metrics, "timing_s/update_critic": time.perf_counter() - t0}


def save_critic_state(critic: Critic, path: Path, rank: int) -> None:
    """Gather the critic's full weights and AdamW state to rank 0 and write `path` (a collective when sharded)."""
    layout = critic.checkpoint_layout()
    if layout.startswith("megatron"):  # one state per rank, as the actor's (actor_state.py)
        state: dict[str, Any] = gather_rank_states(critic.state_dict(), rank)
    elif layout == "plain":
        state = critic.state_dict()
    else:
        state = gather_full_state(critic.model, critic.optimizer)
    if rank == 0:
        torch.save({"layout": layout, **state}, path)


def load_critic_state(critic: Critic, path: Path, rank: int) -> None:
    """Restore what `save_critic_state` wrote (a collective when sharded: rank 0 reads and broadcasts)."""
    layout = critic.checkpoint_layout()
    state: dict[str, Any] = {}
    if rank == 0 or layout == "plain":
        state = read_state(path, layout, "critic")
    if layout.startswith("megatron"):
        critic.load_state_dict(scatter_rank_state(state))
    elif layout == "plain":
        critic.load_state_dict(state)
    else:
        scatter_full_state(critic.model, critic.optimizer, state)
