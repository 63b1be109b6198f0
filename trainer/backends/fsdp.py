"""FSDP2 (torch `fully_shard`) for the policy across N data-parallel trainer workers.

    init_data_parallel(rank, world_size, master_addr, master_port, backend="gloo")   # once per worker
    model = shard_model(model, device)                                               # before the optimizer

Each transformer block is its own FSDP unit (all-gathered for its forward/backward, then
resharded); the root unit holds the embeddings, final norm and LM head (tied weights stay together).
Parameters become `DTensor`s sharded on dim 0 over a 1-D device mesh of the trainer workers: gloo
on CPU, NCCL (RCCL on ROCm) on GPU.

Gradient reduction: the losses (`trainer/algorithms/aggregation.py`) are divided by the *global*
token / sequence counts of the mini-batch (all-reduced over the workers in `Actor.update`), so
each worker's loss is its share of the global loss and the global gradient is the SUM of the
workers' gradients. FSDP2 averages over ranks by default (divides the reduce-scatter by the world
size); `shard_model` sets the divide factor to 1 so the reduction is a plain sum. The result: N
workers on a global batch give the same update as one worker on that batch (the equivalence test
`tests/unit/test_fsdp_equivalence.py` checks it to fp32 rounding).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard


def default_backend(device: torch.device) -> str:
    """gloo for CPU workers, nccl for CUDA ones (ROCm builds map nccl to RCCL)."""
    return "nccl" if device.type == "cuda" else "gloo"


def rendezvous_store(world_size: int, *, timeout_s: float = 600.0) -> dist.TCPStore:
    """Rank 0's store for the data-parallel group, bound to a port the OS picks and held open from
    then on (a port probed free and bound later can be taken in between by another process)."""
    return dist.TCPStore("0.0.0.0", 0, world_size, True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def init_data_parallel(rank: int, world_size: int, master_addr: str, master_port: int, *,
                       backend: str = "gloo", timeout_s: float = 600.0, store: dist.Store | None = None) -> None:
    """Join the trainer workers' default process group (idempotent). Rank 0 passes the store it made
    with `rendezvous_store`; the others connect to it at (master_addr, master_port). Without one, rank 0
    opens the store on master_port itself (processes that agreed on a port beforehand, as the tests' spawns)."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder layers of a transformers causal LM (Llama/Qwen2/Qwen3 layout), or of a module
    that names its transformer body in `base_model_prefix` (the critic's `ValueModel`)."""
    inner = getattr(model, "model", None)
    if inner is None:
        inner = getattr(model, getattr(model, "base_model_prefix", "") or "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "transformer", None), "h", None)
    return list(layers) if layers is not None else []


def shard_model(model: torch.nn.Module, device: torch.device, *, sum_gradients: bool = True) -> torch.nn.Module:
    """Shard `model` in place over all ranks of the default process group and return it.

    `sum_gradients=True` (the trainer's choice, see the module docstring) makes the gradient
    reduce-scatter a sum instead of FSDP2's default mean.
    """
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    model.to(device)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if sum_gradients:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                if hasattr(module, "set_force_sum_reduction_for_comms"):
                    module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def layout_of(model: torch.nn.Module) -> str:
    """`fsdp_full` for an FSDP2-sharded model, else `plain` (`Actor.checkpoint_layout` for a policy)."""
    return "fsdp_full" if is_sharded(model) else "plain"


@torch.no_grad()
def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded parameters on the CPU by name (a collective: every rank must call it)."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = full.detach().cpu().clone()
    return out


def sharded_response_logprobs(model: torch.nn.Module, batch, *, temperature: float = 1.0, chunk_size: int = 1024,
                              with_entropy: bool = False, lm_head_compile_backend: str | None = None,
                              keep_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` for an FSDP2-sharded model: `(logprobs [N, R], entropy [N, R])`.

    FSDP2 all-gathers a unit's parameters in its forward pre-hook, so the root unit (embeddings,
    final norm, LM head) must be entered through the root module's own forward: run it with
    `logits_to_keep=1` (the full-vocabulary head on one position only), catch the base model's
    hidden states with a forward hook, and apply the chunked LM head to the response positions.
    The root keeps its parameters unsharded after forward (FSDP2's default for the root), so the
    head's weight is a plain tensor here and its gradient is reduced at the end of backward.
    `lm_head_compile_backend`: the LM-head chunks compiled (`actor.lm_head_compile`); `keep_logits`:
    `actor.lm_head_keep_logits` (`lm_head_logprobs`).
    """
    from trainer.ops.logprobs import lm_head_logprobs

    captured: dict[str, torch.Tensor] = {}
    base = getattr(model, model.base_model_prefix)
    hook = base.register_forward_hook(lambda _m, _a, out: captured.__setitem__("h", out.last_hidden_state))
    try:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
              use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    p, r = batch.prompt_len, batch.responses.shape[1]
    hidden = captured["h"][:, p - 1:p - 1 + r]  # [N, R, H]
    return lm_head_logprobs(hidden, model.get_output_embeddings(), batch.responses, temperature=temperature,
                            chunk_size=chunk_size, with_entropy=with_entropy, compile_backend=lm_head_compile_backend,
                            keep_logits=keep_logits)
