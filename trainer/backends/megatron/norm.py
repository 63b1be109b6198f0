"""Layer norms for megatron-core's local layer spec that sequence parallelism can use.

Sequence parallelism (`actor.megatron.sequence_parallel`, Korthikanti et al. 2022) splits the
activations outside the tensor-parallel GEMMs (norms, residual adds, dropout) along the sequence over
the tensor-parallel ranks: the embedding's output is reduce-scattered, a column-parallel linear
all-gathers its input and a row-parallel one reduce-scatters its output, so each rank normalizes
only its `S / TP` tokens. The math is unchanged; the bookkeeping is that a norm weight's gradient on
one rank is then a partial sum over that rank's tokens, and must be summed over the tensor-parallel
group. megatron-core finds those weights by their `sequence_parallel` attribute (its router weights
set it; TransformerEngine's and Apex's norms set it). The local spec's `WrappedTorchNorm` builds torch's
norm without it and so refuses `sequence_parallel`.

`SequenceParallelNorm` builds the same torch norm (`RMSNorm` or `LayerNorm`, the config's eps) and
marks its parameters with `sequence_parallel = config.sequence_parallel`; `use_sequence_parallel_norms`
puts it everywhere the local spec builds a norm (each layer's input and pre-MLP norms, the q / k norms,
the decoder's final norm). With sequence parallelism off it is `WrappedTorchNorm`'s module, parameter
names included. `tp_partial_grad_params` lists the parameters whose gradients the actor must sum over
the tensor-parallel group (`trainer/backends/megatron/backend.py`: those marked so, and the q / k norms, which
see only the rank's attention heads).

    spec = use_sequence_parallel_norms(get_gpt_layer_local_spec(...), config)  # a TransformerBlockSubmodules
    GPTModel(config=config, transformer_layer_spec=spec, ...)
"""

from __future__ import annotations

from typing import Any

import torch


class SequenceParallelNorm:
    """Factory with `WrappedTorchNorm`'s call: `SequenceParallelNorm(config, hidden_size, eps)` -> a torch
    norm module whose parameters carry `sequence_parallel` (module docstring)."""

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        for flag in ("layernorm_zero_centered_gamma", "persist_layer_norm", "memory_efficient_layer_norm"):
            if getattr(config, flag, False):
                raise ValueError(f"SequenceParallelNorm: {flag}=True is not supported by torch's norms")
        if config.normalization == "RMSNorm":
            norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        elif config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"SequenceParallelNorm: normalization={config.normalization} (RMSNorm or LayerNorm)")
        for p in norm.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)
        return norm


def use_sequence_parallel_norms(layer_spec: Any, config: Any) -> Any:
    """The block spec of `layer_spec` (a local-spec TransformerLayer) with `SequenceParallelNorm` for every
    norm: the layers this pipeline stage builds, and the final norm."""
    import functools

    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = layer_spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelNorm
    attn = layer.self_attention  # a ModuleSpec, or a functools.partial of it in later megatron-core
    sub = attn.keywords["submodules"] if isinstance(attn, functools.partial) else attn.submodules
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(sub, name) is not IdentityOp:
            setattr(sub, name, SequenceParallelNorm)
    n = get_num_layers_to_build(config)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * n, layer_norm=SequenceParallelNorm)


def tp_partial_grad_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters whose gradient on a tensor-parallel rank is a partial sum (summed over the
    tensor-parallel group before the step): marked `sequence_parallel` (norms, routers under sequence
    parallelism) or q / k norms (each rank normalizes its own attention heads)."""
    return [p for name, p in model.named_parameters()
            if getattr(p, "sequence_parallel", False) or "q_layernorm" in name or "k_layernorm" in name]
