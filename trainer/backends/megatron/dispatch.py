"""The MoE token dispatcher of one expert-parallel rank: no host sync, no atomic adds.

With every expert on the rank (`expert_model_parallel_size: 1`) there is nothing to communicate, yet
megatron-core's alltoall dispatcher (what the local layer spec gets without TransformerEngine) still
copies the tokens-per-expert counts to the host and waits for them in every MoE layer's forward,
copies every permuted token once more to "sort" its one chunk per expert, and un-permutes with
`scatter_add_` (atomic adds, in bf16 for bf16 activations) whose permutation's backward is an
`index_add_` (atomics again). `LocalTokenDispatcher` does the same permutation with gathers only:

    slots:   the T·k (token, expert) pairs of the routing map in expert-major order, tokens ascending
             within an expert (megatron's order: `routing_map.T` flattened, its k·T nonzeros);
             token_of_slot[s] = the token of slot s; slot_of_token[t, j] = the j-th slot of token t
    permute  x_perm[s] = x[token_of_slot[s]]        backward  dx[t] = sum_j dx_perm[slot_of_token[t, j]]
    combine  y[t] = sum_j y_perm[slot_of_token[t, j]]   backward  dy_perm[s] = dy[token_of_slot[s]]

Every shape is static (a dropless router gives each token exactly k experts, so there are T·k slots),
the counts stay on the device (`GroupedExperts` turns them into grouped-GEMM offsets there), and the
sums over a token's k slots are one reduction each (fp32 accumulation, one rounding) instead of k
rounded atomic adds in arrival order: deterministic, and for k = 2 bitwise megatron's result
(one rounding of y1 + y2 either way). The experts see exactly the tokens, order and probabilities
megatron's dispatcher gives them (tests/unit/test_megatron_local_dispatch.py checks both against
each other and against a dense reference).

Used where `actor.megatron.token_dispatcher` resolves to `local` (auto: when EP is 1; dropless
routing only: no capacity factor, no padding for quantization, no shared-expert overlap).

    install_local_dispatch(gpt_model)   # after GPTModel(...); every MoE layer's dispatcher replaced
"""

from __future__ import annotations

from typing import Any

import torch


class _Permute(torch.autograd.Function):
    """x [T, H] -> x[token_of_slot] [T·k, H]; the backward sums each token's k slot gradients."""

    @staticmethod
    def forward(ctx, x, token_of_slot, slot_of_token):
        ctx.save_for_backward(slot_of_token)
        return x.index_select(0, token_of_slot)

    @staticmethod
    def backward(ctx, grad):
        (slot_of_token,) = ctx.saved_tensors
        t, k = slot_of_token.shape
        return grad.index_select(0, slot_of_token.view(-1)).view(t, k, -1).sum(1), None, None


class _Combine(torch.autograd.Function):
    """y_perm [T·k, H] -> y [T, H], each token the sum of its k slots; the backward is a gather."""

    @staticmethod
    def forward(ctx, y, token_of_slot, slot_of_token):
        ctx.save_for_backward(token_of_slot)
        t, k = slot_of_token.shape
        return y.index_select(0, slot_of_token.view(-1)).view(t, k, -1).sum(1)

    @staticmethod
    def backward(ctx, grad):
        (token_of_slot,) = ctx.saved_tensors
        return grad.index_select(0, token_of_slot), None, None


class LocalTokenDispatcher:
    """megatron-core's token-dispatcher interface (the six calls `MoELayer` makes, in its order) for a
    rank holding every expert (module docstring). One instance per MoE layer; the state of a forward
    (the slot maps, the input's shape) lives until its combine."""

    def __init__(self, config: Any):
        problems = [f"{name}={getattr(config, name)!r}" for name, ok in (
            ("moe_expert_capacity_factor", lambda v: v is None),
            ("moe_router_padding_for_quantization", lambda v: not v),
            ("moe_shared_expert_overlap", lambda v: not v),
            ("moe_pad_expert_input_to_capacity", lambda v: not v)) if not ok(getattr(config, name, None))]
        if problems:
            raise ValueError(f"LocalTokenDispatcher: dropless routing only, got {', '.join(problems)}")
        self.config = config
        self.topk = config.moe_router_topk
        self.shared_experts = None  # MoELayer adds non-overlapped shared experts itself
        self.cudagraph_attrs: list[str] = []  # megatron's CUDA-graph capture of a dispatcher (not used here)
        self.valid_cudagraph_attrs = None

    def dispatch_preprocess(self, hidden: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        """`hidden [..., H]`, `routing_map [T, E]` (bool, k per row), `probs [T, E]` -> the tokens and their
        probabilities in slot order `[T·k, H]`, `[T·k]`."""
        self.hidden_shape = hidden.shape
        x = hidden.reshape(-1, hidden.shape[-1])
        t = x.shape[0]
        # the k·T nonzeros of routing_map.T, in index order (a stable descending sort of the flags puts them first)
        flat = routing_map.T.reshape(-1).argsort(descending=True, stable=True)[: t * self.topk]
        token_of_slot = flat % t
        self.token_of_slot = token_of_slot
        self.slot_of_token = token_of_slot.argsort(stable=True).view(t, self.topk)
        self.tokens_per_expert = routing_map.sum(0)
        permuted_probs = probs.T.reshape(-1).index_select(0, flat)
        return _Permute.apply(x, token_of_slot, self.slot_of_token), permuted_probs

    def token_dispatch(self, hidden: torch.Tensor, probs: torch.Tensor):
        return hidden, probs

    def dispatch_postprocess(self, hidden: torch.Tensor, probs: torch.Tensor):
        """-> (tokens grouped by expert, tokens per expert on the device, their probabilities)."""
        tokens_per_expert, self.tokens_per_expert = self.tokens_per_expert, None
        return hidden, tokens_per_expert, probs

    def combine_preprocess(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def token_combine(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def combine_postprocess(self, hidden: torch.Tensor) -> torch.Tensor:
        """Expert outputs in slot order `[T·k, H]` -> each token's sum, in the input's shape."""
        out = _Combine.apply(hidden, self.token_of_slot, self.slot_of_token)
        self.token_of_slot = self.slot_of_token = None
        return out.view(self.hidden_shape)

    def get_expert_zero_copy_buffers(self):
        """megatron-core >= 0.19 asks every dispatcher for buffers the experts may write into: none."""
        return None, None


def install_local_dispatch(model: torch.nn.Module) -> int:
    """Replace the token dispatcher of every MoE layer of `model` (one expert-parallel rank holding all the
    experts) with a `LocalTokenDispatcher`; returns how many were replaced."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    n = 0
    for module in model.modules():
        if isinstance(module, MoELayer):
            old = module.token_dispatcher
            if getattr(old, "ep_size", 1) != 1 or getattr(old, "tp_size", 1) != 1:
                raise ValueError(f"install_local_dispatch: the layer's experts are split over ranks (EP "
                                 f"{old.ep_size}, expert TP {old.tp_size}); the local dispatcher needs all on one")
            module.token_dispatcher = LocalTokenDispatcher(module.config)
            n += 1
    return n
