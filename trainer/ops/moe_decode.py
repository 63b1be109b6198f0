"""A fused top-k mixture-of-experts block for the static engine's decode step (Triton, CUDA).

The math (one MoE layer's MLP on the `M` rows of a decode step, `x` `[M, H]` bf16):

    p      = softmax(x W_r^T)                     # [M, E], fp32 softmax of bf16 logits
    w, idx = top_k(p, k)                          # [M, k]; w /= sum(w) when the block normalizes
    h_mj   = silu(x_m G_e^T) * (x_m U_e^T)        # e = idx[m, j]; G_e, U_e = gate_up_proj[e] halves, [I, H]
    y_m    = sum_j w_mj * h_mj D_e^T              # D_e = down_proj[e], [H, I]

exactly what transformers' `Qwen3MoeSparseMoeBlock` (`norm_topk_prob` as the router's, top-k weights cast to the
logits' dtype) and `MixtralSparseMoeBlock` (always normalized, fp32 weights) compute in eval mode.

What it fuses: the router stays two library calls (the `[M, H] x [H, E]` product and softmax / top-k); the
(row, expert) pairs are grouped by expert with one stable sort and a count (no host sync). Then two Triton
kernels, each over a grid of (expert, output block):

- `_gate_up_kernel`: for expert e, the rows routed to it (gathered from `x` by index, no permuted copy), both
  halves of `gate_up_proj[e]` read once, fp32 accumulation, `silu(g) * u` in fp32, one bf16 store `[S, I]`
  (S = M k pairs, in expert order);
- `_down_kernel`: `down_proj[e]` read once against those rows, times the routing weight, stored in fp32 at
  the pair's own (row, j) place `[M, k, H]`; one sum over j (fp32) then gives `y` in bf16.

So each expert's weights are read once per step whatever its row count (the rows of one expert loop inside
its program, in blocks of `BLOCK_M`; an expert no row chose costs one load of its count), and the only other
bytes are `x`, `h` and the fp32 `[M, k, H]` partials (4 MB at 64 rows x top-8 x 2048, against 1.2 GB of
experts per Qwen3-30B-A3B layer). Everything is device-side with static shapes, so a CUDA graph can capture it.

Rounding: transformers rounds `g`, `u`, `silu(g) * u`, the down output and its weighted copy to bf16; here
only `h` (bf16, the down kernel's operand) and the result are rounded, so the two differ by a few bf16 ulps
of `y` (tests/unit/test_moe_decode.py bounds it).

Limits: CUDA only (TRITON_INTERPRET=1 runs it on CPU tensors, for the unit test); bf16 or fp16 activations
and weights; experts laid out as transformers 5 stores them (`gate_up_proj` `[E, 2I, H]`, `down_proj`
`[E, H, I]`, no biases, SiLU); no shared experts, no expert parallelism, no router jitter. Made for decode
(a few rows per expert); a prefill of thousands of rows is better served by a grouped GEMM (the engine
keeps transformers' block there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install without triton: `supported` says no, the engine keeps transformers' block
    triton = None

# Block classes whose routing this file reproduces: class name -> whether the top-k weights are renormalized
# (None: the router's `norm_topk_prob`), and whether they are cast to the logits' dtype first.
_FAMILIES: dict[str, tuple[bool | None, bool]] = {
    "Qwen3MoeSparseMoeBlock": (None, True),
    "MixtralSparseMoeBlock": (True, False),
}


@dataclass(frozen=True)
class MoeSpec:
    """What the fused block reads from one of transformers' sparse MoE blocks (tensors are the module's own)."""

    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    top_k: int
    normalize: bool
    round_weights: bool  # top-k weights cast to the logits' dtype (Qwen3-MoE) before use


def unsupported_reason(block: torch.nn.Module) -> str | None:
    """Why `block` cannot run fused (None when it can)."""
    if triton is None:
        return "triton is not installed"
    name = type(block).__name__
    if name not in _FAMILIES:
        return f"{name} is not one of {', '.join(_FAMILIES)}"
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    gu, dn = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    r = getattr(gate, "weight", None)
    if not all(isinstance(t, torch.Tensor) and t.dim() == d for t, d in ((r, 2), (gu, 3), (dn, 3))):
        return "expected router weight [E, H], experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]"
    e, two_i, h = gu.shape
    if r.shape != (e, h) or dn.shape != (e, h, two_i // 2) or getattr(experts, "is_transposed", False):
        return f"unexpected expert layout: router {tuple(r.shape)}, gate_up {tuple(gu.shape)}, down {tuple(dn.shape)}"
    if getattr(experts, "has_bias", False) or getattr(experts, "_is_expert_parallel", False):
        return "expert biases / expert parallelism are not modelled"
    if gu.dtype not in (torch.bfloat16, torch.float16) or not (r.dtype == gu.dtype == dn.dtype):
        return f"weights must share one of bf16 / fp16, got {r.dtype}, {gu.dtype}, {dn.dtype}"
    act = getattr(getattr(experts, "act_fn", None), "__class__", type(None)).__name__
    if act not in ("SiLUActivation", "SiLU"):
        return f"activation {act} is not SiLU"
    return None


def spec_of(block: torch.nn.Module) -> MoeSpec:
    """The fused block's view of `block` (call `unsupported_reason` first)."""
    normalize, round_weights = _FAMILIES[type(block).__name__]
    if normalize is None:
        normalize = bool(block.gate.norm_topk_prob)
    return MoeSpec(router=block.gate.weight, gate_up=block.experts.gate_up_proj, down=block.experts.down_proj,
                   top_k=int(block.gate.top_k), normalize=normalize, round_weights=round_weights)


if triton is not None:
    @triton.jit
    def _gate_up_kernel(x_ptr, w_ptr, h_ptr, perm_ptr, start_ptr, count_ptr, H, I,
                        TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        UPCAST: tl.constexpr):
        """h[start_e + i, n] = silu(x_r G_e[n]) * (x_r U_e[n]) for the i-th pair of expert e (row r = pair // k)."""
        e = tl.program_id(0)
        pn = tl.program_id(1)
        cnt = tl.load(count_ptr + e)
        start = tl.load(start_ptr + e)
        offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < I
        w_e = w_ptr + e.to(tl.int64) * (2 * I) * H
        for m0 in range(0, cnt, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            m_ok = offs_m < cnt
            row = tl.load(perm_ptr + start + offs_m, mask=m_ok, other=0) // TOP_K
            acc_g = tl.full((BLOCK_M, BLOCK_N), 0., tl.float32)
            acc_u = tl.full((BLOCK_M, BLOCK_N), 0., tl.float32)
            for k0 in range(0, H, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < H
                a = tl.load(x_ptr + row[:, None] * H + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.)
                wk = n_ok[:, None] & k_ok[None, :]
                wg = tl.load(w_e + offs_n[:, None] * H + offs_k[None, :], mask=wk, other=0.)  # [BN, BK]
                wu = tl.load(w_e + (I + offs_n)[:, None] * H + offs_k[None, :], mask=wk, other=0.)
                if UPCAST:  # the interpreter's bf16 dot is wrong (triton 3.9); fp32 operands are exact there
                    a, wg, wu = a.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
                acc_g = tl.dot(a, tl.trans(wg), acc_g)
                acc_u = tl.dot(a, tl.trans(wu), acc_u)
            h = acc_g / (1. + tl.exp(-acc_g)) * acc_u
            tl.store(h_ptr + (start + offs_m)[:, None] * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
                     mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _down_kernel(h_ptr, w_ptr, wt_ptr, y_ptr, perm_ptr, start_ptr, count_ptr, H, I,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
        """y[pair, n] = wt[pair] * (h[start_e + i] D_e[n]) for the i-th pair of expert e, y in fp32."""
        e = tl.program_id(0)
        pn = tl.program_id(1)
        cnt = tl.load(count_ptr + e)
        start = tl.load(start_ptr + e)
        offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < H
        w_e = w_ptr + e.to(tl.int64) * H * I
        for m0 in range(0, cnt, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            m_ok = offs_m < cnt
            pair = tl.load(perm_ptr + start + offs_m, mask=m_ok, other=0)
            acc = tl.full((BLOCK_M, BLOCK_N), 0., tl.float32)
            for k0 in range(0, I, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = offs_k < I
                a = tl.load(h_ptr + (start + offs_m)[:, None] * I + offs_k[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.)
                w = tl.load(w_e + offs_n[:, None] * I + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.)
                if UPCAST:
                    a, w = a.to(tl.float32), w.to(tl.float32)
                acc = tl.dot(a, tl.trans(w), acc)
            wt = tl.load(wt_ptr + pair, mask=m_ok, other=0.)
            tl.store(y_ptr + pair[:, None] * H + offs_n[None, :], acc * wt[:, None],
                     mask=m_ok[:, None] & n_ok[None, :])

# (BLOCK_N, BLOCK_K, num_warps, num_stages) of each kernel; RLBENCH_MOE_DECODE_BLOCKS="gn,gk,gw,gs,dn,dk,dw,ds"
# overrides them (the microbench tools/sm90/moe_decode_bench.py sweeps it). The interpreter takes small blocks.
_BLOCKS_CUDA = (64, 128, 4, 4, 64, 128, 4, 4)
_BLOCKS_INTERPRET = (16, 32, 1, 1, 16, 32, 1, 1)
BLOCK_M = 16  # rows of one expert per tile (tl.dot's least M); decode gives an expert ~M k / E rows


def _blocks() -> tuple[int, ...]:
    env = os.environ.get("RLBENCH_MOE_DECODE_BLOCKS")
    if env:
        vals = tuple(int(v) for v in env.split(","))
        if len(vals) != 8:
            raise ValueError(f"RLBENCH_MOE_DECODE_BLOCKS={env!r}: needs 8 integers (gate_up n,k,warps,stages, "
                             "then down's)")
        return vals
    return _BLOCKS_INTERPRET if _interpreted() else _BLOCKS_CUDA


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def route(x: torch.Tensor, spec: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert ids `[M, k]` (long) and their weights `[M, k]` (fp32) of rows `x` `[M, H]`, as the block's router."""
    logits = torch.nn.functional.linear(x, spec.router)  # [M, E]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, idx = torch.topk(probs, spec.top_k, dim=-1)
    if spec.normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    if spec.round_weights:
        w = w.to(logits.dtype).float()
    return idx, w


def moe_decode(x: torch.Tensor, spec: MoeSpec) -> torch.Tensor:
    """The MoE block's output `[..., H]` for `x` `[..., H]` (any leading shape; rows are independent)."""
    shape = x.shape
    x = x.reshape(-1, shape[-1]).contiguous()  # [M, H]
    m, h_dim = x.shape
    e, two_i, _ = spec.gate_up.shape
    i_dim = two_i // 2
    k = spec.top_k
    idx, w = route(x, spec)  # [M, k] each
    flat = idx.reshape(-1)  # [S], S = M k; pair p is (row p // k, slot p % k)
    _, perm = torch.sort(flat, stable=True)  # pairs in expert order
    perm = perm.to(torch.int32)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))  # [E]
    starts = (torch.cumsum(counts, 0, dtype=torch.int32) - counts).contiguous()  # [E]
    hbuf = torch.empty(m * k, i_dim, dtype=x.dtype, device=x.device)  # [S, I], expert order
    y = torch.empty(m, k, h_dim, dtype=torch.float32, device=x.device)  # [M, k, H]
    gn, gk, gw, gs, dn, dk, dw, ds = _blocks()
    upcast = _interpreted()
    _gate_up_kernel[(e, triton.cdiv(i_dim, gn))](
        x, spec.gate_up, hbuf, perm, starts, counts, h_dim, i_dim, TOP_K=k,
        BLOCK_M=BLOCK_M, BLOCK_N=gn, BLOCK_K=gk, UPCAST=upcast, num_warps=gw, num_stages=gs)
    _down_kernel[(e, triton.cdiv(h_dim, dn))](
        hbuf, spec.down, w.reshape(-1).contiguous(), y, perm, starts, counts, h_dim, i_dim,
        BLOCK_M=BLOCK_M, BLOCK_N=dn, BLOCK_K=dk, UPCAST=upcast, num_warps=dw, num_stages=ds)
    return y.sum(dim=1).to(x.dtype).reshape(shape)
