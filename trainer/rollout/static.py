"""The built-in `static` rollout engine: fixed-shape KV cache, decode step replayed as a CUDA graph.

Why: HF `generate` spends most of a decode step launching kernels and growing its cache
(1-2% of the bandwidth roofline on an H200 at batch 16-256). A decode step's floor is reading
the weights once plus each row's KV cache; everything else is overhead. This engine

- runs its own forward for Llama-family decoders (Qwen2, Qwen3, Llama, SmolLM2: RMSNorm, rotary,
  grouped-query attention, SwiGLU) over the transformers module's own parameter tensors; in a
  mixture of experts (Qwen3-MoE, Mixtral) a sparse layer's MLP is, in prefill, transformers' own MoE
  block (router + experts, called as a module; its `grouped_mm` experts kernel keeps the step capturable:
  no host sync) and, in the decode step on CUDA, the fused Triton block of trainer/ops/moe_decode.py
  (`moe_decode` below); both eager even under `compile_decode`;
- keeps the KV cache in one preallocated tensor `[L, 2, B, H_kv, S, D]` per (batch bucket B,
  length S) so every decode step has the same shapes and addresses;
- on CUDA captures one decode step (embed -> layers -> LM head -> sampling -> log-prob -> stop
  check -> counters advance) as a CUDA graph and replays it; the host only checks every
  `check_every` steps whether all rows are done. Graphs are captured once per bucket, not per
  batch (batch sizes round up to the next bucket; the filler rows are dropped);
- fuses Q/K/V and gate/up projections into one matrix each. The fused matrices own the storage
  and the module's `q_proj.weight` etc. become views into them, so `update_weights` (an in-place
  copy into the module parameters) updates the fused weights for free.

`moe_decode` (engine_kwargs): how a sparse layer's MLP runs in the decode step. `fused` is this project's
Triton block (trainer/ops/moe_decode.py: route, group the (row, expert) pairs, one grouped GEMM for gate/up
with SiLU * up fused, one for down with the routing weight fused, each expert's weights read once per step);
`module` is transformers' block, called as a module. Default: `fused` on CUDA where every MoE layer is a
family that file supports (Qwen3-MoE, Mixtral) and triton imports, else `module`; asking for `fused` where
it cannot run is an error that says why. Prefill always runs transformers' block (thousands of rows suit its
grouped GEMM), so does every CPU run.

`compile_decode` (engine_kwargs, default off) runs the decode step's dense math through
`torch.compile(dynamic=False, fullgraph=True)` so inductor fuses the elementwise work (RMSNorm casts,
rotary, residual adds, SiLU * up, the fp32 log_softmax) into a few kernels per layer; the CUDA graph still
wraps the whole step. Four pure functions of tensors are compiled: `rope_tables`, `pre_attn` (RMSNorm,
fused QKV, Qwen3 q/k norm, rotary), `post_attn` (o_proj + residual, RMSNorm, SwiGLU + residual) and
`lm_logprobs` (final norm, LM head, log_softmax); the same functions run eagerly in prefill and when the
option is off. Weights are arguments, so every layer shares one graph. The KV-cache writes, attention and
the generator-based sampling stay eager (an in-place write into the cache inside a compiled graph can
become a copy of the whole cache). Cost: shapes are static, so each batch bucket (and temperature)
compiles its own graphs during the warm-up before capture, counted in `compile_s` (6-8 s per bucket for
the 0.5B shape on an H200; compiled in-process, as `actor.compile` is: trainer/backends/compile.py). Measured
there: 1.30-1.49x decode tok/s at batch 256-16 (reports/sm90/README.md, run 5). Greedy tokens can differ
from the eager step's on GPU (fused bf16 kernels round differently); on CPU in fp32 they match. A
compiler failure falls back to the eager step, with the reason in `compile_error`; `compile_backend`
(default `inductor`) picks the dynamo backend.

Sampling is the exponential race (equivalent to sampling from the categorical distribution):
`argmax_v p_v / E_v`, `E_v ~ Exp(1)`, which needs no host sync (unlike `torch.multinomial`).
Log-probs use the trainer's definition, `log_softmax(logits / T)` in fp32 (greedy: `T = 1`), of
the unfiltered distribution; top-k / top-p only restrict what can be sampled, as in the `hf` engine.

Partial rollout (fully-async mode) uses `generate(..., should_stop=fn)` and `continue_generation`
from `InterruptibleEngine` (trainer/rollout/base.py); this engine supplies `decode_rows`. Each row
carries its own token budget (`limit`, checked inside the captured step, so a continued row stops
at `max_new_tokens` overall); `fn()` is checked on the host before every step, and the steps
already queued on the device complete before the partial tokens are read back. Continuations
(prompt + partial tokens, reduced budgets) round their response length up to `prompt_bucket` so
few distinct shapes are captured; at most `max_slots` (engine_kwargs, default 4) buffer sets stay
allocated, least recently used dropped first. `sleep` frees them (`free_on_sleep: false` keeps
them when the device has room, so colocated runs do not re-capture every step).

Departures: no continuous refill of finished rows (all rows of a batch decode in lock step; a
finished row keeps decoding until the early-exit check sees every row done); sliding-window
attention and non-default RoPE scaling beyond the module's `inv_freq` / `attention_scaling` are
not modelled. On CPU the same code runs eagerly (no graph), which the unit tests compare with the
`hf` engine token for token.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from trainer.backends.compile import compile_in_process, raise_recompile_limit
from trainer.errors import ModelError
from trainer.rollout.base import InterruptibleEngine, SamplingParams, copy_weights_in_place, engine_model

_MAX_STOP = 8  # stop-token slots in the captured step (more stop ids fall back to host-side checks)


@dataclass
class _Layer:
    ln1: torch.Tensor  # [H]
    ln2: torch.Tensor  # [H]
    w_qkv: torch.Tensor  # [(nq + 2 nkv) D, H]
    b_qkv: torch.Tensor | None  # [(nq + 2 nkv) D]
    w_o: torch.Tensor  # [H, nq D]
    w_gu: torch.Tensor | None  # [2 I, H] (None in an MoE layer)
    w_down: torch.Tensor | None  # [H, I]
    moe: torch.nn.Module | None  # the MoE layer's sparse block, [B, T, H] -> [B, T, H] (None in a dense one)
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D] (Qwen3)
    moe_fused: Any = None  # its trainer.ops.moe_decode.MoeSpec when decode runs the fused block (moe_decode=fused)


@dataclass
class _Slot:
    """Static buffers of one (batch, length) bucket; the captured graph reads and writes these."""

    cache: torch.Tensor  # [L, 2, B, nkv, S, D]
    tokens: torch.Tensor  # [B] long, input token of the next step
    pos: torch.Tensor  # [B] long, its position id
    col: torch.Tensor  # [1] long, cache column it is written to
    t: torch.Tensor  # [1] long, index of the token the step samples
    pad_left: torch.Tensor  # [B] long, first real cache column of each row
    done: torch.Tensor  # [B] bool
    limit: torch.Tensor  # [B] long, tokens each row may sample (the row is done when it has them)
    stop: torch.Tensor  # [_MAX_STOP] long, padded with -1
    out_tokens: torch.Tensor  # [B, R] long
    out_logps: torch.Tensor  # [B, R] float32
    graphs: dict  # sampling key -> torch.cuda.CUDAGraph
    compiled: set = field(default_factory=set)  # sampling keys whose compiled kernels exist (compile_decode)


def _filter(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`scaled` [B, V] with tokens outside the top-k / top-p set at -inf (the token crossing top_p is kept)."""
    out = scaled
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = probs.cumsum(-1) - probs > params.top_p
        out = out.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return out


def _fuse(module: torch.nn.Module, names: list[str], attr: str) -> torch.Tensor | None:
    """Concatenate `attr` of the sub-modules `names` into one tensor and make theirs views of it."""
    parts = [getattr(getattr(module, n), attr) for n in names]
    if any(p is None for p in parts):
        return None
    fused = torch.cat([p.data for p in parts], dim=0).contiguous()
    start = 0
    for n, p in zip(names, parts):
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused


# ---------------------------------------------------------------------- the math, as pure functions of tensors
# Prefill and the eager decode step call these directly; `compile_decode` wraps the same functions in
# torch.compile. Weights are arguments (not attributes) so all layers share one compiled graph.

def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the HF modules compute it: fp32 statistics, cast back, then scale."""
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rope_tables(pos: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin `[..., D]` for position ids `[...]` (fp32 angles, cast to `dtype`).

    The signed sin is (-sin, sin) over the two halves, so rotate_half(x) * sin == swap_halves(x) * signed_sin.
    """
    freqs = pos.float()[..., None] * inv_freq  # [..., D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    sin = emb.sin() * scale
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return (emb.cos() * scale).to(dtype), signed.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`, with the half swap as one flip of a [2, D/2] view."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * signed_sin


def pre_attn(x: torch.Tensor, ln1: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
             q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
             n_q: int, n_kv: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, fused QKV projection, Qwen3 q/k norm, rotary: q `[B, nq, T, D]`, k and v `[B, nkv, T, D]`.

    x `[B, T, H]`; cos and sin `[B, T, D]`.
    """
    b, t, _ = x.shape
    d = cos.shape[-1]
    qkv = F.linear(rms_norm(x, ln1, eps), w_qkv, b_qkv)  # [B, T, (nq + 2 nkv) D]
    qk, v = qkv.split([(n_q + n_kv) * d, n_kv * d], dim=-1)
    qk = qk.view(b, t, n_q + n_kv, d)
    v = v.view(b, t, n_kv, d).transpose(1, 2)
    if q_norm is not None and k_norm is not None:  # Qwen3: per-head RMSNorm of q and k before the rotation
        q, k = qk.split([n_q, n_kv], dim=2)
        qk = torch.cat([rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)], dim=2)
    qk = rotate(qk, cos[:, :, None], sin[:, :, None])  # q and k heads rotated together
    q, k = qk.transpose(1, 2).split([n_q, n_kv], dim=1)
    return q, k, v


def post_attn(x: torch.Tensor, o: torch.Tensor, w_o: torch.Tensor, ln2: torch.Tensor, w_gu: torch.Tensor,
              w_down: torch.Tensor, eps: float) -> torch.Tensor:
    """Output projection + residual, then RMSNorm + SwiGLU MLP + residual: x `[B, T, H]`, o `[B, T, nq D]`."""
    x = x + F.linear(o, w_o)
    g, u = F.linear(rms_norm(x, ln2, eps), w_gu).chunk(2, dim=-1)  # [B, T, I] each
    return x + F.linear(F.silu(g) * u, w_down)


def post_attn_moe(x: torch.Tensor, o: torch.Tensor, w_o: torch.Tensor, ln2: torch.Tensor, moe: torch.nn.Module,
                  eps: float) -> torch.Tensor:
    """`post_attn` with transformers' sparse MoE block (router + experts) as the MLP."""
    x = x + F.linear(o, w_o)
    return x + moe(rms_norm(x, ln2, eps))


def lm_logprobs(x: torch.Tensor, norm_w: torch.Tensor, lm_head: torch.Tensor, eps: float, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Final norm + LM head on x `[B, H]`: fp32 logits / T and their log_softmax, both `[B, V]`."""
    scaled = F.linear(rms_norm(x, norm_w, eps), lm_head).float() / temperature
    return scaled, torch.log_softmax(scaled, dim=-1)


def _mlp_kind(mlp: torch.nn.Module) -> str | None:
    """`dense` (SwiGLU projections), `moe` (transformers' sparse block: a router `gate` and `experts`), or None."""
    if hasattr(mlp, "gate_proj"):
        return "dense"
    return "moe" if hasattr(mlp, "experts") and hasattr(mlp, "gate") else None


class _Fns(NamedTuple):
    """The decode step's dense math: the functions above, or torch.compile wrappers of them."""

    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    pre_attn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    post_attn: Callable[..., torch.Tensor]
    head: Callable[..., tuple[torch.Tensor, torch.Tensor]]


_EAGER = _Fns(rope_tables, pre_attn, post_attn, lm_logprobs)


class StaticRolloutEngine(InterruptibleEngine):
    name = "static"

    def __init__(self, model: torch.nn.Module, *, cfg: Any = None, pad_token_id: int, eos_token_ids: list[int],
                 seed: int = 0, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 max_prompt_length: int = 256, max_response_length: int = 256, share_weights: bool = False,
                 **kwargs: Any):
        opts = dict(getattr(cfg, "engine_kwargs", None) or {})
        opts.update(kwargs)
        self.model = engine_model(model, dtype=dtype, device=device, share_weights=share_weights)
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.version = 0
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length
        on_cuda = self.device.type == "cuda"
        self.use_graphs: bool = bool(opts.get("cuda_graphs", on_cuda)) and on_cuda
        self.buckets: list[int] = sorted(opts.get("batch_buckets", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]))
        self.prompt_bucket: int = int(opts.get("prompt_bucket", 64 if on_cuda else 1))
        self.check_every: int = int(opts.get("check_every", 32 if on_cuda else 1))
        self.max_slots: int = max(int(opts.get("max_slots", 4)), 1)  # (batch, length) buffers + graphs kept
        self.free_on_sleep: bool = bool(opts.get("free_on_sleep", True))
        self.compile_decode: bool = bool(opts.get("compile_decode", False))  # torch.compile the dense math
        self.compile_backend: str | Callable = opts.get("compile_backend", "inductor")
        self.compile_s = 0.0  # seconds spent compiling and capturing graphs (reported apart from decode time)
        self.graph_error: str | None = None  # why graph capture failed, when it did
        self.compile_error: str | None = None  # why compile_decode fell back to eager, when it did
        self._fns: _Fns = _EAGER  # the decode step's dense math
        self._compiled: _Fns | None = None  # torch.compile wrappers, made on first use
        self._build()
        self.moe_decode: str | None = self._pick_moe_decode(opts.get("moe_decode"))  # None: no MoE layer
        self._params = dict(self.model.named_parameters())
        self._slots: OrderedDict[tuple[int, int, int], _Slot] = OrderedDict()  # least recently used first

    # ------------------------------------------------------------------ model plumbing
    def _build(self) -> None:
        cfg = self.model.config
        base = getattr(self.model, self.model.base_model_prefix, None)
        layers = getattr(base, "layers", None)
        if layers is None or not all(hasattr(x, "self_attn") and _mlp_kind(x.mlp) for x in layers):
            raise ModelError(f"rollout.engine=static supports Llama-family decoders (Qwen2/Qwen3/Llama, Qwen3-MoE/Mixtral); "
                             f"{type(self.model).__name__} is not one (fix: use rollout.engine=hf)")
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
            raise ModelError("rollout.engine=static does not model sliding-window attention (fix: use rollout.engine=hf)")
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ModelError(f"rollout.engine=static supports hidden_act=silu, got {act} (fix: use rollout.engine=hf)")
        self.embed = base.embed_tokens.weight  # [V, H]
        self.final_norm = base.norm.weight
        self.lm_head = self.model.get_output_embeddings().weight  # [V, H] (tied: same storage as embed)
        rot = base.rotary_emb
        self.inv_freq = rot.inv_freq.float()  # [D/2]
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.eps = float(cfg.rms_norm_eps)
        self.n_layers = len(layers)
        attn0 = layers[0].self_attn
        self.head_dim = int(getattr(attn0, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.n_q = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.scale = float(getattr(attn0, "scaling", self.head_dim ** -0.5))
        self.layers: list[_Layer] = []
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            dense = _mlp_kind(m) == "dense"
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                w_qkv=_fuse(a, ["q_proj", "k_proj", "v_proj"], "weight"),
                b_qkv=_fuse(a, ["q_proj", "k_proj", "v_proj"], "bias"),
                w_o=a.o_proj.weight, w_gu=_fuse(m, ["gate_proj", "up_proj"], "weight") if dense else None,
                w_down=m.down_proj.weight if dense else None, moe=None if dense else m,
                q_norm=a.q_norm.weight if hasattr(a, "q_norm") else None,
                k_norm=a.k_norm.weight if hasattr(a, "k_norm") else None))

    def _pick_moe_decode(self, asked: str | None) -> str | None:
        """`fused` or `module` for the MoE layers' decode (see the module docstring); sets `_Layer.moe_fused`."""
        moe = [lw.moe for lw in self.layers if lw.moe is not None]
        if asked not in (None, "fused", "module"):
            raise ModelError(f"rollout.engine_kwargs.moe_decode={asked!r}: not one of fused, module "
                             "(fix: drop it for the default, or pick one)")
        if not moe or asked == "module":
            return "module" if moe else None
        if self.device.type != "cuda":
            why = f"the engine runs on {self.device.type}"
        else:
            from trainer.ops import moe_decode as fused  # triton and CUDA only: never imported on a CPU run

            why = next((r for r in map(fused.unsupported_reason, moe) if r is not None), None)
        if why is not None:
            if asked == "fused":
                raise ModelError(f"rollout.engine_kwargs.moe_decode=fused: {why} (fix: moe_decode=module, or drop it)")
            return "module"
        for lw in self.layers:
            if lw.moe is not None:
                lw.moe_fused = fused.spec_of(lw.moe)
        return "fused"

    def _prefill(self, slot: _Slot, ids: torch.Tensor, attn: torch.Tensor, temperature: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill cache columns [0, P) from left-padded prompts `ids` [B, P]; last-position scaled logits, log-probs."""
        b, p = ids.shape
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        cos, sin = rope_tables(pos, self.inv_freq, self.rope_scale, self.dtype)  # [B, P, D]
        causal = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()
        mask = (causal[None] & attn.bool()[:, None, :]) | torch.eye(p, dtype=torch.bool, device=ids.device)[None]
        mask = mask[:, None]  # [B, 1, P, P]; the diagonal keeps all-pad query rows finite
        group = self.n_q // self.n_kv
        x = F.embedding(ids, self.embed)  # [B, P, H]
        for i, lw in enumerate(self.layers):
            q, k, v = pre_attn(x, lw.ln1, lw.w_qkv, lw.b_qkv, lw.q_norm, lw.k_norm, cos, sin,
                               self.n_q, self.n_kv, self.eps)
            slot.cache[i, 0, :, :, :p] = k
            slot.cache[i, 1, :, :, :p] = v
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                               attn_mask=mask, scale=self.scale)  # [B, nq, P, D]
            x = self._post_attn(post_attn, x, o.transpose(1, 2).reshape(b, p, -1), lw)
        return lm_logprobs(x[:, -1], self.final_norm, self.lm_head, self.eps, temperature)  # [B, V] each

    def _post_attn(self, dense: Callable[..., torch.Tensor], x: torch.Tensor, o: torch.Tensor, lw: _Layer,
                   decode: bool = False) -> torch.Tensor:
        """Output projection and MLP of one layer: `dense` (post_attn, eager or compiled), or the MoE block's
        (in a decode step the fused one, when `moe_decode` is `fused`)."""
        if lw.moe is not None:
            if decode and lw.moe_fused is not None:
                from trainer.ops.moe_decode import moe_decode

                x = x + F.linear(o, lw.w_o)
                return x + moe_decode(rms_norm(x, lw.ln2, self.eps), lw.moe_fused)
            return post_attn_moe(x, o, lw.w_o, lw.ln2, lw.moe, self.eps)
        return dense(x, o, lw.w_o, lw.ln2, lw.w_gu, lw.w_down, self.eps)

    def _sample(self, scaled: torch.Tensor, logp: torch.Tensor, params: SamplingParams
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [B] and their log-probs [B] from logits / T and their log_softmax, [B, V] each (no host sync)."""
        if params.greedy:
            tok = logp.argmax(-1)
        else:
            if params.top_k > 0 or params.top_p < 1.0:
                probs = torch.softmax(_filter(scaled, params), dim=-1)
            else:
                probs = logp.exp()
            race = torch.empty_like(probs).exponential_(generator=self._gen)
            tok = (probs / race).argmax(-1)  # exponential race == one categorical draw per row
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def _decode_step(self, slot: _Slot, params: SamplingParams) -> None:
        """One token for every row: reads slot.tokens/pos/col/t, writes the outputs, advances counters.

        The dense math goes through `self._fns` (eager or compiled); the cache writes, attention and
        sampling stay eager.
        """
        fns = self._fns
        b = slot.tokens.shape[0]
        s = slot.cache.shape[4]
        cols = torch.arange(s, device=slot.tokens.device)
        mask = ((cols[None] >= slot.pad_left[:, None]) & (cols[None] <= slot.col))[:, None, None]  # [B, 1, 1, S]
        cos, sin = fns.rope(slot.pos[:, None], self.inv_freq, self.rope_scale, self.dtype)  # [B, 1, D]
        group = self.n_q // self.n_kv
        x = F.embedding(slot.tokens[:, None], self.embed)  # [B, 1, H]
        for i, lw in enumerate(self.layers):
            q, k, v = fns.pre_attn(x, lw.ln1, lw.w_qkv, lw.b_qkv, lw.q_norm, lw.k_norm, cos, sin,
                                   self.n_q, self.n_kv, self.eps)  # [B, nq, 1, D], [B, nkv, 1, D]
            kc, vc = slot.cache[i, 0], slot.cache[i, 1]  # [B, nkv, S, D]
            kc.index_copy_(2, slot.col, k)
            vc.index_copy_(2, slot.col, v)
            qg = q.reshape(b, self.n_kv, group, self.head_dim)  # the group's query heads share one KV head
            o = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask, scale=self.scale)  # [B, nkv, g, D]
            x = self._post_attn(fns.post_attn, x, o.reshape(b, 1, -1), lw, decode=True)
        temperature = 1.0 if params.greedy else float(params.temperature)
        tok, logp = self._sample(*fns.head(x[:, 0], self.final_norm, self.lm_head, self.eps, temperature), params)
        slot.out_tokens.index_copy_(1, slot.t, tok[:, None])
        slot.out_logps.index_copy_(1, slot.t, logp[:, None])
        slot.done.logical_or_((tok[:, None] == slot.stop[None]).any(-1) | (slot.t + 1 >= slot.limit))
        slot.tokens.copy_(tok)
        slot.pos.add_(1)
        slot.col.add_(1)
        slot.t.add_(1)

    # ------------------------------------------------------------------ buffers and graphs
    def _bucket(self, b: int) -> int:
        for size in self.buckets:
            if size >= b:
                return size
        return b

    def _slot(self, b: int, s: int, r: int) -> _Slot:
        key = (b, s, r)
        if key in self._slots:
            self._slots.move_to_end(key)
        else:
            while len(self._slots) >= self.max_slots:  # drop the least recently used buffers and graphs
                self._slots.popitem(last=False)
            dev = self.device
            z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=dev)
            self._slots[key] = _Slot(
                cache=torch.zeros(self.n_layers, 2, b, self.n_kv, s, self.head_dim, dtype=self.dtype, device=dev),
                tokens=z(b), pos=z(b), col=z(1), t=z(1), pad_left=z(b), done=z(b, dt=torch.bool), limit=z(b),
                stop=torch.full((_MAX_STOP,), -1, dtype=torch.long, device=dev), out_tokens=z(b, r),
                out_logps=z(b, r, dt=torch.float32), graphs={})
        return self._slots[key]

    @staticmethod
    def _state(slot: _Slot) -> tuple[torch.Tensor, ...]:
        """The buffers a decode step writes (saved around warm-up steps, which must leave no trace)."""
        return slot.cache, slot.tokens, slot.pos, slot.col, slot.t, slot.done, slot.out_tokens, slot.out_logps

    def _compile_for(self, slot: _Slot, params: SamplingParams, key: tuple) -> None:
        """Compile the dense math for this bucket and sampling key by running one step; eager if that fails.

        dynamo specializes on shapes (`dynamic=False`), so each batch bucket (and temperature) compiles
        its own graphs; the weights are graph inputs, so the layers share them.
        """
        t0 = time.perf_counter()
        if self._compiled is None:
            opts = dict(backend=self.compile_backend, dynamic=False, fullgraph=True)
            compile_in_process()
            raise_recompile_limit()  # one graph set per bucket and temperature: more than dynamo's default 8
            self._compiled = _Fns(*(torch.compile(f, **opts) for f in _EAGER))
        saved = [x.clone() for x in self._state(slot)]
        rng = self._gen.get_state()  # the warm-up's draws are given back: same seed, same samples as eager
        self._fns = self._compiled
        try:
            self._decode_step(slot, params)
        except Exception as e:  # noqa: BLE001 -- any compiler failure: decode eagerly, say why
            inner = getattr(e, "inner_exception", None) or e.__cause__  # dynamo wraps the backend's own error
            first = lambda x: (str(x).strip().splitlines() or [""])[0]
            self.compile_error = f"{type(e).__name__}: {first(e)}"
            if inner is not None:
                self.compile_error += f" ({type(inner).__name__}: {first(inner)})"
            self.compile_decode = False
            self._fns = _EAGER
        for dst, src in zip(self._state(slot), saved):
            dst.copy_(src)
        self._gen.set_state(rng)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        slot.compiled.add(key)
        self.compile_s += time.perf_counter() - t0

    def _replay_fn(self, slot: _Slot, params: SamplingParams):
        """A callable running one decode step: a captured graph on CUDA, the eager step elsewhere."""
        key = (params.greedy, params.temperature, params.top_k, params.top_p)
        if self.compile_decode and key not in slot.compiled:  # before capture: kernels compiled, autotuned
            self._compile_for(slot, params, key)
        if not self.use_graphs:
            return lambda: self._decode_step(slot, params)
        if key not in slot.graphs:
            t0 = time.perf_counter()
            saved = [x.clone() for x in self._state(slot)]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside capture (allocator, library handles)
                    self._decode_step(slot, params)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                if hasattr(graph, "register_generator_state"):
                    graph.register_generator_state(self._gen)
                # thread_local: CUDA calls of other threads (the NCCL watchdog, Ray) stay legal during capture
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self._decode_step(slot, params)
            except RuntimeError as e:  # capture unsupported here: decode eagerly, say why
                self.graph_error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                self.use_graphs = False
                for dst, src in zip(self._state(slot), saved):
                    dst.copy_(src)
                return lambda: self._decode_step(slot, params)
            for dst, src in zip(self._state(slot), saved):
                dst.copy_(src)
            torch.cuda.synchronize()
            slot.graphs[key] = graph
            self.compile_s += time.perf_counter() - t0
        return slot.graphs[key].replay

    @property
    def _gen(self) -> torch.Generator | None:
        return self.generator

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights_in_place(self._params, named_tensors)
        self.version += 1

    def sleep(self) -> None:
        """Free the KV caches and graphs (re-made on the next call), unless `free_on_sleep` is off."""
        if not self.free_on_sleep:
            return
        self._slots.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                    should_stop: Callable[[], bool] | None) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Decode `rows` in chunks of at most the largest batch bucket; an interrupt aborts the rest."""
        out_tokens: list[list[int]] = []
        out_logps: list[list[float]] = []
        finish: list[str] = []
        limit = self.buckets[-1]
        stopped = False
        for start in range(0, len(rows), limit):
            chunk = rows[start:start + limit]
            if stopped:
                toks, lps, fin = [[] for _ in chunk], [[] for _ in chunk], ["abort"] * len(chunk)
            else:
                toks, lps, fin, stopped = self._decode_chunk(chunk, budgets[start:start + limit], params, should_stop)
            out_tokens += toks
            out_logps += lps
            finish += fin
        return out_tokens, out_logps, finish

    def _decode_chunk(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                      should_stop: Callable[[], bool] | None
                      ) -> tuple[list[list[int]], list[list[float]], list[str], bool]:
        """One bucketed batch: prefill, first token, decode steps until done, out of budget or interrupted.

        Returns tokens, log-probs and finish reasons per real row, and whether `should_stop` fired.
        """
        real = len(rows)
        if should_stop is not None and should_stop():
            return [[] for _ in rows], [[] for _ in rows], ["abort"] * real, True
        b = self._bucket(real)
        rows = rows + [rows[0]] * (b - real)  # filler rows (dropped below)
        budgets = list(budgets) + [1] * (b - real)
        max_budget = max(budgets[:real])
        p = max(len(r) for r in rows)
        p = -(-p // self.prompt_bucket) * self.prompt_bucket
        # continuations have varied budgets: round up so few distinct (and so few captured) shapes arise
        r = min(-(-max_budget // self.prompt_bucket) * self.prompt_bucket, max(params.max_new_tokens, max_budget))
        slot = self._slot(b, p + r, r)
        dev = self.device
        ids = torch.full((b, p), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((b, p), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, p - len(row):] = torch.tensor(row, dtype=torch.long)
            attn[i, p - len(row):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        stop_ids = sorted(set(self.eos_token_ids) | set(params.stop_token_ids))
        host_stop = len(stop_ids) > _MAX_STOP
        slot.stop.fill_(-1)
        slot.stop[:min(len(stop_ids), _MAX_STOP)] = torch.tensor(stop_ids[:_MAX_STOP], dtype=torch.long, device=dev)
        slot.limit.copy_(torch.tensor(budgets, dtype=torch.long))
        slot.out_tokens.zero_()
        slot.out_logps.zero_()

        temperature = 1.0 if params.greedy else float(params.temperature)
        tok, logp = self._sample(*self._prefill(slot, ids, attn, temperature), params)
        slot.out_tokens[:, 0] = tok
        slot.out_logps[:, 0] = logp
        slot.done.copy_((tok[:, None] == slot.stop[None]).any(-1) | (slot.limit <= 1))
        slot.done[real:] = True
        slot.tokens.copy_(tok)
        slot.pos.copy_(attn.sum(-1))
        slot.pad_left.copy_(p - attn.sum(-1))
        slot.col.fill_(p)
        slot.t.fill_(1)
        step = self._replay_fn(slot, params)
        sampled, stopped = 1, False  # tokens sampled per row so far (the host counts the replays)
        while sampled < max_budget:
            if should_stop is not None and should_stop():
                stopped = True
                break
            step()
            sampled += 1
            if not host_stop and sampled % self.check_every == 0 and bool(slot.done.all()):
                break
        toks_all = slot.out_tokens[:real, :sampled].tolist()
        lps_all = slot.out_logps[:real, :sampled].tolist()
        stop_set = set(stop_ids)
        toks_out, lps_out, fin = [], [], []
        for toks, lps, budget in zip(toks_all, lps_all, budgets):
            toks, lps = toks[:budget], lps[:budget]
            end = next((j + 1 for j, x in enumerate(toks) if x in stop_set), None)
            if end is not None:
                fin.append("stop")
                toks, lps = toks[:end], lps[:end]
            else:
                fin.append("length" if len(toks) >= budget else "abort")
            toks_out.append(toks)
            lps_out.append(lps)
        return toks_out, lps_out, fin, stopped
