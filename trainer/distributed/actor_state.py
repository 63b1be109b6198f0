"""Save and load the policy's training state (weights, AdamW, LR schedule) across N trainer workers.

    save_actor_state(actor, folder / "actor.pt", rank)   # every rank calls it; rank 0 writes the file
    load_actor_state(actor, folder / "actor.pt", rank)   # every rank calls it; rank 0 reads the file

Choice: *full* state dicts gathered to rank 0 (`torch.distributed.checkpoint.state_dict` with
`full_state_dict=True, cpu_offload=True`), one `torch.save` file, and on load rank 0 reads it and
broadcasts each tensor while every rank keeps only its own shard (`broadcast_from_rank0=True`).
Why not sharded `torch.distributed.checkpoint.save` (one file per rank): the full file is one
`torch.save` beside the driver's `state.pt`, needs no shared-filesystem planner, does not depend on
the number of workers (a 2-worker checkpoint loads on 4), and is what the single-process loop
already writes. Its cost is that rank 0 holds the whole model and optimizer state in host memory
while saving (about 12 bytes per parameter in fp32 with AdamW: 1.6 GB for SmolLM2-135M, 18 GB for
1.5B); past tens of billions of parameters the sharded format is the right one.

One worker (no FSDP2) uses `Actor.state_dict()` as is (the fp32 masters under `bf16_params`); its
optimizer state is keyed by parameter index, the sharded one by parameter name, so a checkpoint
records its `layout` and a run with the other layout refuses it with a ConfigError.

The Megatron backend (`actor.strategy: megatron`, layout `megatron_tp<T>_pp<P>_ep<E>_world<N>`): every
rank's own `MegatronActor.state_dict()` (its TP / EP shards of its pipeline stage's weights, its AdamW state) is
gathered to rank 0 (`gather_object`) and written as one list in the same file; on load rank 0 reads
it and each rank gets its own entry back (`scatter_object_list`). The file is tied to the parallel
layout (a run with other TP / PP / EP / worker counts refuses it), and rank 0 holds every rank's state
while saving, data-parallel replicas included.
The critic's file (`trainer/distributed/critic_state.py`) uses the same gather/scatter helpers.

On multi-node runs the checkpoint folder (`trainer.out_dir`) must be a filesystem that both the
driver and trainer rank 0 see (shared storage, as verl requires for its checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.backends.actor import Actor
from trainer.errors import ConfigError

ACTOR_FILE = "actor.pt"


def gather_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`{"model", "optimizer"}` full state dicts of a sharded model on rank 0 ({} elsewhere; a collective)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the tensors, others {}
    return {"model": get_model_state_dict(model, options=opts),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=opts)}


def scatter_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Inverse of `gather_full_state`: rank 0's full `state` broadcast, each rank keeps its shard (a collective)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state.get("model", {}), options=opts)
    set_optimizer_state_dict(model, optimizer, state.get("optimizer", {}), options=opts)


def read_state(path: Path, layout: str, what: str) -> dict[str, Any]:
    """`torch.load` a state file, refusing one written with the other layout (ConfigError)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["layout"] != layout:
        raise ConfigError(f"{path}: written by a run whose {what} layout is {state['layout']}, this run's is "
                          f"{layout} (fix: resume with the same trainer worker count, 1 vs several, actor.strategy and "
                          f"actor.megatron sizes, or set trainer.resume=false)")
    return state


def gather_rank_states(local: dict[str, Any], rank: int) -> dict[str, Any]:
    """Every rank's own state (the Megatron layouts), gathered to rank 0 as `{"ranks": [...]}` (a collective)."""
    ranks: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(local, ranks, dst=0)
    return {"ranks": ranks}


def scatter_rank_state(state: dict[str, Any]) -> dict[str, Any]:
    """This rank's entry of what `gather_rank_states` wrote (rank 0 holds `state`; a collective)."""
    mine: list[Any] = [None]
    dist.scatter_object_list(mine, state.get("ranks"), src=0)
    return mine[0]


def save_actor_state(actor: Actor, path: Path, rank: int) -> None:
    """Gather the full training state to rank 0 and write it to `path` (a collective when sharded)."""
    layout = actor.checkpoint_layout()
    if layout.startswith("megatron"):  # one state per rank (module docstring)
        state: dict[str, Any] = gather_rank_states(actor.state_dict(), rank)
    elif layout == "plain":
        state = actor.state_dict()
    else:
        state = {**gather_full_state(actor.model, actor.optimizer), "scheduler": actor.scheduler.state_dict()}
    if rank == 0:
        torch.save({"layout": layout, **state}, path)


def load_actor_state(actor: Actor, path: Path, rank: int) -> None:
    """Restore what `save_actor_state` wrote (a collective when sharded: rank 0 reads and broadcasts)."""
    layout = actor.checkpoint_layout()
    state: dict[str, Any] = {}
    if rank == 0 or layout == "plain":
        state = read_state(path, layout, "policy")
    if layout.startswith("megatron"):
        actor.load_state_dict(scatter_rank_state(state))
        return
    if layout == "plain":
        actor.load_state_dict(state)
        return
    scatter_full_state(actor.model, actor.optimizer, state)
    # the LR schedule is the same on every rank: rank 0's copy goes to all
    sched = [state.get("scheduler")]
    torch.distributed.broadcast_object_list(sched, src=0)
    actor.scheduler.load_state_dict(sched[0])
