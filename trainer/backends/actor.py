"""The policy worker: log-probs for a batch, and the PPO-style update over mini- and micro-batches.

`Actor.update` is verl's `update_policy`, written out:

    for epoch in range(ppo_epochs):
        for mini_batch in batch.chunks(ppo_mini_batch_size * n):         # one optimizer step each
            counts = tokens / sequences of the mini-batch (summed over data-parallel workers)
            for micro in mini_batch.chunks(ppo_micro_batch_size_per_gpu):  # forward_backward
                logp, entropy = forward(micro)                             # [n, R]
                loss = pg_loss(old_logp, logp, adv) - entropy_coeff * H + kl_coef * KL(logp, ref)
                loss.backward()                                            # micro_batch_loss: each term
                                                                           # normalized by the mini-batch's
            clip_grad_norm; optimizer.step()                               # global counts

Because every micro-batch loss is divided by the *mini-batch's* token (or sequence) count, the
gradient is the same whatever the micro-batch size and the number of data-parallel workers.
`micro_batch_loss` is the one copy of that loss math; `forward_backward` runs a mini-batch's
micro-batches through it one after the other, and is the hook where a backend runs them another way
(the Megatron backend's pipeline schedule, `trainer/backends/megatron/pipeline.py`).
When the step is exactly on-policy (one epoch, one mini-batch, old log-probs recomputed by the
trainer) the update forward *is* the old-log-prob forward: `old_logprobs = logp.detach()`, saving a
forward pass, as verl does.

Data parallelism: when `torch.distributed` is initialized with several ranks the model is sharded
with FSDP2 (`fully_shard`, `trainer/backends/fsdp.py`) and the counts are all-reduced.

Precision (`actor.mixed_precision`):
- `none`: the model's own dtype throughout (fp32 on CPU by default).
- `bf16`: fp32 params, grads and AdamW state; forward/backward matmuls in bf16 under `torch.autocast`.
- `bf16_params`: bf16 module params, fp32 masters + main grads + AdamW state owned by the optimizer
  side, one master->bf16 copy per step (`trainer/backends/mixed_precision.py`; single worker only).
AdamW is fused on CUDA (`fused=True`: one kernel over all params) and the default elsewhere.

`actor.compile: true` compiles the decoder layers and the LM-head chunk math with fixed shapes
(`trainer/backends/compile.py`); the math is unchanged (the unit test compares loss and gradients).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from trainer.algorithms.aggregation import agg_loss, global_counts, masked_mean
from trainer.algorithms.kl import kl_penalty
from trainer.algorithms.mismatch import truncated_is_weights
from trainer.algorithms.policy_loss import compute_policy_loss
from trainer.backends.mixed_precision import BF16Params
from trainer.components.batch import Batch
from trainer.config import ActorConfig
from trainer.errors import ConfigError
from trainer.ops.flops import batch_seqlens, mfu, train_flops
from trainer.ops.logprobs import response_logprobs
from trainer.platform.env import peak_bf16_tflops

Routed = tuple[torch.Tensor, dict[str, float], torch.Tensor]  # RouterRecorder.pop(): loss, stats, [L, E] counts


class MicroBatchOut(NamedTuple):
    """What one micro-batch adds to its mini-batch: its share of the statistics (summed by `update`), the MoE
    top-k counts `[L, E]` of its forward (None: dense), its forward's detached log-probs when they are the
    old ones (`reuse_forward_as_old`; else None)."""

    stats: dict[str, float]
    expert_counts: torch.Tensor | None
    old_logprobs: torch.Tensor | None


LossFn = Callable[[Batch, torch.Tensor, torch.Tensor, "Routed | None"], tuple[torch.Tensor, MicroBatchOut]]


def token_share(micro: Batch, counts: dict[str, float]) -> float:
    """The micro-batch's share of the mini-batch's response tokens (`global_counts`, over all data-parallel ranks)."""
    return micro.response_mask.sum().item() / max(counts["global_num_tokens"], 1.0)


def dp_world() -> tuple[int, int]:
    """(rank, world size) of the data-parallel group; (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum of each named value over the data-parallel workers (the values themselves with one worker);
    every worker must pass the same keys in the same order."""
    if dp_world()[1] == 1:
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(values, t.tolist()))


def lm_head_compile_backend(cfg: ActorConfig, device: torch.device) -> str | None:
    """The torch.compile backend of the LM-head chunk math (`actor.lm_head_compile`; auto: on CUDA), or None
    for the eager chunks. `actor.compile` compiles the head itself, so `lm_head_compile: off` with it is refused."""
    if cfg.compile and cfg.lm_head_compile == "off":
        raise ConfigError("actor.lm_head_compile=off with actor.compile=true: actor.compile compiles the LM-head "
                          "chunks too (fix: actor.lm_head_compile=auto, or actor.compile=false)")
    on = cfg.lm_head_compile == "on" or (cfg.lm_head_compile == "auto" and device.type == "cuda")
    if not on or cfg.compile:
        return None
    from trainer.backends.compile import compile_in_process, raise_recompile_limit

    raise_recompile_limit()  # each (chunk rows, with_entropy, temperature) is one graph
    compile_in_process()  # inductor's worker pool off (trainer/backends/compile.py says why)
    return cfg.compile_backend


class Actor:
    """Holds the trainable policy (and its optimizer) on this worker."""

    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, *, temperature: float, max_response_length: int,
                 device: torch.device):
        self.cfg = cfg
        self.temperature = temperature
        self.max_response_length = max_response_length
        self.device = device
        self.model = model
        from trainer.backends.fsdp import is_sharded

        sharded = is_sharded(model) or any(hasattr(p, "full_tensor") for p in model.parameters())
        self.master: BF16Params | None = None
        if cfg.mixed_precision == "bf16_params":
            if sharded:
                raise ConfigError("actor.mixed_precision: bf16_params keeps unsharded fp32 masters and does not "
                                  "support FSDP2-sharded models (fix: use mixed_precision: bf16 with several workers)")
            self.master = BF16Params(model)
            params = self.master.masters
        else:
            params = [p for p in model.parameters() if p.requires_grad]
        self.compile_backend: str | None = None
        self.lm_head_backend = lm_head_compile_backend(cfg, device)  # compiled LM-head chunks alone (or None)
        if cfg.compile:
            from trainer.backends.compile import compile_decoder_layers

            if sharded:
                raise ConfigError("actor.compile: not supported for FSDP2-sharded models (fix: set actor.compile: false "
                                  "with several workers)")
            if getattr(model, "is_gradient_checkpointing", False) or getattr(model, "is_activation_checkpointing", False):
                raise ConfigError("actor.compile: not supported with gradient checkpointing (fix: set "
                                  "model.gradient_checkpointing: false or actor.compile: false)")
            compile_decoder_layers(model, backend=cfg.compile_backend)
            self.compile_backend = cfg.compile_backend
        from trainer.models.moe import RouterRecorder, is_moe

        # MoE: router logits of the update forwards -> load-balancing loss and actor/moe/* metrics
        self.router: RouterRecorder | None = RouterRecorder(model) if is_moe(model.config) else None
        if self.router is None and cfg.moe_aux_loss_coeff > 0:
            raise ConfigError(f"actor.moe_aux_loss_coeff={cfg.moe_aux_loss_coeff}: the model is not a mixture of "
                              f"experts, so there is no router to balance (fix: set it to 0, or train an MoE model)")
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                                           fused=fused or None, foreach=None if fused else (device.type != "cpu" or None))
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)

    # ------------------------------------------------------------------ inference
    def _logprobs(self, micro: Batch, *, with_entropy: bool = False, model: torch.nn.Module | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(logprobs [n, R], entropy [n, R])`; an FSDP2-sharded model enters through its root forward."""
        from trainer.backends.fsdp import is_sharded, sharded_response_logprobs

        model = self.model if model is None else model
        fn = sharded_response_logprobs if is_sharded(model) else response_logprobs
        # mixed precision: autocast for fp32 weights (`bf16`, or the fp32 reference model next to
        # `bf16_params`); bf16 module params need no casts. Log-softmax statistics stay fp32.
        autocast = self.cfg.mixed_precision != "none" and next(model.parameters()).dtype == torch.float32
        # compiled mode (`actor.compile`) for the trained model only: fixed shapes, compiled LM-head chunks;
        # `actor.lm_head_compile` alone: the compiled LM-head chunks for every model (trained and reference)
        if self.compile_backend is not None and model is self.model:
            kw = {"compile_backend": self.compile_backend}
        elif self.lm_head_backend is not None:
            kw = {"lm_head_compile_backend": self.lm_head_backend}
        else:
            kw = {}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            return fn(model, micro, temperature=self.temperature, chunk_size=self.cfg.logprob_chunk_size,
                      with_entropy=with_entropy, keep_logits=self.cfg.lm_head_keep_logits, **kw)

    def reference_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The KL loss's frozen reference policy, for `compute_logprobs(batch, model=ref)`: `model` (a copy of the
        initial HF model, taken before the policy's own changes) laid out as this backend lays out the policy:
        FSDP2-sharded over the same ranks when the policy is, else on the policy's device."""
        from trainer.backends.fsdp import is_sharded, shard_model

        model.requires_grad_(False)
        model = shard_model(model, self.device) if is_sharded(self.model) else model.to(self.device)
        return model.eval()

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, micro_batch_size: int | None = None,
                         model: torch.nn.Module | None = None) -> torch.Tensor:
        """Log-probs `[N, R]` of the batch's responses under the current weights (or under `model`,
        e.g. the frozen reference policy, computed the same way)."""
        model = self.model if model is None else model
        model.eval()
        size = micro_batch_size or self.cfg.ppo_micro_batch_size_per_gpu
        out = []
        for micro in batch.chunks(size):
            micro = micro.to(self.device)
            logp, _ = self._logprobs(micro, model=model)
            out.append(logp.float().cpu())
        return torch.cat(out)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights by name, for syncing to the rollout engine. Under `bf16_params` these
        are the bf16 module params the trainer's forward runs on (the engine gets the same weights). A frozen
        vision tower (`actor.freeze_vision_tower`) is left out."""
        from trainer.models.vlm import VISION_PREFIX

        for name, p in self.model.named_parameters():
            if self.cfg.freeze_vision_tower and name.startswith(VISION_PREFIX):
                continue  # frozen vision tower (actor.freeze_vision_tower): the engine's copy is already equal
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            yield name, full.detach()

    # ------------------------------------------------------------------ update
    def num_mini_batches(self, batch: Batch, n: int) -> int:
        size = self.cfg.ppo_mini_batch_size * n
        return -(-len(batch) // size)

    def is_on_policy(self, batch: Batch, n: int) -> bool:
        return self.cfg.ppo_epochs == 1 and self.num_mini_batches(batch, n) == 1

    def update(self, batch: Batch, n: int, *, reuse_forward_as_old: bool = False) -> dict[str, float]:
        """PPO epochs over mini-batches of `ppo_mini_batch_size * n` responses. Returns mean metrics.

        `reuse_forward_as_old`: the batch has no `old_logprobs`; the step is on-policy, so the
        update forward's own (detached) log-probs are the old ones. They are written back into
        `batch.old_logprobs` for the mismatch metrics.
        """
        cfg = self.cfg
        t_start = time.perf_counter()
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        mini_size = cfg.ppo_mini_batch_size * n
        old_from_forward: list[torch.Tensor] = []
        expert_counts: torch.Tensor | None = None  # MoE: [layers, experts] top-k assignments
        first = True
        witness = self.update_witness()
        skipped = 0
        for _ in range(cfg.ppo_epochs):
            for mini in batch.chunks(mini_size):
                counts = self.all_reduce_sum(global_counts(mini.response_mask))
                self.begin_mini_batch(counts)
                self.optimizer.zero_grad(set_to_none=True)
                if self.master is not None:
                    self.master.zero_grad()
                loss_fn = functools.partial(self.micro_batch_loss, counts=counts,
                                            reuse_forward_as_old=reuse_forward_as_old)
                if witness is not None:  # trainer/components/invariants.py: the loss and optimizer re-derived apart
                    loss_fn = witness.wrap(loss_fn, counts, reuse_forward_as_old)
                mb_stats: dict[str, float] = defaultdict(float)
                for out in self.forward_backward(list(mini.chunks(cfg.ppo_micro_batch_size_per_gpu)), loss_fn):
                    for k, v in out.stats.items():
                        mb_stats[k] += v
                    if out.expert_counts is not None:
                        expert_counts = out.expert_counts if expert_counts is None else expert_counts + out.expert_counts
                    if reuse_forward_as_old:
                        old_from_forward.append(out.old_logprobs)
                # each worker's statistics are its share of the mini-batch's (normalized by the global
                # counts), so their sum over the data-parallel workers is the mini-batch value
                mb_stats = self.all_reduce_sum({k: mb_stats[k] for k in sorted(mb_stats)})
                grad_norm = self.finish_grads_and_clip()
                if witness is not None:
                    witness.after_clip(grad_norm)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                    if self.master is not None:
                        self.master.sync_to_model()
                else:
                    metrics["actor/grad_norm_nonfinite"].append(1.0)
                    skipped += 1
                self.scheduler.step()
                if first:
                    metrics["actor/ppo_kl_first_minibatch"].append(mb_stats["actor/ppo_kl"])
                    metrics["actor/pg_clipfrac_first_minibatch"].append(mb_stats["actor/pg_clipfrac"])
                    first = False
                for k, v in mb_stats.items():
                    metrics[k].append(v)
                metrics["actor/grad_norm"].append(float(grad_norm))
        if reuse_forward_as_old:
            batch.old_logprobs = torch.cat(old_from_forward)
        out = {k: sum(v) / len(v) for k, v in metrics.items()}
        if expert_counts is not None:
            from trainer.models.moe import expert_load_metrics

            flat = self.all_reduce_sum({str(i): float(c) for i, c in enumerate(expert_counts.flatten())})
            summed = torch.tensor(list(flat.values()), dtype=torch.float64).view_as(expert_counts)
            out.update(expert_load_metrics(summed, self.router.top_k))
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        if witness is not None:
            out.update(witness.metrics(len(batch), n, skipped))
        self.model.eval()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out.update(self._mfu(batch, time.perf_counter() - t_start))
        return out

    def update_witness(self):
        """The optimizer and loss witnesses of this actor (`trainer/components/invariants.py`), made at the first update;
        None for a backend with its own optimizer or update (Megatron)."""
        if type(self).micro_batch_loss is not Actor.micro_batch_loss or self.cfg.strategy == "megatron":
            return None
        if getattr(self, "_witness", None) is None:
            from trainer.components.invariants import UpdateWitness

            self._witness = UpdateWitness(self)
        return self._witness

    # ------------------------------------------------------------------ one micro-batch
    def forward_backward(self, micros: list[Batch], loss_fn: LossFn) -> list[MicroBatchOut]:
        """Forward and backward of a mini-batch's micro-batches, one after the other (the gradients add up);
        `loss_fn(micro, logp, entropy, routed)` is `micro_batch_loss` with the mini-batch's counts. Backend
        hook: the Megatron backend under pipeline parallelism runs the same `loss_fn` on its last stage
        inside megatron-core's schedule (`trainer/backends/megatron/pipeline.py`)."""
        outs = []
        for micro in micros:
            micro = micro.to(self.device)
            logp, entropy, routed = self._forward(micro)
            loss, out = loss_fn(micro, logp, entropy, routed)
            loss.backward()
            outs.append(out)
        return outs

    def _forward(self, micro: Batch) -> tuple[torch.Tensor, torch.Tensor, Routed | None]:
        """`(logprobs, entropy, routed)` of an update micro-batch; `routed` is the MoE router's record of this
        forward (`RouterRecorder.pop()`: load-balancing loss, statistics, top-k counts), None for a dense model."""
        if self.router is None:
            logp, entropy = self._logprobs(micro, with_entropy=True)
            return logp, entropy, None
        with self.router.capture():
            logp, entropy = self._logprobs(micro, with_entropy=True)
        return logp, entropy, self.router.pop()

    def micro_batch_loss(self, micro: Batch, logp: torch.Tensor, entropy: torch.Tensor, routed: Routed | None, *,
                         counts: dict[str, float], reuse_forward_as_old: bool) -> tuple[torch.Tensor, MicroBatchOut]:
        """The loss of one micro-batch (each term normalized by the mini-batch's global `counts`) and its share
        of the mini-batch's statistics: the one copy of the update's loss math, whichever way the micro-batches run."""
        cfg = self.cfg
        mask = micro.response_mask
        agg_kw = dict(horizon=self.max_response_length, **counts)
        old = micro.old_logprobs if not reuse_forward_as_old else logp.detach()
        tis = (truncated_is_weights(old, micro.rollout_logprobs, mask, cap=cfg.tis_cap)
               if cfg.tis_cap is not None else None)
        pg_loss, pg_m = compute_policy_loss(
            old, logp, micro.advantages, mask, clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
            loss_agg_mode=cfg.loss_agg_mode, tis_weights=tis, **agg_kw)
        loss = pg_loss
        ent = agg_loss(entropy if cfg.entropy_coeff != 0 else entropy.detach(), mask, cfg.loss_agg_mode, **agg_kw)
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * ent
        # the micro-batch's scalars go to the host in one copy (one sync instead of one per statistic)
        scalars: dict[str, torch.Tensor] = {}
        if cfg.use_kl_loss:
            kl = agg_loss(kl_penalty(logp, micro.ref_logprobs, cfg.kl_loss_type), mask, cfg.loss_agg_mode, **agg_kw)
            loss = loss + cfg.kl_loss_coef * kl
            scalars["actor/kl_loss"] = kl.detach()
        scalars["actor/pg_loss"] = pg_loss.detach()
        scalars["actor/entropy"] = ent.detach()
        for k in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
            scalars[k] = torch.as_tensor(pg_m[k], device=logp.device)
        if tis is not None:
            scalars["actor/tis_weight_mean"] = masked_mean(tis, mask).detach()
        scalars["_tokens"] = mask.sum()
        values = dict(zip(scalars, torch.stack([v.double().reshape(()) for v in scalars.values()]).tolist()))
        # token-weighted means over the mini-batch (micro-batch means x its token share)
        w = values.pop("_tokens") / max(counts["global_num_tokens"], 1.0)  # token_share(micro, counts)
        aux, moe_stats, expert_counts = self.router_terms(routed, w)
        if aux is not None:
            loss = loss + aux
        stats: dict[str, float] = {k: values[k] for k in ("actor/kl_loss",) if k in values}
        stats.update(moe_stats)
        stats["actor/pg_loss"] = values["actor/pg_loss"]
        stats["actor/entropy"] = values["actor/entropy"]
        for k in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
            stats[k] = values[k] * w
        if tis is not None:
            stats["actor/tis_weight_mean"] = values["actor/tis_weight_mean"] * w
        return loss, MicroBatchOut(stats, expert_counts, old.float().cpu() if reuse_forward_as_old else None)

    def router_terms(self, routed: Routed | None, weight: float
                     ) -> tuple[torch.Tensor | None, dict[str, float], torch.Tensor | None]:
        """The MoE part of a micro-batch's loss and statistics, from the router's record of its forward:
        `(moe_aux_loss_coeff x weight x load-balancing loss or None, actor/moe/* x weight, [L, E] top-k counts)`;
        `weight` is the micro-batch's share of the mini-batch's response tokens. `(None, {}, None)` without a router."""
        if routed is None:
            return None, {}, None
        lb_loss, moe_stats, expert_counts = routed
        aux = self.cfg.moe_aux_loss_coeff * weight * lb_loss if self.cfg.moe_aux_loss_coeff > 0 else None
        return aux, {k: v * weight for k, v in moe_stats.items()}, expert_counts

    # ------------------------------------------------------------------ backend hooks (trainer/backends/megatron/backend.py)
    def begin_mini_batch(self, counts: dict[str, float]) -> None:
        """Called by `update` with a mini-batch's token counts (`global_counts`, summed over the data-parallel
        ranks) before its micro-batches. Nothing to do here; a backend that scales a per-micro-batch term by
        them keeps them (`MegatronActor`: megatron's aux loss)."""

    def data_parallel(self) -> tuple[int, int]:
        """(rank, size) of this worker in the data-parallel group: which piece of each batch it trains on."""
        return dp_world()

    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        """Sum of each named value over the data-parallel ranks."""
        return all_reduce_sum(values, self.device)

    def finish_grads_and_clip(self) -> torch.Tensor:
        """Gradient norm before clipping, after clipping to `actor.grad_clip` (FSDP2 reduced the grads in
        backward). Under bf16_params these are the fp32 main grads of the masters."""
        clip_params = self.master.masters if self.master is not None else self.model.parameters()
        grad_norm = torch.nn.utils.clip_grad_norm_(clip_params, self.cfg.grad_clip)
        return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm

    def _mfu(self, batch: Batch, seconds: float) -> dict[str, float]:
        """`perf/mfu/actor`: model FLOPs of this worker's update over seconds x the device's bf16 peak."""
        if self.device.type != "cuda":
            return {}
        try:
            peak = peak_bf16_tflops(torch.cuda.get_device_name(self.device), self.cfg.mfu_peak_tflops)
        except ConfigError:
            return {}
        flops = train_flops(self.flops_config(), batch_seqlens(batch.attention_mask)) * self.cfg.ppo_epochs
        return {"perf/mfu/actor": mfu(flops, seconds, peak)}

    def flops_config(self) -> Any:
        """The HF config whose model FLOPs `perf/mfu/actor` counts."""
        return self.model.config

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_layout(self) -> str:
        """How the Ray workers' checkpoint holds this policy (`trainer/distributed/actor_state.py`):
        `plain` (one worker's state is all of it) or `fsdp_full` (FSDP2 shards gathered to full state)."""
        from trainer.backends.fsdp import layout_of

        return layout_of(self.model)

    def state_dict(self) -> dict:
        """Model weights (the fp32 masters under `bf16_params`), optimizer and scheduler state."""
        model = self.master.master_state_dict() if self.master is not None else self.model.state_dict()
        return {"model": model, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.master is not None:
            self.master.load_master_state_dict(state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
