"""bf16 module parameters with fp32 master weights owned by the optimizer (`actor.mixed_precision: bf16_params`).

Mixed-precision training in the style of Micikevicius et al. 2018 ("Mixed Precision Training",
arXiv:1710.03740) and Megatron-LM's distributed optimizer:

    module params   p_bf16              forward + backward run on them directly (no autocast casts)
    master weights  w_fp32              the optimizer's params; AdamW state (m, v) fp32 alongside
    main grads      g_fp32              g_fp32 += p_bf16.grad after every backward (then p.grad = None)
    optimizer step  w_fp32 <- AdamW(w_fp32, g_fp32)            (fused AdamW on CUDA)
                    p_bf16 <- bf16(w_fp32)                     (one cast-copy per tensor per step)

What this saves against `bf16` (fp32 params under `torch.autocast`): autocast casts every fp32
weight to bf16 in every forward (and again in a recomputed forward) and casts every weight
gradient back to fp32; here the weights are cast once per optimizer step.

Numerics, stated:
- Gradients leave backward in bf16 (8 mantissa bits). Each micro-batch's bf16 gradient is added
  into the fp32 main grad by a post-accumulate-grad hook, so accumulation over micro-batches is
  fp32 (one bf16 rounding per micro-batch per element, as in Megatron with fp32 grad accumulation).
  Within one backward, contributions to one parameter (tied embeddings, chunks of the LM head)
  are summed by autograd in bf16; the chunked LM head sums its own chunks in fp32 first.
- The activations and the residual stream are bf16 (as in the bf16 rollout engine) where
  autocast kept the residual stream in fp32; RMSNorm and softmax statistics still run in fp32.
- Updates are applied to the fp32 masters, so steps smaller than bf16's resolution of a weight
  still accumulate (the bf16 copy moves once the master has moved by half a bf16 ulp).
- Gradient-norm clipping runs on the fp32 main grads.

Not for FSDP2-sharded models (FSDP2 has its own `MixedPrecisionPolicy`); `Actor` refuses that pairing.
Checkpoints hold the fp32 masters under the module's parameter names (`master_state_dict`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class BF16Params:
    """Casts `model`'s trainable parameters to bf16 in place and keeps their fp32 masters.

    `masters` (fp32 `nn.Parameter`s, one per distinct trainable parameter, tied ones once) are what
    the optimizer updates; `sync_to_model()` copies them back after each step.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.model = model
        self.dtype = dtype
        self.params: list[torch.nn.Parameter] = []  # the module's (bf16) parameters
        self.masters: list[torch.nn.Parameter] = []  # their fp32 masters, same order
        seen: set[int] = set()
        for p in model.parameters():  # deduplicated: tied weights appear once
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            master = torch.nn.Parameter(p.detach().to(torch.float32, copy=True))
            p.data = p.data.to(dtype)
            p.grad = None
            p.register_post_accumulate_grad_hook(self._make_hook(master))
            self.params.append(p)
            self.masters.append(master)
        self._master_of = {id(p): m for p, m in zip(self.params, self.masters)}

    @staticmethod
    def _make_hook(master: torch.nn.Parameter):
        def hook(p: torch.Tensor) -> None:
            g = p.grad
            if g is None:
                return
            if master.grad is None:
                master.grad = g.to(torch.float32)  # a new fp32 buffer
            else:
                master.grad.add_(g)  # fp32 accumulation over micro-batches
            p.grad = None
        return hook

    def zero_grad(self) -> None:
        for m in self.masters:
            m.grad = None
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def sync_to_model(self) -> None:
        """`p_bf16 <- bf16(w_fp32)` for every parameter (round to nearest even), one cast-copy kernel per
        tensor: a few hundred launches, about a millisecond per optimizer step. (With a mixed-dtype
        `torch._foreach_copy_` here, one H200 run's colocated weight-sync check found engine weights
        unequal to the module's; a standalone probe of that copy was exact, so the plain copy stays.)"""
        for p, m in zip(self.params, self.masters):
            p.copy_(m)

    # ------------------------------------------------------------------ checkpoint
    def master_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with every trainable parameter replaced by its fp32 master."""
        sd = self.model.state_dict()
        for name, p in self.model.named_parameters(remove_duplicate=False):
            m = self._master_of.get(id(p))
            if m is not None and name in sd:
                sd[name] = m.detach()
        return sd

    @torch.no_grad()
    def load_master_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 (or any dtype) weights into the masters and the bf16 module parameters."""
        self.model.load_state_dict(state)  # buffers, frozen params; trainable ones get the bf16 cast
        for name, p in self.model.named_parameters(remove_duplicate=False):
            m = self._master_of.get(id(p))
            if m is not None and name in state:
                m.copy_(state[name])
        self.sync_to_model()

    def named_masters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.model.named_parameters():
            m = self._master_of.get(id(p))
            if m is not None:
                yield name, m
