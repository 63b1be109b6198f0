"""Weight sync from the trainer to rollout workers on other devices: a bucketed broadcast.

Colocated runs copy weights in-process (`engine.update_weights(actor.named_weights())`). When the
rollout runs on its own devices (fully-async mode), trainer rank 0 and the rollout workers form a
separate process group of their own (a `TCPStore` + `ProcessGroupGloo` on CPU or
`ProcessGroupNCCL` on GPU, independent of the trainer's data-parallel default group):

    plan = engine_weight_plan(engine)                 # [(name, shape, dtype)], the receiver's order/dtypes
    trainer:  send(group, plan, actor.named_weights())   every trainer rank iterates (FSDP all-gathers
                                                         are collective); rank 0 broadcasts
    rollout:  engine.update_weights(receive(group, plan))

Parameters are packed into flat buckets of at most `bucket_mb` MiB of one dtype, one broadcast per
bucket, so the number of collectives is small and no bucket is larger than the budget. The
receiver unpacks each bucket as it arrives (`receive` is a generator, consumed by
`update_weights`), so it never holds more than one bucket beside its own weights.

With several rollout replicas (fully-async `async.rollout_gpus > 1`) the one broadcast reaches all
of them (ranks 1..M); `weight_fingerprint(engine)` digests what each replica's engine then holds,
so the driver can check that all hold the same weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WeightSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def engine_weight_plan(model: torch.nn.Module) -> list[WeightSpec]:
    """The receiver's parameters in `named_parameters()` order (tied weights appear once)."""
    return [WeightSpec(name, tuple(p.shape), p.dtype) for name, p in model.named_parameters()]


def buckets(plan: list[WeightSpec], bucket_mb: float) -> list[list[WeightSpec]]:
    """Consecutive specs grouped into buckets of one dtype and at most `bucket_mb` MiB (a larger
    tensor gets a bucket of its own)."""
    limit = int(bucket_mb * 2**20)
    out: list[list[WeightSpec]] = []
    size = 0
    for spec in plan:
        nbytes = spec.numel * spec.dtype.itemsize
        if not out or out[-1][0].dtype != spec.dtype or size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += nbytes
    return out


class SyncGroup:
    """A process group of trainer rank 0 (rank 0 here) and the rollout workers (ranks 1..)."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, *, device: torch.device,
                 timeout_s: float = 600.0, store: dist.Store | None = None):
        """Rank 0 passes the store it opened (`trainer.backends.fsdp.rendezvous_store`), the others connect."""
        self.rank, self.world_size, self.device = rank, world_size, device
        timeout = timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
        prefix = dist.PrefixStore("weight_sync", store)
        self.backend = "nccl" if device.type == "cuda" and hasattr(dist, "ProcessGroupNCCL") else "gloo"
        if self.backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(prefix, rank, world_size)
        else:  # CPU workers (or a torch without NCCL): a CUDA tensor is staged through host memory
            self.pg = dist.ProcessGroupGloo(prefix, rank, world_size, timeout)
        self._store = store  # the master's store must outlive the group

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.backend == "gloo" and tensor.device.type != "cpu":
            host = tensor.cpu()
            self.pg.broadcast(host, 0).wait()
            tensor.copy_(host)
            return
        self.pg.broadcast(tensor, 0).wait()


def send(group: SyncGroup | None, plan: list[WeightSpec], weights: Iterable[tuple[str, torch.Tensor]], *,
         bucket_mb: float = 256.0) -> int:
    """Broadcast `weights` (consumed in plan order; every trainer rank must iterate them) from rank 0.

    `group` is None on trainer ranks other than 0: they only take part in the FSDP all-gathers.
    Returns the bytes sent.
    """
    it = iter(weights)
    sent = 0
    for bucket in buckets(plan, bucket_mb):
        parts = []
        for spec in bucket:
            name, tensor = next(it)
            if name != spec.name or tuple(tensor.shape) != spec.shape:
                raise RuntimeError(f"weight sync: trainer sends {name} {tuple(tensor.shape)} where the rollout "
                                   f"expects {spec.name} {spec.shape}")
            parts.append(tensor.reshape(-1).to(spec.dtype))
        if group is not None:
            flat = torch.cat(parts).to(group.device)  # [sum numel]
            group.broadcast(flat)
            sent += flat.numel() * flat.element_size()
    return sent


def receive(group: SyncGroup, plan: list[WeightSpec], *, bucket_mb: float = 256.0
            ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` for every planned weight, one broadcast bucket at a time."""
    for bucket in buckets(plan, bucket_mb):
        flat = torch.empty(sum(s.numel for s in bucket), dtype=bucket[0].dtype, device=group.device)
        group.broadcast(flat)
        offset = 0
        for spec in bucket:
            yield spec.name, flat[offset:offset + spec.numel].view(spec.shape)
            offset += spec.numel


@torch.no_grad()
def weight_fingerprint(engine: Any) -> str:
    """A sha256 digest of an engine's weights: of every parameter's bytes where the engine holds them
    in this process (`_params`: hf, static); else (vLLM, SGLang, whose weights live in the engine's
    own processes) of the tokens and log-probs of a fixed greedy probe, which equal weights
    reproduce exactly on one kind of device."""
    import hashlib

    from trainer.rollout.base import SamplingParams

    digest = hashlib.sha256()
    params = getattr(engine, "_params", None)
    if isinstance(params, dict):
        for name in sorted(params):
            t = params[name].detach().contiguous().reshape(-1)
            digest.update(name.encode())
            digest.update(t.cpu().view(torch.uint8).numpy().tobytes())
        return "params:" + digest.hexdigest()
    probe = [[1 + i for i in range(16)]]  # token ids every vocabulary has
    out = engine.generate(probe, SamplingParams(n=1, greedy=True, max_new_tokens=8, stop_token_ids=[]))
    digest.update(repr((out.response_ids, out.response_logprobs)).encode())
    return "probe:" + digest.hexdigest()
