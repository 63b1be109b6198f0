"""Grouped expert GEMMs for megatron-core's MoE layer without TransformerEngine.

megatron-core's local layer spec runs the experts one at a time (`SequentialMLP`, whatever
`moe_grouped_gemm` says; its grouped path is TransformerEngine's `TEGroupedMLP`). `GroupedExperts`
is a drop-in experts module for `MoELayer` (same call: tokens already permuted by expert, tokens per
local expert, routing probabilities): all local experts' fc1 in one `torch.nn.functional.grouped_mm`,
SwiGLU, probabilities, fc2 in a second one. Weights: `fc1 [E_local, 2I, H]` (gate rows, then up),
`fc2 [E_local, H, I]` -- transformers' fused layout. `trainer/backends/megatron/backend.py` maps them from and
to the HF names per expert through mbridge's tables. On CPU (where torch's grouped_mm has no
reliable backward) the same math runs as a loop over experts.

    spec = get_gpt_layer_local_spec(num_experts=E)
    use_grouped_experts(spec)       # before GPTModel(...)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class GroupedExperts(MegatronModule):
    """The local experts of one MoE layer as two 3D weights (module docstring). Expert-tensor-parallel
    size 1 only (each expert whole on its rank)."""

    def __init__(self, num_local_experts: int, config: Any, submodules: Any = None, pg_collection: Any = None,
                 name: str | None = None, **_: Any):
        super().__init__(config=config)
        if getattr(config, "expert_tensor_parallel_size", 1) not in (None, 1):
            raise ValueError("GroupedExperts: expert_tensor_parallel_size must be 1")
        if not config.gated_linear_unit:
            raise ValueError("GroupedExperts: only gated (SwiGLU) experts")
        e, h, i = num_local_experts, config.hidden_size, config.moe_ffn_hidden_size
        self.num_local_experts = e
        dev = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.fc1 = torch.nn.Parameter(torch.empty(e, 2 * i, h, dtype=config.params_dtype, device=dev))
        self.fc2 = torch.nn.Parameter(torch.empty(e, h, i, dtype=config.params_dtype, device=dev))
        std = config.init_method_std
        with torch.no_grad():
            self.fc1.normal_(0, std)
            self.fc2.normal_(0, std / (2.0 * config.num_layers) ** 0.5)  # megatron's scaled init for output layers
        for p in (self.fc1, self.fc2):
            p.allreduce = False  # expert parameter: reduced over the expert-data-parallel group, not DP
        self.activation = config.activation_func

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor):
        """`hidden [T, H]` grouped by local expert, `tokens_per_expert [E_local]`, `probs [T]` -> `([T, H], None)`."""
        if hidden.is_cuda and _GROUPED_MM is not None:
            offs = torch.cumsum(tokens_per_expert.to(hidden.device), 0).to(torch.int32)
            h = _GROUPED_MM(hidden, self.fc1.transpose(-2, -1), offs=offs)  # [T, 2I]
            gate, up = h.chunk(2, dim=-1)
            a = (self.activation(gate) * up * probs.unsqueeze(-1).to(h.dtype)).to(hidden.dtype)
            out = _GROUPED_MM(a, self.fc2.transpose(-2, -1), offs=offs)  # [T, H]
            return out, None
        outs = []
        counts = tokens_per_expert.tolist()
        for e, (x, p) in enumerate(zip(torch.split(hidden, counts), torch.split(probs, counts))):
            gate, up = F.linear(x, self.fc1[e]).chunk(2, dim=-1)
            outs.append(F.linear((self.activation(gate) * up * p.unsqueeze(-1).to(x.dtype)).to(x.dtype), self.fc2[e]))
        return torch.cat(outs, 0), None


def use_grouped_experts(spec: Any) -> Any:
    """Put `GroupedExperts` into a local-spec layer's MoE submodules (in place; returns the spec)."""
    import functools

    mlp = spec.submodules.mlp  # a ModuleSpec (megatron-core 0.16) or a functools.partial of MoELayer (0.19)
    sub = mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules
    sub.experts = GroupedExperts
    return spec
