"""PPO's value model under `actor.strategy: megatron`: a megatron-core GPTModel body with a scalar head.

    V(s_t) = w^T h_t + b,   h_t = the decoder's final (normed) hidden state at the position that predicts
                               response token t,  w in R^H, b in R

    critic = MegatronCritic(hf_policy, cfg.critic, megatron=cfg.actor.megatron, device=dev, mini_batch_size=...,
                            micro_batch_size=..., ppo_epochs=..., loss_agg_mode=...)
    critic.compute_values(batch); critic.update(batch, n); critic.state_dict()   # as trainer/backends/critic.py

`MegatronCritic` *is* the FSDP2 backend's `Critic` (`trainer/backends/critic.py`): the same
`compute_values` / `update` / `state_dict` / `load_state_dict`, the same update loop and the same loss
(verl's clipped value loss, `trainer/algorithms/policy_loss.py` `compute_value_loss`), so the loops call it
with no case for the engine. What differs is the value model and the two reductions:

Body: a second GPTModel built through its own mbridge bridge from the policy's HF config (the policy's TP /
EP layout and sequence-parallel setting; no MoE load-balancing loss), loaded with the initial policy's HF
weights (`hf_checkpoint_tensors` + `load_hf_weights`, as `MegatronActor.reference_policy`), so the critic
starts from the policy's body, as the FSDP2 critic and verl do. It is built with `post_process=True` (so
the decoder block owns the final norm), then its output layer is dropped and `post_process` is set off:
its forward returns the final-normed hidden states `[T, N, H]` and no `[N, T, V]` logits, and the critic
holds no `[V, H]` LM-head weight or its Adam state.

Where values are read: rows are left-aligned and run under a plain causal mask, as the actor's
(`left_align`: megatron-core's RoPE uses the token's index in the row); `values[:, t]` is the head at
left-aligned column `prompt tokens - 1 + t`, the position the FSDP2 critic reads as
`hidden[:, P-1:P-1+R]` in the left-padded layout: the value of the state before response token t.

Head: `Linear(H, 1)` in the policy's dtype, normal(std 1/sqrt(H+1)) weight and zero bias, as the FSDP2
critic's. Under tensor parallelism it is not split: every TP rank holds the whole (tiny) head, and the
decoder's output is whole on every TP rank (without sequence parallelism megatron's row-parallel layers
all-reduce it; with it, the `[T / TP, N, H]` slices are gathered over TP first, whose backward hands each
rank its own slice of the gradient). Every TP rank then computes the same values, loss and head gradient.

Reductions (`all_reduce_sum`, `finish_grads_and_clip`): `MegatronActor`'s own, over the same groups:
counts and statistics summed over the data-parallel group (not the TP ranks, which hold the same rows);
partial gradients summed over TP, gradients over data-parallel (experts: expert-data-parallel), the global
norm over the model-parallel shards (the replicated head counted once), then clipped to `critic.grad_clip`.

Departures from the FSDP2 critic:
- the head is initialized from its own generator seeded with the run's seed (same distribution), not from
  the global random stream, so every rank builds the same head without a broadcast;
- the optimizer is torch's AdamW with the gradients all-reduced by torch on every device (the actor's CPU
  path): megatron's DDP and distributed optimizer (`actor.megatron.optimizer`) are the actor's only;
- not built: pipeline parallelism (`actor.megatron.pipeline_model_parallel_size > 1`; the value head would
  live on the last stage and the schedule would need the critic's loss function) and the fully-async loop
  (which trains no critic on either backend); both stop at start (`check_megatron_supported`).
"""

from __future__ import annotations

import torch

from trainer.backends.critic import Critic
from trainer.backends.megatron.backend import (
    MegatronActor,
    build_bridge,
    build_gpt_model,
    hf_checkpoint_tensors,
    init_parallel,
    left_align,
    load_hf_weights,
)
from trainer.components.batch import Batch
from trainer.config import CriticConfig, MegatronConfig
from trainer.errors import ConfigError


class MegatronValueModel(torch.nn.Module):
    """GPTModel body (no output layer) + `Linear(H, 1)`; `forward(batch) -> values [N, R]` (module docstring)."""

    def __init__(self, gpt: torch.nn.Module, hidden: int, *, dtype: torch.dtype, seed: int, sequence_parallel: bool,
                 tp: int):
        super().__init__()
        self.gpt = gpt
        self.sequence_parallel, self.tp = sequence_parallel, tp
        self.value_head = torch.nn.Linear(hidden, 1, dtype=dtype)
        g = torch.Generator().manual_seed(seed)  # the same head on every rank, no broadcast
        with torch.no_grad():
            self.value_head.weight.copy_(torch.randn(1, hidden, generator=g) / (hidden + 1) ** 0.5)
            self.value_head.bias.zero_()

    def forward(self, batch: Batch) -> torch.Tensor:
        ids, index = left_align(batch)
        if self.sequence_parallel:  # the sequence splits evenly over the TP ranks (padding after the tokens)
            ids = torch.nn.functional.pad(ids, (0, -ids.shape[1] % self.tp))
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)[None].expand_as(ids)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=ids.device), 1)[None, None]  # True: masked
        hidden = self.gpt(ids, pos, causal)  # [T, N, H] after the final norm; SP: this rank's [T / TP, N, H]
        if self.sequence_parallel:  # whole on every TP rank; backward keeps this rank's slice (no reduction)
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        hidden = hidden.transpose(0, 1)  # [N, T, H]
        r = index.shape[1]
        h = torch.gather(hidden, 1, index[..., None].expand(-1, r, hidden.shape[-1]))  # [N, R, H]
        return self.value_head(h).squeeze(-1).float()  # [N, R]


class MegatronCritic(Critic):
    """`Critic` on a megatron-core GPTModel body (module docstring)."""

    def __init__(self, policy: torch.nn.Module, cfg: CriticConfig, *, megatron: MegatronConfig, device: torch.device,
                 mini_batch_size: int, micro_batch_size: int, ppo_epochs: int, loss_agg_mode: str, seed: int = 0):
        """`policy`: the initial HF policy (its config and weights); `megatron`: the actor's layout
        (`actor.megatron`). The parallel groups are the actor's when it was built first, else made here."""
        from megatron.core import parallel_state as ps

        pp = megatron.pipeline_model_parallel_size
        if pp > 1:  # the same line as check_megatron_supported's, for a caller that skipped it
            raise ConfigError(f"critic.enable: the value model is not built under pipeline parallelism "
                              f"(actor.megatron.pipeline_model_parallel_size={pp}) (fix: "
                              f"pipeline_model_parallel_size=1, or actor.strategy=fsdp2)")
        tp, ep = megatron.tensor_model_parallel_size, megatron.expert_model_parallel_size
        if not ps.model_parallel_is_initialized():
            init_parallel(tp, ep, seed=seed)
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
                ps.get_pipeline_model_parallel_world_size())
        if have != (tp, ep, 1):
            raise RuntimeError(f"MegatronCritic: the parallel groups are (tp, ep, pp) = {have}, the config's "
                               f"{(tp, ep, pp)}")
        self.cfg, self.device = cfg, device
        dtype = next(policy.parameters()).dtype
        self.bridge = build_bridge(policy.config, dtype=dtype, sequence_parallel=megatron.sequence_parallel,
                                   token_dispatcher=megatron.resolved_token_dispatcher())
        gpt = build_gpt_model(self.bridge).to(device=device, dtype=dtype)
        load_hf_weights(gpt, self.bridge, hf_checkpoint_tensors(policy))
        gpt.output_layer = None  # the decoder keeps its final norm; no LM head, no logits
        gpt.post_process = False
        self.gpt = gpt
        self.model = MegatronValueModel(gpt, self.bridge.config.hidden_size, dtype=dtype, seed=seed,
                                        sequence_parallel=megatron.sequence_parallel, tp=tp).to(device)
        self.megatron_optimizer = None  # MegatronActor.finish_grads_and_clip: the torch path
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.ppo_epochs, self.loss_agg_mode = ppo_epochs, loss_agg_mode

    # the actor's reductions over the same groups (they read self.model, self.gpt, self.cfg.grad_clip, self.device)
    all_reduce_sum = MegatronActor.all_reduce_sum
    finish_grads_and_clip = MegatronActor.finish_grads_and_clip
    checkpoint_layout = MegatronActor.checkpoint_layout  # one state per rank (trainer/distributed/critic_state.py)
