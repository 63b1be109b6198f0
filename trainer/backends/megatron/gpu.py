"""Megatron's own data parallelism and optimizer for `MegatronActor` on CUDA.

    actor = MegatronActor.from_hf(hf, cfg, ..., device=torch.device("cuda"), dtype=torch.bfloat16)
    # from_hf calls this when actor.megatron.optimizer is auto (on CUDA) or megatron:
    use_megatron_optimizer(actor)     # megatron DDP (fp32 grad buffers) + distributed optimizer

bf16 module parameters, fp32 gradient accumulation in megatron's contiguous grad buffers
(`DistributedDataParallel(grad_reduce_in_fp32=True)`), fp32 master weights and Adam state sharded
over the data-parallel ranks (`get_megatron_optimizer(use_distributed_optimizer=True)`), gradient
norm and clipping by the optimizer (over all model-parallel shards). Weight decay applies to every
parameter, as the torch path's AdamW does (megatron's default skips biases and norms; its standard
overrides are not used). Without TransformerEngine or Apex megatron's Adam is torch's AdamW in its
multi-kernel `foreach` form; `use_fused_adam` switches it to torch's fused kernel (one pass over
master, gradient and moments per tensor; same math). `optimizer="sgd"` (plain SGD, no momentum) is
for the parity check of `trainer/bench/moe_backends.py`, whose step is proportional to the gradient.
Not on CPU: megatron's grad buffers and optimizers call CUDA unconditionally (the CPU path uses
torch's all-reduce and AdamW).

`Actor.update` runs unchanged: `finish_grads_and_clip` finishes the grad sync and makes megatron's
step (which clips, skips non-finite steps, and copies the masters back into the bf16 params) and
returns its gradient norm; the optimizer object the loop sees then only zeroes and reports lr.
Checkpoints: `_Steps.state_dict` holds megatron's optimizer state dict plus this rank's shard of
the parameter state (fp32 masters and Adam moments, megatron's `dp_reshardable` form, copied to
the CPU), which megatron's `load_state_dict` reads back; the per-rank checkpoint of
`trainer/distributed/actor_state.py` carries it as it is.
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
        """megatron's state dict of each inner optimizer with this rank's parameter state (fp32 masters,
        Adam moments) in it, copied to the CPU; `load_state_dict` restores masters, moments and step."""
        inner = []
        for opt in _inner(self.opt):
            sd = opt.state_dict()
            if hasattr(opt, "get_parameter_state_dp_reshardable"):  # the distributed optimizer
                sd["param_state"] = _to_cpu(opt.get_parameter_state_dp_reshardable())
                sd["param_state_sharding_type"] = "dp_reshardable"
            inner.append(sd)
        return {"inner": inner, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        inner = list(_inner(self.opt))
        if len(inner) != len(state["inner"]):
            raise RuntimeError(f"megatron optimizer checkpoint: {len(state['inner'])} optimizers saved, "
                               f"{len(inner)} built")
        with torch.no_grad():  # fp32 params: the optimizer's main params are views of the module's
            for opt, sd in zip(inner, state["inner"]):
                opt.load_state_dict(sd)
        use_fused_adam(self.opt)  # the loaded step counts go back onto the parameters' device
        self.count = state["count"]
        self._set_lr()


def _inner(opt: Any) -> list[Any]:
    """The optimizers a megatron ChainedOptimizer holds (dense and expert parameters), or `[opt]`."""
    return list(getattr(opt, "chained_optimizers", [opt]))


def _to_cpu(state: Any) -> Any:
    """`get_parameter_state_dp_reshardable()` with every tensor cloned to the CPU and each parameter's
    entry marked as no padding (the flag megatron's loader reads)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        out = {k: _to_cpu(v) for k, v in state.items()}
        if "param" in out and "gbuf_local_start" in out:
            out.setdefault("padding", False)
        return out
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state


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


def use_megatron_optimizer(actor: Any, optimizer: str = "adam", adam_eps: float = 1e-8) -> None:
    """Wrap `actor.model` in megatron's DDP and give it megatron's distributed optimizer (`optimizer`:
    "adam", AdamW with the actor's betas and weight decay; "sgd", plain SGD without momentum, which
    megatron-core 0.19's distributed optimizer refuses, so it runs in megatron's non-distributed
    mixed-precision optimizer: fp32 masters, one data-parallel copy)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if actor.megatron_optimizer is not None:
        raise RuntimeError("use_megatron_optimizer: the actor already has megatron's optimizer (from_hf sets it on "
                           "CUDA unless actor.megatron.optimizer=torch)")
    cfg = actor.cfg
    tcfg = actor.bridge.config
    distributed = optimizer != "sgd"
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=distributed)
    ddp = DistributedDataParallel(config=tcfg, ddp_config=ddp_cfg, module=actor.model)
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"use_megatron_optimizer: optimizer={optimizer!r} (adam or sgd)")
    ocfg = OptimizerConfig(optimizer=optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
                           adam_beta2=cfg.betas[1], adam_eps=adam_eps, sgd_momentum=0.0, clip_grad=cfg.grad_clip,
                           bf16=tcfg.bf16, params_dtype=tcfg.params_dtype, use_distributed_optimizer=distributed)
    opt = get_megatron_optimizer(ocfg, [ddp], config_overrides={})  # {}: weight decay on every parameter
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
    from megatron.core import parallel_state as ps

    from trainer.backends.megatron.norm import tp_partial_grad_params

    actor.ddp.finish_grad_sync()
    if ps.get_tensor_model_parallel_world_size() > 1:  # q/k norms, sequence-parallel norms and routers (as the CPU path)
        for p in tp_partial_grad_params(actor.gpt):
            torch.distributed.all_reduce(p.main_grad, group=ps.get_tensor_model_parallel_group())
    ok, grad_norm, _ = actor.megatron_optimizer.step()
    if not ok or grad_norm is None:
        return torch.tensor(float("nan"))
    return torch.tensor(float(grad_norm))
