"""Which policy a Ray trainer worker builds (`actor.strategy`), and over which data-parallel layout.

    dp = data_parallel_size(cfg, world_size)         # how many pieces the driver cuts each batch into
    actor = build_worker_actor(hf_model, cfg, world_size, device)
    actor.data_parallel()                            # (this rank's piece, dp)

`fsdp2`: the transformers model sharded with FSDP2 over all N workers (`trainer/backends/fsdp.py`),
data parallel over all of them. `megatron`: a `MegatronActor` (`trainer/backends/megatron/backend.py`)
whose parallel groups megatron-core carves out of the workers' default process group (gloo on CPU,
NCCL on GPU): tensor parallel `actor.megatron.tensor_model_parallel_size`, expert parallel
`expert_model_parallel_size` (taken out of the data-parallel ranks, as megatron-core does), data
parallel over the rest (N / (TP x PP); `pipeline_model_parallel_size` stages). The ranks of one
tensor-parallel group and of one pipeline get the same piece of the batch; statistics are summed over
the data-parallel group (`MegatronActor.all_reduce_sum`), and the weights leave by HF name with the
TP / EP shards and the pipeline stages gathered (`named_weights`), in the HF model's
parameter order, so the colocated engines and the fully-async weight broadcast take them as they
take FSDP2's. Both are the same `Actor` interface; the loops and the workers call nothing else.
"""

from __future__ import annotations

import torch

from trainer.backends.actor import Actor
from trainer.config import TrainerConfig
from trainer.distributed.sharding import worker_actor_config
from trainer.errors import ConfigError


def data_parallel_size(cfg: TrainerConfig, world_size: int) -> int:
    """The number of data-parallel ranks among `world_size` trainer workers."""
    if cfg.actor.strategy != "megatron":
        return world_size
    m = cfg.actor.megatron
    model_parallel = m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    if world_size % model_parallel or world_size % m.expert_model_parallel_size:
        raise ConfigError(f"actor.megatron.tensor_model_parallel_size={m.tensor_model_parallel_size} x "
                          f"pipeline_model_parallel_size={m.pipeline_model_parallel_size}, "
                          f"expert_model_parallel_size={m.expert_model_parallel_size}: each must divide the "
                          f"{world_size} trainer workers (fix: change them or the trainer GPU count)")
    return world_size // model_parallel


def build_worker_actor(model: torch.nn.Module, cfg: TrainerConfig, world_size: int, device: torch.device) -> Actor:
    """This worker's policy over `model` (the HF model, on CPU; the default process group joined when
    `world_size > 1`). The mini-batch is divided by the data-parallel size."""
    actor_cfg = worker_actor_config(cfg.actor, data_parallel_size(cfg, world_size))
    kw = {"temperature": cfg.rollout.temperature, "max_response_length": cfg.data.max_response_length, "device": device}
    if cfg.actor.strategy == "megatron":
        from trainer.backends.megatron.backend import MegatronActor

        return MegatronActor.from_hf(model, actor_cfg, seed=cfg.trainer.seed, **kw)
    if world_size > 1:
        from trainer.backends.fsdp import shard_model

        model = shard_model(model, device)
    else:
        model.to(device)
    return Actor(model, actor_cfg, **kw)
