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

On multi-node runs the checkpoint folder (`trainer.out_dir`) must be a filesystem that both the
driver and trainer rank 0 see (shared storage, as verl requires for its checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.backends.actor import Actor
from trainer.errors import ConfigError

ACTOR_FILE = "actor.pt"


def _layout(actor: Actor) -> str:
    from trainer.backends.fsdp import is_sharded

    return "fsdp_full" if is_sharded(actor.model) else "plain"


def save_actor_state(actor: Actor, path: Path, rank: int) -> None:
    """Gather the full training state to rank 0 and write it to `path` (a collective when sharded)."""
    layout = _layout(actor)
    if layout == "plain":
        state: dict[str, Any] | None = actor.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the tensors, others {}
        model = get_model_state_dict(actor.model, options=opts)
        optim = get_optimizer_state_dict(actor.model, actor.optimizer, options=opts)
        state = {"model": model, "optimizer": optim, "scheduler": actor.scheduler.state_dict()}
    if rank == 0:
        torch.save({"layout": layout, **state}, path)


def load_actor_state(actor: Actor, path: Path, rank: int) -> None:
    """Restore what `save_actor_state` wrote (a collective when sharded: rank 0 reads and broadcasts)."""
    layout = _layout(actor)
    state: dict[str, Any] = {}
    if rank == 0 or layout == "plain":
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["layout"] != layout:
            raise ConfigError(f"{path}: written by a run whose policy layout is {state['layout']}, this run's is "
                              f"{layout} (fix: resume with the same trainer worker count, 1 vs several, or set "
                              f"trainer.resume=false)")
    if layout == "plain":
        actor.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(actor.model, state.get("model", {}), options=opts)
    set_optimizer_state_dict(actor.model, actor.optimizer, state.get("optimizer", {}), options=opts)
    # the LR schedule is the same on every rank: rank 0's copy goes to all
    sched = [state.get("scheduler")]
    torch.distributed.broadcast_object_list(sched, src=0)
    actor.scheduler.load_state_dict(sched[0])
