"""Model FLOPs of a decoder forward+backward, and model FLOPs utilization (MFU).

Counted the way verl's `FlopsCounter` and the PaLM paper (Chowdhery et al. 2022, appendix B) do:

    flops = 6 * N_matmul * tokens  +  12 * L * n_heads * head_dim * sum_i(seqlen_i^2)

`N_matmul` is every weight that takes part in a matrix product: the decoder layers' projections
plus the LM head (`V * H`); for a mixture of experts, the active ones (the top-k experts and the
router of each MoE layer); the input embedding is a lookup and does not count, but a tied LM head
does (it is a matmul). The second term is attention's QK^T and AV products (forward 2 x 2 x s^2 x d
per head and layer, x3 for forward+backward), counted for the full square like verl does, not the
causal half. MFU = flops / (seconds * peak), the peak being the device's dense bf16 figure
(`trainer.platform.env.peak_bf16_tflops`) or a measured one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def matmul_params(config: Any) -> int:
    """Weights that enter matrix products per token: layer projections plus the LM head."""
    h = config.hidden_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    d = getattr(config, "head_dim", None) or h // heads
    inter = config.intermediate_size
    attn = h * heads * d + 2 * h * kv * d + heads * d * h  # q, k, v, o
    mlp = 3 * h * inter  # gate, up, down
    layers = config.num_hidden_layers
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 0
    if experts > 1:  # mixture of experts: the top-k experts a token goes through, plus the router (active params)
        k = config.num_experts_per_tok
        moe_mlp = k * 3 * h * (getattr(config, "moe_intermediate_size", None) or inter) + h * experts
        step = getattr(config, "decoder_sparse_step", 1) or 1
        dense_only = set(getattr(config, "mlp_only_layers", None) or [])
        n_moe = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        return layers * attn + n_moe * moe_mlp + (layers - n_moe) * mlp + config.vocab_size * h
    return layers * (attn + mlp) + config.vocab_size * h


def train_flops(config: Any, seqlens: Iterable[int]) -> float:
    """Forward+backward model FLOPs for sequences of the given lengths (see the module docstring)."""
    lens = [int(s) for s in seqlens]
    heads = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    dense = 6.0 * matmul_params(config) * sum(lens)
    attn = 12.0 * config.num_hidden_layers * heads * d * sum(s * s for s in lens)
    return dense + attn


def batch_seqlens(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per row of a `[N, T]` attention mask."""
    return attention_mask.sum(-1).tolist()


def mfu(flops: float, seconds: float, peak_tflops: float, num_devices: int = 1) -> float:
    """Fraction of `num_devices x peak_tflops` that `flops` in `seconds` used."""
    if seconds <= 0 or peak_tflops <= 0:
        return 0.0
    return flops / (seconds * peak_tflops * 1e12 * num_devices)
