"""Megatron's own data parallelism and optimizer for `MegatronActor` on CUDA.

    actor = MegatronActor.from_hf(hf, cfg, ..., device=torch.device("cuda"), dtype=torch.bfloat16)
    use_megatron_optimizer(actor)     # megatron DDP (fp32 grad buffers) + distributed optimizer

bf16 module parameters, fp32 gradient accumulation in megatron's contiguous grad buffers
(`DistributedDataParallel(grad_reduce_in_fp32=True)`), fp32 master weights and Adam state sharded
over the data-parallel ranks (`get_megatron_optimizer(use_distributed_optimizer=True)`), gradient
norm and clipping by the optimizer (over all model-parallel shards). Without TransformerEngine or
Apex megatron's Adam is torch's AdamW in its multi-kernel `foreach` form; `use_fused_adam` switches
it to torch's fused kernel (one pass over master, gradient and moments per tensor; same math). Not on CPU: megatron's grad
buffers and optimizers call CUDA unconditionally (the CPU path uses torch's all-reduce and AdamW).

`Actor.update` runs unchanged: `finish_grads_and_clip` finishes the grad sync and makes megatron's
step (which clips, skips non-finite steps, and copies the masters back into the bf16 params) and
returns its gradient norm; the optimizer object the loop sees then only zeroes and reports lr.
"""

from __future__ import annotations

from typing import Any

import torch


class _Steps:
    """What `Actor.update` calls on its optimizer and scheduler, for megatron's optimizer."""

    def __init__(self, ddp: Any, opt: Any, lr: float, warmup: int):
        self.ddp, self.opt, self.base_lr, self.warmup, self.count = ddp, opt, lr, warmup, 0
        self._set_lr()

    @property
    def param_groups(self) -> list[dict]:
        return self.opt.param_groups

    def _set_lr(self) -> None:
        lr = self.base_lr * (min(1.0, (self.count + 1) / self.warmup) if self.warmup > 0 else 1.0)
        for g in self.opt.param_groups:
            g["lr"] = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad(set_to_none)

    def step(self) -> None:  # the step ran in finish_grads_and_clip
        pass

    # scheduler side
    def scheduler_step(self) -> None:
        self.count += 1
        self._set_lr()

    def state_dict(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state["optimizer"])
        self.count = state["count"]
        self._set_lr()


class _Scheduler:
    def __init__(self, steps: _Steps):
        self.steps = steps

    def step(self) -> None:
        self.steps.scheduler_step()

    def state_dict(self) -> dict:
        return {"count": self.steps.count}

    def load_state_dict(self, state: dict) -> None:
        self.steps.count = state["count"]
        self.steps._set_lr()


def use_megatron_optimizer(actor: Any) -> None:
    """Wrap `actor.model` in megatron's DDP and give it megatron's distributed optimizer."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    cfg = actor.cfg
    tcfg = actor.bridge.config
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=True)
    ddp = DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=actor.model)
    ocfg = OptimizerConfig(optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
                           adam_beta2=cfg.betas[1], adam_eps=1e-8, clip_grad=cfg.grad_clip, bf16=tcfg.bf16,
                           params_dtype=tcfg.params_dtype, use_distributed_optimizer=True)
    opt = get_megatron_optimizer(ocfg, [ddp])
    use_fused_adam(opt)
    actor.ddp = ddp
    actor.model = ddp
    actor.megatron_optimizer = opt
    actor.optimizer = _Steps(ddp, opt, cfg.lr, cfg.warmup_steps)
    actor.scheduler = _Scheduler(actor.optimizer)


def use_fused_adam(opt: Any) -> None:
    """Run the torch Adam(W) inside megatron's (chained / distributed) optimizer as torch's fused kernel."""
    for inner in getattr(opt, "chained_optimizers", [opt]):
        torch_opt = getattr(inner, "optimizer", inner)
        if not isinstance(torch_opt, torch.optim.Adam | torch.optim.AdamW):
            continue  # TransformerEngine's or Apex's fused Adam: already one kernel
        for group in torch_opt.param_groups:
            group["foreach"], group["fused"] = False, True
            for p in group["params"]:
                state = torch_opt.state.get(p, {})
                if "step" in state:  # the fused kernel reads the step count from the parameter's device
                    state["step"] = torch.as_tensor(state["step"], dtype=torch.float32, device=p.device)


def megatron_step(actor: Any) -> torch.Tensor:
    """Finish the grad sync and run megatron's optimizer step; the gradient norm before clipping."""
    actor.ddp.finish_grad_sync()
    ok, grad_norm, _ = actor.megatron_optimizer.step()
    if not ok or grad_norm is None:
        return torch.tensor(float("nan"))
    return torch.tensor(float(grad_norm))
