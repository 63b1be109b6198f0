"""Which policy a Ray trainer worker builds (`actor.strategy`), and over which data-parallel layout.

    dp = data_parallel_size(cfg, world_size)         # how many pieces the driver cuts each batch into
    actor, critic = build_worker_models(hf_model, cfg, world_size, device)   # critic: None without critic.enable
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
from trainer.backends.build import build_actor_and_critic
from trainer.backends.critic import Critic
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


def build_worker_models(model: torch.nn.Module, cfg: TrainerConfig, world_size: int,
                        device: torch.device) -> tuple[Actor, Critic | None]:
    """This worker's policy over `model` (the HF model, on CPU; the default process group joined when
    `world_size > 1`) and, with `critic.enable`, its critic (`trainer/backends/build.py`). The mini-batch
    is divided by the data-parallel size."""
    actor_cfg = worker_actor_config(cfg.actor, data_parallel_size(cfg, world_size))
    return build_actor_and_critic(model, cfg, actor_cfg, device=device, shard=world_size > 1)
