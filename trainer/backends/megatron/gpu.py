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

import functools
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
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if actor.megatron_optimizer is not None:
        raise RuntimeError("use_megatron_optimizer: the actor already has megatron's optimizer (from_hf sets it on "
                           "CUDA unless actor.megatron.optimizer=torch)")
    cfg = actor.cfg
    tcfg = actor.bridge.config
    distributed = optimizer != "sgd"
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=distributed)
    ddp = first_write_ddp_class()(config=tcfg, ddp_config=ddp_cfg, module=actor.model)
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"use_megatron_optimizer: optimizer={optimizer!r} (adam or sgd)")
    ocfg = OptimizerConfig(optimizer=optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
                           adam_beta2=cfg.betas[1], adam_eps=adam_eps, sgd_momentum=0.0, clip_grad=cfg.grad_clip,
                           bf16=tcfg.bf16, params_dtype=tcfg.params_dtype, use_distributed_optimizer=distributed)
    opt = get_megatron_optimizer(ocfg, [ddp], config_overrides={})  # {}: weight decay on every parameter
    use_fused_adam(opt)
    use_in_place_clip()
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


# --------------------------------------------------------------------------- fixed per-step costs

@functools.cache
def first_write_ddp_class() -> type:
    """megatron's `DistributedDataParallel` with the step's first gradient of each parameter *written* into
    its fp32 main grad instead of added to a zeroed buffer.

    megatron zeroes every grad buffer at the start of a step (`zero_grad_buffer`: one pass over 4 B per
    parameter) and its backward hook adds each parameter's bf16 gradient into the fp32 main grad
    (`main_grad.add_(grad)`: torch's mixed-dtype add, an unvectorized kernel reading 6 B and writing 4 B per
    element). Here `zero_grad_buffer` marks the parameters unwritten instead of zeroing, the hook's first
    call of the step copies the gradient into the main grad (`copy_`: 2 B read, 4 B written, vectorized), later
    calls (more micro-batches) add as megatron does, and `finish_grad_sync` zeroes the main grad of any
    parameter that got no gradient before it reduces. `0 + g` is `g` exactly in fp32 (a bf16 value widens
    without rounding), so the main grads are bitwise the same (up to the sign of a zero, which no later
    operation reads); the buffers' padding is never written, so it stays the zeros it was allocated as.
    On only where megatron's hook is the plain add: no gradient-accumulation fusion (TransformerEngine writes
    the main grad itself), no overlapped reduction, no delayed wgrad, no CUDA-graph or extra main grads, no
    MXFP8 buffer reuse; otherwise megatron's own behaviour throughout."""
    from megatron.core.distributed import DistributedDataParallel

    class FirstWriteDDP(DistributedDataParallel):
        def __init__(self, config: Any, ddp_config: Any, module: torch.nn.Module, **kw: Any):
            self._unwritten: set = set()  # parameters whose main grad holds last step's gradient
            super().__init__(config=config, ddp_config=ddp_config, module=module, **kw)
            buffers = self.buffers + self.expert_parallel_buffers
            self.first_write = not (getattr(config, "gradient_accumulation_fusion", False)
                                    or ddp_config.overlap_grad_reduce
                                    or getattr(ddp_config, "delay_wgrad_compute", False)
                                    or getattr(ddp_config, "reuse_grad_buf_for_mxfp8_param_ag", False)
                                    or getattr(config, "cuda_graph_impl", "none") != "none"
                                    or any(getattr(b, "extra_main_grads", None) for b in buffers))

        def _make_backward_post_hook(self, param: torch.nn.Parameter):
            megatron_hook = super()._make_backward_post_hook(param)

            def hook(*unused: Any) -> None:
                if param in self._unwritten and param.grad is not None and not param.grad_added_to_main_grad:
                    param.main_grad.copy_(param.grad.data)  # the step's first gradient: written, not added
                    param.grad = None  # megatron's hook then has nothing to add
                    self._unwritten.discard(param)
                megatron_hook(*unused)

            return hook

        def zero_grad_buffer(self) -> None:
            if not self.first_write:
                return super().zero_grad_buffer()
            for param in self.params_with_grad:
                param.grad_added_to_main_grad = False
            for bucket_group in self.bucket_groups + self.expert_parallel_bucket_groups:
                bucket_group.reset()
            self._unwritten = {p for p in self.params_with_grad if p in self.param_to_bucket_group}

        def finish_grad_sync(self, *args: Any, **kw: Any) -> None:
            with torch.no_grad():
                for param in self._unwritten:  # no gradient this step: zero, as megatron's zeroed buffer holds
                    param.main_grad.zero_()
            self._unwritten = set()
            super().finish_grad_sync(*args, **kw)

    return FirstWriteDDP


def _scale_in_place(chunk_size: int, noop_flag: Any, tensor_lists: list, scale: float) -> None:
    """megatron's `local_multi_tensor_scale` (its fallback without TransformerEngine or Apex:
    `dst.copy_(src * scale)` per tensor, a temporary and a second pass) as one in-place
    `torch._foreach_mul_` when source and destination are the same tensors (the gradient clip); the same
    fp32 product per element."""
    from megatron.core.utils import local_multi_tensor_scale

    src, dst = tensor_lists
    if len(src) == len(dst) and all(s is d for s, d in zip(src, dst)):
        if dst:
            torch._foreach_mul_(dst, scale)
        return
    local_multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale)


def use_in_place_clip() -> None:
    """The gradient clip of megatron's optimizer in place (`_scale_in_place`), where megatron runs its local
    fallback (no TransformerEngine or Apex; their kernels already scale in place)."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.utils import local_multi_tensor_scale

    if clip_grads.multi_tensor_scale_impl is local_multi_tensor_scale:
        clip_grads.multi_tensor_scale_impl = _scale_in_place
