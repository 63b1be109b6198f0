"""Loss aggregation: turn a per-token loss matrix `[N, R]` into the scalar that is back-propagated.

With `l[i, t]` the per-token loss, `m[i, t]` the 0/1 response mask, `L_i = sum_t m[i,t] l[i,t]`
the token sum of sequence i, `n_i = sum_t m[i,t]` its length, `S` the sequences with `n_i > 0`
and `H` a constant horizon:

    token-mean               sum_i L_i / sum_i n_i             (DAPO, Yu et al. 2025: every token
                                                                weighs the same)
    seq-mean-token-sum       sum_{i in S} L_i / |S|             (long answers weigh more)
    seq-mean-token-mean      sum_{i in S} (L_i / n_i) / |S|     (original GRPO, Shao et al. 2024)
    seq-mean-token-sum-norm  sum_{i in S} L_i / |S| / H         (Dr.GRPO, Liu et al. 2025: no
                                                                length normalization, constant H)

These are verl's definitions (`verl/trainer/ppo/core_algos.py::agg_loss`), so the same tensors
give the numbers a verl user expects.

Global normalization. A step's batch is split over data-parallel workers and micro-batches. When
the caller passes the counts of the *whole* batch (`global_num_tokens` = sum of `n_i` for
token-mean, `global_num_seqs` = `|S|` for the seq-* modes), each micro-batch's result is its share
of the full-batch loss, so summing the results over micro-batches and over workers gives exactly
the full-batch loss: the gradient no longer depends on how the batch was cut.

Departures from verl:
- Contributions are meant to be *summed* over workers (all-reduce SUM of gradients, or an
  average followed by a multiply by the world size done by the caller). verl folds that multiply
  into the loss through a `dp_size` argument; here the loss stays the plain full-batch share.
- A micro-batch with no valid token (and no global count) gives 0 instead of NaN.
- Masked positions are selected with `torch.where`, so inf/NaN in padding never leak into the sum.
- Older verl releases (<= 0.5) computed `seq-mean-token-sum-norm` as `sum_i L_i / H` without the
  division by the number of sequences; this follows the current definition (mean over sequences).
"""

from __future__ import annotations

import torch

from trainer.errors import ConfigError

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# verl's epsilon for the per-sequence token mean in seq-mean-token-mean.
_SEQ_TOKEN_MEAN_EPS = 1e-8


def check_loss_agg_mode(loss_agg_mode: str, *, field: str = "actor.loss_agg_mode") -> str:
    """Return `loss_agg_mode` if known, else raise a one-line ConfigError naming `field`."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(
            f"{field}: unknown loss aggregation mode {loss_agg_mode!r}; "
            f"use one of {', '.join(LOSS_AGG_MODES)}"
        )
    return loss_agg_mode


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is nonzero (fp32). Padding values, even inf/NaN, are ignored."""
    values = values.float()
    selected = torch.where(mask.bool(), values, torch.zeros_like(values))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is nonzero; 0 where there are none."""
    count = mask.bool().float().sum() if dim is None else mask.bool().float().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked positions, Bessel-corrected when `unbiased` (verl's `masked_var`).

    Returns 0 when fewer than two positions are valid (verl raises there).
    """
    mask_f = mask.bool().float()
    count = mask_f.sum()
    mean = masked_mean(values, mask)
    var = masked_mean((values.float() - mean) ** 2, mask)
    if unbiased:
        if count < 2:
            return torch.zeros_like(var)
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with mean/var over masked positions (verl's `masked_whiten`).

    With `shift_mean=False` the mean is added back after scaling.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values.float() - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """Aggregate `loss_mat` `[N, R]` over the positions of `loss_mask` `[N, R]` into a scalar.

    Args:
        loss_mat: per-token loss, any float dtype (the math runs in fp32).
        loss_mask: 1/True on tokens that count, 0/False on padding and masked tokens.
        loss_agg_mode: one of `LOSS_AGG_MODES`.
        global_num_tokens: token-mean only: valid tokens in the whole batch (all micro-batches,
            all workers). Default: this micro-batch's count.
        global_num_seqs: seq-* modes only: sequences with at least one valid token in the whole
            batch. Default: this micro-batch's count.
        horizon: seq-mean-token-sum-norm only: the constant divisor H. Default
            `loss_mask.shape[-1]`; pass the configured max response length so H stays constant.

    Returns:
        0-dim fp32 tensor.
    """
    check_loss_agg_mode(loss_agg_mode)
    mask = loss_mask.bool()  # [N, R]
    denom: torch.Tensor | float
    if loss_agg_mode == "token-mean":
        if global_num_tokens is None:
            denom = mask.float().sum().clamp(min=1.0)
        else:
            denom = _positive("global_num_tokens", global_num_tokens)
        return masked_sum(loss_mat, mask) / denom

    seq_token_sum = masked_sum(loss_mat, mask, dim=-1)  # [N]
    seq_len = mask.float().sum(dim=-1)  # [N]
    seq_valid = seq_len > 0  # [N], fully masked sequences do not count
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_token_sum / (seq_len + _SEQ_TOKEN_MEAN_EPS)  # [N]
    else:
        seq_loss = seq_token_sum  # [N]
    if global_num_seqs is None:
        denom = seq_valid.float().sum().clamp(min=1.0)
    else:
        denom = _positive("global_num_seqs", global_num_seqs)
    loss = masked_sum(seq_loss, seq_valid) / denom
    if loss_agg_mode == "seq-mean-token-sum-norm":
        h = loss_mask.shape[-1] if horizon is None else horizon
        loss = loss / _positive("horizon", h)
    return loss


def global_counts(loss_mask: torch.Tensor) -> dict[str, float]:
    """`global_num_tokens` and `global_num_seqs` of a (local) batch, to be summed over workers.

    The loop computes these once per mini-batch (before splitting it into micro-batches), sums them
    over data-parallel workers, and passes them to every `agg_loss` call of that mini-batch.
    """
    mask = loss_mask.bool()
    return {
        "global_num_tokens": float(mask.sum().item()),
        "global_num_seqs": float((mask.sum(dim=-1) > 0).sum().item()),
    }
