"""Per-token log-probabilities and entropy of the response, without full-batch fp32 logits.

The trainer and every rollout engine use the same definition:

    logp_t = log_softmax(logits_t / temperature)[token_t]        (fp32)
    H_t    = -sum_v softmax(z)_v * log_softmax(z)_v,  z = logits_t / temperature

Shared prompts: the n responses of a prompt share it, so by default the prompt is run once per
group and its KV cache (with its autograd graph) is handed to the group's n responses; the
response tokens then run as one continuation. Same math as running every full sequence (the
test compares both), with n-1 of every n prompt forwards saved. Rows are grouped when
consecutive rows carry the same `group_index` and the same prompt tokens; otherwise the plain
full-sequence forward runs, as it does for models with recurrent (linear-attention) layers, whose
cache is a state, not keys and values (`trainer/rollout/decode_cache.py`).

LM head (`lm_head_logprobs`): one autograd function over response positions only (hidden states
at columns P-1 .. P+R-2), looping over chunks of `chunk_size` tokens so that no more than one
chunk of `[chunk, V]` logits is alive. Forward keeps only the per-token `lse` and `H`; backward
recomputes each chunk's logits (one matmul) and writes the logit gradient in closed form
instead of replaying the autograd graph of log_softmax / gather / exp / sum. `keep_logits`
(`actor.lm_head_keep_logits`) trades that matmul for memory: the forward keeps every chunk's logits
in the matmul dtype (`[M, V]`, 2 bytes each in bf16) and the backward reads them, the same values the
recompute would give:

    p = softmax(z),  logp = z - lse
    d logp_t / d z   = onehot(t) - p
    d H / d z        = -p * (logp + H)            (since dH/dz_k = -p_k (z_k - E_p[z]), E_p[z] = lse - H)
    d loss / d logits = (g_logp * (onehot(t) - p) - g_H * p * (logp + H)) / temperature

The gradient of the logits is cast once to the matmul dtype; the weight gradient is summed over
chunks in fp32 and cast once at the end (the autocast path summed bf16 per-chunk products in
fp32 too). An entropy that receives no gradient (it is only a metric when `entropy_coeff` is 0)
costs nothing in backward. The matmuls run in the autocast dtype when autocast is on (fp32
weights are cast once per call), else in the weight's dtype; softmax statistics are fp32.

Compiled mode (`compiled=True`, `actor.compile`): the per-chunk math after the logits matmul runs
through two `torch.compile(dynamic=False)` functions, `_chunk_stats` (lse / target log-prob /
entropy read straight from the bf16 logits, no fp32 `[C, V]` copy) and `_chunk_dlogits` (the
closed-form logit gradient above in one fused pass that writes the bf16 `d logits`; the
onehot term is a compare against the column index, not a scatter). Each chunk's rows are padded
up to a multiple of `ROW_MULTIPLE` (the last chunk only) with zero hidden states and zero
incoming gradient, so their logit gradient is exactly zero and a fixed, small set of shapes is
compiled. The decoder's sequence width is right-padded to a multiple of `SEQ_MULTIPLE` (right
padding is causal-safe: no real position attends to it, and its outputs are dropped), and the
shared-prompt KV path is off (a KV cache's per-layer `update` makes every decoder layer a new graph).

Images: a batch whose ``meta["multi_modal_inputs"]`` holds each row's ``pixel_values`` /
``image_grid_thw`` (a vision-language policy) runs one full-sequence forward through
`trainer.models.vlm.multimodal_hidden_states` (image features in the prompt's image-token slots,
M-RoPE positions instead of the batch's 1-D `position_ids`), the forward the hf engine prefills
with; the LM head and log-prob math below are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from trainer.components.batch import Batch
from trainer.rollout.decode_cache import has_recurrent_layers

ROW_MULTIPLE = 256  # compiled mode: the last LM-head chunk is padded to a multiple of this many rows
SEQ_MULTIPLE = 128  # compiled mode: decoder inputs are right-padded to a multiple of this many tokens


def _linear(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One chunk's logits in the matmul dtype, `h @ w.T + bias`: `[C, V]`."""
    return F.linear(h, w, None if bias is None else bias.to(w.dtype))


def _scaled(logits: torch.Tensor, temperature: float, copy: bool = False) -> torch.Tensor:
    """fp32 `z = logits / temperature` of one chunk, `[C, V]` (`copy`: never the logits' own storage)."""
    z = logits.to(torch.float32, copy=copy)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _chunk_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(logp [C], lse [C], H [C])` of one chunk's logits, written functionally for `torch.compile`."""
    z = logits.float() / temperature  # [C, V]
    lse = torch.logsumexp(z, dim=-1)  # [C]
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse  # [C]
    if with_entropy:
        lz = z - lse[:, None]  # [C, V]
        ent = -(lz.exp() * lz).sum(-1)  # [C]
    else:
        ent = torch.zeros_like(lse)
    return logp, lse, ent


def _chunk_dlogits(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor, g_lp: torch.Tensor,
                   g_h: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Closed-form `d loss / d logits` of one chunk in the logits' dtype (`g_lp`, `g_h` already divided by
    temperature)."""
    z = logits.float() / temperature  # [C, V]
    logp = z - lse[:, None]  # [C, V]
    p = logp.exp()
    coef = -g_lp[:, None] if g_h is None else -(g_h[:, None] * (logp + ent[:, None]) + g_lp[:, None])  # [C, V]
    cols = torch.arange(z.shape[1], device=z.device)  # [V]
    onehot = (cols[None, :] == targets[:, None]).float()  # [C, V]
    return (p * coef + onehot * g_lp[:, None]).to(logits.dtype)


_COMPILED: dict[str, tuple[Callable, Callable]] = {}


def compiled_chunk_fns(backend: str = "inductor") -> tuple[Callable, Callable]:
    """`(_chunk_stats, _chunk_dlogits)` under `torch.compile(dynamic=False)`, built once per backend. Each
    (chunk rows, with_entropy, temperature) is its own graph: the caller raises dynamo's recompile limit
    (`trainer.backends.compile.raise_recompile_limit`, as `actor.compile` and `actor.lm_head_compile` do)."""
    if backend not in _COMPILED:
        _COMPILED[backend] = (torch.compile(_chunk_stats, dynamic=False, backend=backend),
                              torch.compile(_chunk_dlogits, dynamic=False, backend=backend))
    return _COMPILED[backend]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows appended up to `rows` (dim 0)."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _padded_rows(n: int, chunk: int) -> int:
    return min(chunk, -(-n // ROW_MULTIPLE) * ROW_MULTIPLE) if n < chunk else n



def _accumulate_chunk_grads(d_logits: torch.Tensor, hc: torch.Tensor, w: torch.Tensor, dh_rows: torch.Tensor | None,
                            dw: torch.Tensor | None, db: torch.Tensor | None) -> None:
    """One chunk's share of the LM-head gradients from its logit gradient `d_logits` [C, V]:
    hidden rows `dh_rows` [C, H] written, weight `dw` [V, H] and bias `db` [V] summed (fp32)."""
    if dh_rows is not None:
        dh_rows.copy_(d_logits @ w)
    if dw is not None:
        if dw.is_cuda and d_logits.dtype != dw.dtype:  # cuBLAS adds the bf16 product into the fp32 sum itself
            torch.addmm(dw, d_logits.t(), hc, out_dtype=dw.dtype, out=dw)
        else:
            dw += d_logits.t() @ hc
    if db is not None:
        db += d_logits.float().sum(0)

class _LMHeadLogprobs(torch.autograd.Function):
    """(logp [M], entropy [M]) of targets [M] from hidden [M, H] and the head weight [V, H], chunked."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, chunk_size: int, with_entropy: bool, compute_dtype: torch.dtype,
                compile_backend: str | None, keep_logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        h = hidden.to(compute_dtype)  # [M, H]
        w = weight.to(compute_dtype)  # [V, H] (a copy only for fp32 weights under autocast)
        m = h.shape[0]
        logp = torch.empty(m, dtype=torch.float32, device=h.device)  # [M]
        lse = torch.empty_like(logp)  # [M]
        ent = torch.zeros_like(logp)  # [M]
        kept: list[torch.Tensor] = []  # keep_logits: each chunk's logits, for the backward
        ctx.compile_backend = compile_backend
        if compile_backend is not None:
            stats, _ = compiled_chunk_fns(compile_backend)
            hd, wd = h.detach(), w.detach()  # one requires_grad state for every chunk: one graph
            for i in range(0, m, chunk_size):
                hc, tc = hd[i:i + chunk_size], targets[i:i + chunk_size]
                n = hc.shape[0]
                rows = _padded_rows(n, chunk_size)
                logits = _linear(_pad_rows(hc, rows), wd, bias)  # [rows, V]
                c_logp, c_lse, c_ent = stats(logits, _pad_rows(tc, rows), temperature, with_entropy)
                logp[i:i + n], lse[i:i + n], ent[i:i + n] = c_logp[:n], c_lse[:n], c_ent[:n]
                if keep_logits:
                    kept.append(logits)
                del logits
        else:
            for i in range(0, m, chunk_size):
                logits = _linear(h[i:i + chunk_size], w, bias)  # [C, V]
                if keep_logits:
                    kept.append(logits)
                z = _scaled(logits, temperature, copy=keep_logits)  # the kept logits stay as they are
                del logits
                c_lse = torch.logsumexp(z, dim=-1)  # [C]
                lse[i:i + chunk_size] = c_lse
                logp[i:i + chunk_size] = z.gather(-1, targets[i:i + chunk_size, None]).squeeze(-1) - c_lse
                if with_entropy:
                    z.sub_(c_lse[:, None])  # log-probs, in place
                    # H = -sum p * logp as a batched dot: [C, 1, V] @ [C, V, 1]
                    ent[i:i + chunk_size] = -torch.bmm(z.exp().unsqueeze(1), z.unsqueeze(2)).view(-1)
                del z
        ctx.save_for_backward(h, w, bias, targets, lse, ent)
        ctx.kept = kept
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.weight_dtype, ctx.hidden_dtype = weight.dtype, hidden.dtype
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):
        h, w, bias, targets, lse, ent = ctx.saved_tensors
        kept, ctx.kept = ctx.kept, None
        if not ctx.with_entropy:
            g_ent = None
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None, None, None, None, None
        t, c = ctx.temperature, ctx.chunk_size
        m = h.shape[0]
        # d loss / d logits is linear in (g_logp, g_ent): fold 1/temperature into them
        g_lp = (g_logp.float() / t) if g_logp is not None else torch.zeros(m, device=h.device)  # [M]
        g_h = (g_ent.float() / t) if g_ent is not None else None  # [M]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        dh = torch.empty_like(h) if need_h else None  # [M, H]
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None  # [V, H] fp32 sum
        db = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None  # [V]

        def chunk_logits(k: int, hc: torch.Tensor) -> torch.Tensor:
            """The chunk's logits: kept from the forward, else recomputed (the same matmul)."""
            if kept:
                logits, kept[k] = kept[k], None
                return logits
            return _linear(hc, w, bias)

        if ctx.compile_backend is not None:
            _, dlogits = compiled_chunk_fns(ctx.compile_backend)
            h, w, lse, ent = h.detach(), w.detach(), lse.detach(), ent.detach()
            for k, i in enumerate(range(0, m, c)):
                hc = h[i:i + c]
                n = hc.shape[0]
                r = _padded_rows(n, c)
                d_logits = dlogits(chunk_logits(k, _pad_rows(hc, r)), _pad_rows(targets[i:i + c], r),
                                   _pad_rows(lse[i:i + c], r), _pad_rows(ent[i:i + c], r), _pad_rows(g_lp[i:i + c], r),
                                   None if g_h is None else _pad_rows(g_h[i:i + c], r), t)[:n]  # [C, V]
                _accumulate_chunk_grads(d_logits, hc, w, dh[i:i + c] if need_h else None, dw, db)
                del d_logits
            return (dh.to(ctx.hidden_dtype) if need_h else None, dw.to(ctx.weight_dtype) if need_w else None,
                    db.to(bias.dtype) if need_b else None, None, None, None, None, None, None, None)
        rows = torch.arange(min(c, m), device=h.device)
        for k, i in enumerate(range(0, m, c)):
            hc = h[i:i + c]
            z = _scaled(chunk_logits(k, hc), t)  # [C, V]
            z.sub_(lse[i:i + c, None])  # logp
            p = z.exp()  # [C, V]
            if g_h is not None:
                # coefficient -(g_H (logp + H) + g_logp), then times p
                z.add_(ent[i:i + c, None]).mul_(-g_h[i:i + c, None]).sub_(g_lp[i:i + c, None])
                p.mul_(z)
            else:
                p.mul_(-g_lp[i:i + c, None])
            del z
            n = hc.shape[0]
            p[rows[:n], targets[i:i + c]] += g_lp[i:i + c]  # the onehot(t) term
            d_logits = p.to(w.dtype)  # [C, V]
            del p
            _accumulate_chunk_grads(d_logits, hc, w, dh[i:i + c] if need_h else None, dw, db)
            del d_logits
        dh = dh.to(ctx.hidden_dtype) if need_h else None
        dw = dw.to(ctx.weight_dtype) if need_w else None
        db = db.to(bias.dtype) if need_b else None
        return dh, dw, db, None, None, None, None, None, None, None


def lm_head_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, *, temperature: float = 1.0,
                     chunk_size: int = 1024, with_entropy: bool = False, compile_backend: str | None = None,
                     keep_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropy, zeros when not asked) of `targets` [..] given final hidden states [.., H].
    `compile_backend`: run the chunk math through `torch.compile` with that backend (module docstring).
    `keep_logits`: keep each chunk's logits from the forward for the backward instead of recomputing them
    (`actor.lm_head_keep_logits`; only while gradients are recorded)."""
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])  # [M, H]
    t = targets.reshape(-1).to(h.device)  # [M]
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    dev = h.device.type
    cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype
    keep = keep_logits and torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(dev, enabled=False):
        logp, ent = _LMHeadLogprobs.apply(h, weight, bias, t, float(temperature), int(chunk_size), with_entropy, cdt,
                                          compile_backend, keep)
    return logp.reshape(shape), ent.reshape(shape)


def prompt_groups(batch: Batch) -> torch.Tensor | None:
    """Start row of each run of consecutive rows sharing one prompt, or None if sharing saves nothing."""
    g = batch.group_index
    starts = torch.ones_like(g, dtype=torch.bool)
    starts[1:] = g[1:] != g[:-1]
    first = starts.nonzero().squeeze(-1)  # [G]
    if first.numel() == len(batch):
        return None
    owner = first.repeat_interleave(torch.diff(torch.cat([first, torch.tensor([len(batch)])])))  # [N]
    p = batch.prompt_len
    same = (batch.input_ids[:, :p] == batch.input_ids[owner, :p]).all() and \
        (batch.attention_mask[:, :p] == batch.attention_mask[owner, :p]).all()
    return first if bool(same) else None


def _shared_prompt_hidden(base: torch.nn.Module, batch: Batch, first: torch.Tensor) -> torch.Tensor:
    from transformers import DynamicCache

    p = batch.prompt_len
    counts = torch.diff(torch.cat([first, torch.tensor([len(batch)], device=first.device)]))  # [G]
    cache = DynamicCache()
    prompt_out = base(input_ids=batch.input_ids[first, :p], attention_mask=batch.attention_mask[first, :p],
                      position_ids=batch.position_ids[first, :p], past_key_values=cache, use_cache=True)
    owner = torch.arange(first.numel(), device=first.device).repeat_interleave(counts)  # [N] group of each row
    cache.batch_select_indices(owner)  # each response gets (a differentiable copy of) its prompt's KV
    resp_out = base(input_ids=batch.input_ids[:, p:], attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids[:, p:], past_key_values=cache, use_cache=True)
    last_prompt = prompt_out.last_hidden_state[owner, -1:]  # [N, 1, H] predicts response token 0
    return torch.cat([last_prompt, resp_out.last_hidden_state[:, :-1]], dim=1)  # [N, R, H]


def _pad_right(x: torch.Tensor, width: int, value: int | None = None) -> torch.Tensor:
    """`[N, T]` -> `[N, width]`: appended columns hold `value` (None: repeat the last column)."""
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    fill = x[:, -1:].expand(-1, extra) if value is None else x.new_full((x.shape[0], extra), value)
    return torch.cat([x, fill], dim=1)


def response_hidden_states(model: torch.nn.Module, batch: Batch, *, share_prompts: bool = True,
                           seq_multiple: int = 1) -> torch.Tensor:
    """Final hidden states that predict each response token: `[N, R, H]`. `seq_multiple > 1`: the
    decoder input is right-padded (attention 0) to a multiple of it, so compiled layers see few shapes."""
    mm = batch.meta.get("multi_modal_inputs")
    if mm is not None and any(m is not None for m in mm):
        from trainer.models.vlm import multimodal_hidden_states

        p, r = batch.prompt_len, batch.responses.shape[1]
        hidden, _ = multimodal_hidden_states(model, batch.input_ids, batch.attention_mask, mm, image_cols=p)
        return hidden[:, p - 1:p - 1 + r]  # [N, R, H]
    base = getattr(model, model.base_model_prefix)
    ckpt_attr = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    # a shared prompt hands its KV cache to the responses; models with recurrent layers run every row whole
    if share_prompts and not getattr(model, ckpt_attr, False) and not has_recurrent_layers(model):
        first = prompt_groups(batch.to("cpu") if batch.group_index.device.type != "cpu" else batch)
        if first is not None:
            return _shared_prompt_hidden(base, batch, first.to(batch.input_ids.device))
    t = batch.input_ids.shape[1]
    width = -(-t // seq_multiple) * seq_multiple
    out = base(input_ids=_pad_right(batch.input_ids, width, 0), attention_mask=_pad_right(batch.attention_mask, width, 0),
               position_ids=_pad_right(batch.position_ids, width), use_cache=False)
    hidden = out.last_hidden_state  # [N, P+R, H]
    p, r = batch.prompt_len, batch.responses.shape[1]
    return hidden[:, p - 1:p - 1 + r]  # [N, R, H]


def response_logprobs(model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0, chunk_size: int = 1024,
                      with_entropy: bool = False, share_prompts: bool = True, compile_backend: str | None = None,
                      lm_head_compile_backend: str | None = None, keep_logits: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [N, R], entropy [N, R])` of the batch's responses under `model`. `compile_backend`: the
    compiled mode of the module docstring (fixed shapes, no shared-prompt KV path, compiled LM-head chunks);
    the decoder layers themselves are compiled by `trainer.backends.compile.compile_decoder_layers`.
    `lm_head_compile_backend`: the compiled LM-head chunks alone (`actor.lm_head_compile`), the decoder as it is;
    `keep_logits`: `lm_head_logprobs`'s."""
    compiled = compile_backend is not None
    hidden = response_hidden_states(model, batch, share_prompts=share_prompts and not compiled,
                                    seq_multiple=SEQ_MULTIPLE if compiled else 1)
    return lm_head_logprobs(hidden, model.get_output_embeddings(), batch.responses, temperature=temperature,
                            chunk_size=chunk_size, with_entropy=with_entropy,
                            compile_backend=compile_backend or lm_head_compile_backend, keep_logits=keep_logits)
