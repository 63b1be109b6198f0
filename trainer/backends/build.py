"""The trainable models of a run, built by the backend `actor.strategy` names: the policy and PPO's critic.

    actor, critic = build_actor_and_critic(hf_model, cfg, actor_cfg, device=device, shard=world_size > 1)

The one place that knows which backend class a strategy means, so neither the single-process loop
(`trainer/modes/steps.py`) nor the Ray trainer worker (`trainer/distributed/trainer_worker.py`) has a
case for one backend. `hf_model` is the initial HF model on CPU (the default process group already
joined when there are several ranks); `actor_cfg` is `actor.*` with the mini-batch already divided
among the data-parallel ranks (`trainer/distributed/sharding.py: worker_actor_config`); the critic is
None unless `critic.enable`.

- `fsdp2`: the critic copies the policy's body *before* the policy is moved or sharded (its own FSDP2
  units when `shard`), then the policy is sharded with FSDP2 (`shard`) or moved to `device`.
- `megatron`: the policy is megatron-core's GPTModel (`MegatronActor.from_hf`), which makes the TP / EP /
  DP groups; the critic is built after it, in those groups (`MegatronCritic`).
"""

from __future__ import annotations

from functools import partial

import torch

from trainer.backends.actor import Actor
from trainer.backends.critic import Critic
from trainer.config import ActorConfig, TrainerConfig


def build_actor_and_critic(model: torch.nn.Module, cfg: TrainerConfig, actor_cfg: ActorConfig, *,
                           device: torch.device, shard: bool) -> tuple[Actor, Critic | None]:
    """The policy over `model` and, with `critic.enable`, the value model from its initial weights."""
    actor_kw = {"temperature": cfg.rollout.temperature, "max_response_length": cfg.data.max_response_length,
                "device": device}
    critic_kw = {"device": device, "mini_batch_size": actor_cfg.ppo_mini_batch_size,
                 "micro_batch_size": actor_cfg.ppo_micro_batch_size_per_gpu, "ppo_epochs": actor_cfg.ppo_epochs,
                 "loss_agg_mode": actor_cfg.loss_agg_mode}
    if cfg.actor.strategy == "megatron":
        from trainer.backends.megatron.backend import MegatronActor
        from trainer.backends.megatron.critic import MegatronCritic

        actor = MegatronActor.from_hf(model, actor_cfg, seed=cfg.trainer.seed, **actor_kw)
        critic = (MegatronCritic(model, cfg.critic, megatron=cfg.actor.megatron, seed=cfg.trainer.seed, **critic_kw)
                  if cfg.critic.enable else None)
        return actor, critic
    from trainer.backends.fsdp import shard_model

    critic = (Critic(model, cfg.critic, shard=partial(shard_model, device=device) if shard else None, **critic_kw)
              if cfg.critic.enable else None)
    model = shard_model(model, device) if shard else model.to(device)
    return Actor(model, actor_cfg, **actor_kw), critic
