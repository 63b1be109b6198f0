"""Mixture-of-experts models: a dense Llama upcycled into a Mixtral, tiny MoE configs, router hooks.

    model.upcycle_num_experts: 4      # SmolLM2 -> Mixtral with 4 copies of every MLP
    model.upcycle_top_k: 2
    model.path: tiny:qwen3_moe        # random-init 2-layer Qwen3-MoE (4 experts, top-2)

Upcycling (`upcycle_to_mixtral`): SmolLM2 is a Llama, and a Llama whose MLPs are sparse MoE blocks
is transformers' Mixtral. Every layer's MLP (gate/up/down projections) is copied into E experts
(`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj [E, H, I]`); the router (`gate.weight
[E, H]`) is drawn from N(0, initializer_range) so tokens spread over the experts. Mixtral's router
renormalizes the top-k softmax weights to sum to one, and the experts are identical, so at step 0
every token's MoE output is `sum_k w_k * MLP(x) = MLP(x)`: the model computes what the dense model
computes. For SmolLM2 (tests/unit/test_models_moe.py) in float64 top-1 is bitwise the dense model and
top-2 is within 1.9e-6 (transformers' router renormalizes the top-k weights in fp32, so they sum to 1
only to 1.2e-7); in fp32 it is within 1.3e-5, less than SmolLM2's own fp32 error (2.4e-5), from the CPU
GEMM summing an expert's few-token subset in another order. The router only gets a gradient once the
experts differ, which they do after the first update (each expert learns from the tokens sent to it).

Router statistics (`RouterRecorder`): forward hooks on the routers (transformers' `*TopKRouter`
modules return `(logits, top-k weights, top-k indices)`) and a pre-hook on the decoder (its
attention mask) record each forward's router logits with the mask of the tokens they belong to,
whether the prompt is shared across a group's responses or not. `RouterRecorder.pop()` turns them
into Megatron's switch load-balancing loss (differentiable) and the statistics of docs/metrics.md.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from transformers import LlamaConfig, MixtralConfig, MixtralForCausalLM, PreTrainedModel, Qwen3MoeConfig

from trainer.errors import ModelError

# tiny random-init MoE architectures (trainer/models/loading.py `tiny:<arch>`): config class, MoE fields
TINY_MOE: dict[str, tuple[type, dict[str, Any]]] = {
    "qwen3_moe": (Qwen3MoeConfig, {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                   "moe_intermediate_size": 64, "norm_topk_prob": True, "decoder_sparse_step": 1,
                                   "router_aux_loss_coef": 0.0}),
    "mixtral": (MixtralConfig, {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                "router_aux_loss_coef": 0.0}),
}


def is_moe(config: Any) -> bool:
    """Whether an HF config describes a mixture-of-experts model (a vision-language one: its text model)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return any((getattr(config, k, None) or 0) > 1 for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def mixtral_config_from_llama(dense: LlamaConfig, num_experts: int, top_k: int) -> MixtralConfig:
    """The Mixtral config whose attention, norms, embeddings and RoPE are the Llama's, with E experts."""
    if getattr(dense, "attention_bias", False) or getattr(dense, "mlp_bias", False):
        raise ModelError("model.upcycle_num_experts: the Llama has attention/MLP biases, which Mixtral has not "
                         "(fix: upcycle a bias-free Llama such as SmolLM2, or set model.upcycle_num_experts: 0)")
    rope = dict(getattr(dense, "rope_parameters", None) or {"rope_type": "default", "rope_theta": dense.rope_theta})
    if rope.get("rope_type", "default") != "default":
        raise ModelError(f"model.upcycle_num_experts: rope_type={rope['rope_type']} is not upcycled (fix: a Llama "
                         f"with default RoPE, or model.upcycle_num_experts: 0)")
    return MixtralConfig(
        vocab_size=dense.vocab_size, hidden_size=dense.hidden_size, intermediate_size=dense.intermediate_size,
        num_hidden_layers=dense.num_hidden_layers, num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads, head_dim=getattr(dense, "head_dim", None),
        hidden_act=dense.hidden_act, max_position_embeddings=dense.max_position_embeddings,
        initializer_range=dense.initializer_range, rms_norm_eps=dense.rms_norm_eps,
        rope_parameters=rope, tie_word_embeddings=dense.tie_word_embeddings, attention_dropout=0.0,
        bos_token_id=dense.bos_token_id, eos_token_id=dense.eos_token_id, pad_token_id=dense.pad_token_id,
        num_local_experts=num_experts, num_experts_per_tok=top_k, router_aux_loss_coef=0.0,
        output_router_logits=False, sliding_window=None, use_cache=False)


@torch.no_grad()
def upcycle_to_mixtral(dense: PreTrainedModel, num_experts: int, top_k: int, *, seed: int = 0,
                       experts_implementation: str | None = None) -> MixtralForCausalLM:
    """A Mixtral with every MLP of the dense Llama copied into `num_experts` experts (module docstring)."""
    if dense.config.model_type != "llama":
        raise ModelError(f"model.upcycle_num_experts: upcycling maps a Llama into a Mixtral; this model is a "
                         f"'{dense.config.model_type}' (fix: use a Llama such as embedded:smollm2-135m-instruct or "
                         f"tiny:llama, or set model.upcycle_num_experts: 0)")
    if num_experts < 2 or not 1 <= top_k <= num_experts:
        raise ModelError(f"model.upcycle_num_experts={num_experts}, model.upcycle_top_k={top_k}: need E >= 2 and "
                         f"1 <= top_k <= E (fix: e.g. 4 experts, top-2)")
    config = mixtral_config_from_llama(dense.config, num_experts, top_k)
    kw = {} if experts_implementation in (None, "auto") else {"experts_implementation": experts_implementation}
    dtype = next(dense.parameters()).dtype
    moe = MixtralForCausalLM._from_config(config, dtype=dtype, attn_implementation=dense.config._attn_implementation,
                                          **kw)
    src = dense.state_dict()
    dst = moe.state_dict()
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in dst:
        if ".mlp.experts." in name or ".mlp.gate." in name:
            continue
        if name not in src:
            raise ModelError(f"model.upcycle_num_experts: the dense model has no '{name}' (fix: upcycle a Llama)")
        out[name] = src[name]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}.mlp."
        gate, up, down = src[p + "gate_proj.weight"], src[p + "up_proj.weight"], src[p + "down_proj.weight"]
        out[p + "experts.gate_up_proj"] = torch.cat([gate, up], 0).unsqueeze(0).repeat(num_experts, 1, 1)
        out[p + "experts.down_proj"] = down.unsqueeze(0).repeat(num_experts, 1, 1)
        router = torch.randn(num_experts, config.hidden_size, generator=gen) * config.initializer_range
        out[p + "gate.weight"] = router.to(dtype)
    missing, unexpected = moe.load_state_dict(out, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(f"model.upcycle_num_experts: weights not mapped: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]} (fix: upcycle a plain Llama)")
    moe.tie_weights()
    moe.generation_config = dense.generation_config
    moe.config.use_cache = False
    return moe


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


class RouterRecorder:
    """Records router logits of a model's forwards (in `capture()`) and reduces them (`pop`)."""

    def __init__(self, model: torch.nn.Module):
        self.routers = _routers(model)
        if not self.routers:
            raise ModelError(f"{type(model).__name__} has no top-k router modules to record")
        self.num_experts = int(self.routers[0].num_experts)
        self.top_k = int(self.routers[0].top_k)
        self.num_layers = len(self.routers)
        self._layer = {id(m): i for i, m in enumerate(self.routers)}
        self._events: list[tuple[int, torch.Tensor]] = []  # (layer, logits [T, E]); layer -1: mask [T]
        self._on = False
        base = getattr(model, model.base_model_prefix)
        # the token mask is read where the decoder starts: a vision-language model's text model (which
        # both its text-only and its image forwards enter with embeddings), else the base model
        decoder = getattr(base, "language_model", base)
        self._handles = [decoder.register_forward_pre_hook(self._pre, with_kwargs=True)]
        self._handles += [r.register_forward_hook(self._hook) for r in self.routers]

    def _pre(self, _module, args, kwargs):
        if self._on:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs["inputs_embeds"][..., 0]  # [B, T]
            mask = kwargs.get("attention_mask")
            width = ids.shape[1]
            m = torch.ones(ids.shape, dtype=torch.long, device=ids.device) if mask is None else mask[:, -width:]
            self._events.append((-1, m.reshape(-1)))

    def _hook(self, module, _args, out):
        if self._on:
            self._events.append((self._layer[id(module)], out[0]))

    @contextmanager
    def capture(self):
        self._events.clear()
        self._on = True
        try:
            yield self
        finally:
            self._on = False

    def pop(self) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """`(loss, stats, counts)` of the captured forwards; events are cleared.

        loss: Megatron's switch load-balancing loss summed over layers, `E / (k T^2) * sum_e P_e f_e`
        per layer (P_e: summed router probabilities, f_e: tokens routed to e; real tokens only; 1.0 at
        perfect balance). stats: `actor/moe/load_balancing_loss` (mean over layers) and
        `actor/moe/router_entropy` (mean per-token entropy of the router softmax, nats). counts
        `[L, E]`: top-k assignments per layer and expert (summed over DP ranks by the caller).
        """
        E, k = self.num_experts, self.top_k
        probs_sum = [None] * self.num_layers
        counts: list[torch.Tensor | None] = [None] * self.num_layers  # [E] float64 each, on the router's device
        tokens: list[torch.Tensor | None] = [None] * self.num_layers  # [] float64 each
        ent_sum: torch.Tensor | None = None  # [] float64
        mask = None
        # everything stays on the device until the one copy to the host below (no sync per layer)
        for layer, t in self._events:
            if layer < 0:
                mask = t.float()
                continue
            p = torch.softmax(t.float(), dim=-1)  # [T, E]
            m = mask.to(p.device)
            ps = (p * m[:, None]).sum(0)  # [E]
            probs_sum[layer] = ps if probs_sum[layer] is None else probs_sum[layer] + ps
            top = torch.topk(p.detach(), k, dim=-1).indices  # [T, k]
            c = torch.zeros(E, dtype=torch.float64, device=p.device).scatter_add_(
                0, top.reshape(-1), m.double().repeat_interleave(k))
            counts[layer] = c if counts[layer] is None else counts[layer] + c
            ent = -(p.detach() * torch.log(p.detach().clamp_min(1e-30))).sum(-1)
            e = (ent.double() * m.double()).sum()
            ent_sum = e if ent_sum is None else ent_sum + e
            n = m.sum().double()  # the fp32 count of real tokens (exact below 2^24)
            tokens[layer] = n if tokens[layer] is None else tokens[layer] + n
        self._events.clear()
        if any(ps is None for ps in probs_sum):
            raise RuntimeError("RouterRecorder.pop: a router saw no tokens in the captured forwards")
        n_tok = torch.stack(tokens)  # [L] float64
        coef = E / (k * n_tok.clamp_min(1.0) ** 2)  # [L] float64, rounded once to the probabilities' dtype
        cnt = torch.stack(counts)  # [L, E] float64
        per_layer = [coef[i].to(probs_sum[i].dtype) * (probs_sum[i] * cnt[i].to(probs_sum[i])).sum()
                     for i in range(self.num_layers)]
        loss = torch.stack(per_layer).sum()
        host = torch.cat([cnt.flatten(), torch.stack([loss.detach().double(), ent_sum, n_tok.sum()])]).cpu()
        counts = host[:-3].view(self.num_layers, E)
        loss_v, ent_v, tok_v = host[-3:].tolist()
        stats = {"actor/moe/load_balancing_loss": loss_v / self.num_layers,
                 "actor/moe/router_entropy": ent_v / max(tok_v, 1.0)}
        return loss, stats, counts

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def expert_load_metrics(counts: torch.Tensor, top_k: int) -> dict[str, float]:
    """From `[L, E]` top-k assignment counts: normalized load `E * count_e / (k * tokens)` per layer
    and expert (1.0 = balanced): its max, min and coefficient of variation over all layers and experts."""
    E = counts.shape[1]
    tokens = counts.sum(1, keepdim=True) / top_k  # [L, 1]
    load = E * counts / (top_k * tokens.clamp_min(1.0))  # [L, E]
    return {"actor/moe/expert_load/max": float(load.max()), "actor/moe/expert_load/min": float(load.min()),
            "actor/moe/expert_load/cv": float((load.std(1, unbiased=False) / load.mean(1).clamp_min(1e-12)).mean())}
