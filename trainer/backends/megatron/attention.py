"""Causal attention through torch's fused SDPA kernels for megatron-core's local layer spec.

megatron-core's local spec (no TransformerEngine) computes attention in `DotProductAttention`: the
`[b, heads, s, s]` score matrix is materialized, masked, soft-maxed and multiplied by V in separate
kernels, with the keys and values repeated over GQA groups first. `CausalSDPA` is a drop-in
`core_attention` that computes the same function with `torch.nn.functional.scaled_dot_product_attention`
(flash / memory-efficient kernels on CUDA, GQA without repeating K and V), so the scores never reach
device memory.

It is exact for the `MegatronActor`'s batches only because of how they are laid out: every row is
left-aligned (real tokens first, padding after; `trainer/backends/megatron/backend.py`) and run under the
plain causal mask, so causal attention (`is_causal=True`) is that mask. The mask tensor megatron
passes is therefore not read; a layer built with another mask type, attention dropout, packed
sequences, an attention bias or a softmax offset is refused at build time or call time.

    spec = get_gpt_layer_local_spec(...)
    use_sdpa_attention(spec)        # before GPTModel(...)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class CausalSDPA(DotProductAttention):
    """`DotProductAttention` with the same inputs and output (`q [sq, b, np, hn]`, `k, v [sk, b, ng, hn]`
    -> `[sq, b, np * hn]`), computed causally by torch's SDPA (module docstring)."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: AttnMaskType, *args: Any, **kwargs: Any):
        super().__init__(config, layer_number, attn_mask_type, *args, **kwargs)
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"CausalSDPA: attn_mask_type={attn_mask_type} (only causal)")
        if config.attention_dropout:
            raise ValueError(f"CausalSDPA: attention_dropout={config.attention_dropout} (only 0)")
        if getattr(self, "softmax_offset", None) is not None:
            raise ValueError("CausalSDPA: softmax offsets are not supported")

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: AttnMaskType | None = None, attention_bias: Any = None,
                packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("CausalSDPA: packed sequences and attention biases are not supported")
        if attn_mask_type not in (None, AttnMaskType.causal):
            raise ValueError(f"CausalSDPA: attn_mask_type={attn_mask_type} at call time (only causal)")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        gqa = q.shape[1] != k.shape[1]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=gqa)
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


def use_sdpa_attention(spec: Any) -> Any:
    """Put `CausalSDPA` into a local-spec layer's self-attention (in place; returns the spec)."""
    import functools

    attn = spec.submodules.self_attention  # a ModuleSpec, or a functools.partial of it in later megatron-core
    sub = attn.keywords["submodules"] if isinstance(attn, functools.partial) else attn.submodules
    sub.core_attention = CausalSDPA
    return spec
