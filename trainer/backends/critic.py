"""The value model for PPO: the policy's transformer body with a scalar head, trained on GAE returns.

    V(s_t) = w^T h_t + b,   h_t = final hidden state at the position that predicts response token t

verl builds the critic as a token-classification model with one label; this is the same thing
written directly: a copy of the policy's base model (initialized from the policy, as verl does by
default) and a `Linear(H, 1)` head. Values are read at the same positions as the log-probs
(`hidden[:, P-1:P-1+R]`), so `values[:, t]` is the value of the state before token t.
The loss is verl's clipped value loss (`trainer/algorithms/policy_loss.py`).

Data parallelism (the Ray path, `trainer/distributed/critic_state.py`): `shard` (e.g.
`trainer.backends.fsdp.shard_model`) shards the value model with FSDP2 before the optimizer is
built; token/sequence counts and the loss statistics are all-reduced over the workers as in
`Actor.update`, so N workers on their shards of a global batch make the same update as one.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable

import torch

from trainer.algorithms.aggregation import global_counts
from trainer.algorithms.policy_loss import compute_value_loss
from trainer.backends.actor import all_reduce_sum
from trainer.components.batch import Batch
from trainer.config import CriticConfig


class ValueModel(torch.nn.Module):
    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.base_model_prefix = "body"
        self.body = copy.deepcopy(getattr(policy, policy.base_model_prefix))
        hidden = policy.config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1, dtype=next(policy.parameters()).dtype)
        torch.nn.init.normal_(self.value_head.weight, std=1.0 / (hidden + 1) ** 0.5)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        out = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, use_cache=False)
        p, r = batch.prompt_len, batch.responses.shape[1]
        h = out.last_hidden_state[:, p - 1:p - 1 + r]  # [N, R, H]
        return self.value_head(h).squeeze(-1).float()  # [N, R]


class Critic:
    def __init__(self, policy: torch.nn.Module, cfg: CriticConfig, *, device: torch.device, mini_batch_size: int,
                 micro_batch_size: int, ppo_epochs: int, loss_agg_mode: str,
                 shard: Callable[[torch.nn.Module], torch.nn.Module] | None = None):
        self.cfg = cfg
        self.device = device
        self.model = ValueModel(policy).to(device)
        if shard is not None:  # FSDP2 over the trainer workers: before the optimizer sees the parameters
            self.model = shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        self.ppo_epochs, self.loss_agg_mode = ppo_epochs, loss_agg_mode

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        self.model.eval()
        out = [self.model(m.to(self.device)).cpu() * m.response_mask for m in batch.chunks(self.micro_batch_size)]
        return torch.cat(out)  # [N, R]

    def update(self, batch: Batch, n: int) -> dict[str, float]:
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.ppo_epochs):
            for mini in batch.chunks(self.mini_batch_size * n):
                counts = self.all_reduce_sum(global_counts(mini.response_mask))
                self.optimizer.zero_grad(set_to_none=True)
                stats: dict[str, float] = defaultdict(float)
                for micro in mini.chunks(self.micro_batch_size):
                    micro = micro.to(self.device)
                    vpreds = self.model(micro)
                    loss, m = compute_value_loss(vpreds, micro.values, micro.returns, micro.response_mask,
                                                 cliprange_value=self.cfg.cliprange_value,
                                                 loss_agg_mode=self.loss_agg_mode, **counts)
                    loss.backward()
                    w = micro.response_mask.sum().item() / max(counts["global_num_tokens"], 1.0)
                    stats["critic/vf_loss"] += loss.item()
                    stats["critic/vf_clipfrac"] += float(m["critic/vf_clipfrac"]) * w
                # each worker's statistics are its share of the mini-batch's: their sum is the mini-batch value
                stats = self.all_reduce_sum({k: stats[k] for k in sorted(stats)})
                gn = self.finish_grads_and_clip()
                if torch.isfinite(gn):
                    self.optimizer.step()
                for k, v in stats.items():
                    metrics[k].append(v)
                metrics["critic/grad_norm"].append(float(gn))
        self.model.eval()
        return {k: sum(v) / len(v) for k, v in metrics.items()}

    # the reductions, as `Actor`'s: the Megatron critic (trainer/backends/megatron/critic.py) replaces these two
    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum of each named value over the data-parallel workers."""
        return all_reduce_sum(values, self.device)

    def finish_grads_and_clip(self) -> torch.Tensor:
        """Gradient norm before clipping, after clipping to `critic.grad_clip` (FSDP2 reduced the grads in backward)."""
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        return gn.full_tensor() if hasattr(gn, "full_tensor") else gn

    def checkpoint_layout(self) -> str:
        """`plain` or `fsdp_full` (trainer/distributed/critic_state.py)."""
        from trainer.backends.fsdp import layout_of

        return layout_of(self.model)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
