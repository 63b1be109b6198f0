"""Clipped PPO policy loss (with clip-higher and dual clip), clipped value loss, token entropy.

Policy loss (PPO, Schulman et al. 2017), per token with ratio rho = exp(logp - logp_old) and
advantage A:

    L1 = -A * rho
    L2 = -A * clip(rho, 1 - eps_low, 1 + eps_high)           clip-higher: eps_high > eps_low
    L  = max(L1, L2)                                          (DAPO, Yu et al. 2025)
    dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"),
    negative advantages only:
    L  = min(max(L1, L2), -A * c)          if A < 0,  c = clip_ratio_c > 1

so a token with A < 0 and a huge ratio contributes at most `-A * c` instead of growing without
bound. `tis_weights` (truncated importance sampling, Yao et al. 2025, see `mismatch.py`) multiply
the per-token loss, which is then aggregated by `agg_loss`.

Metrics (verl's names and definitions, `compute_policy_loss_vanilla`), masked means over valid
tokens:
    actor/pg_loss            the aggregated loss
    actor/pg_clipfrac        fraction of tokens where the clipped term is active (L2 > L1)
    actor/ppo_kl             mean of (logp_old - logp), the k1 estimate of KL(old || new)
    actor/pg_clipfrac_lower  fraction of tokens where the dual clip is active (A < 0, L > -A*c)

As in verl, log(rho) is clamped to [-20, 20] before exp (numerical safety); ppo_kl uses the
clamped value.

Value loss (verl's `compute_value_loss`, from PPO's clipped value objective):
    v_clip = clip(v, v_old - c_v, v_old + c_v)
    L_v    = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
    critic/vf_clipfrac = fraction of tokens where the clipped error is larger.

Entropy: H = logsumexp(z) - sum softmax(z) * z, over the last axis, in fp32, with z shifted by its
max first (verl's formula; the shift keeps precision for large logits).

Departure: metrics are returned as detached 0-dim tensors (no host sync); call `.item()` to log.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.aggregation import agg_loss, masked_mean
from trainer.errors import ConfigError

_LOG_RATIO_BOUND = 20.0


def _check_clip(clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None) -> None:
    if not 0.0 <= clip_ratio_low < 1.0:
        raise ConfigError(
            f"actor.clip_ratio_low: must be in [0, 1), got {clip_ratio_low}; 0.2 is the usual value"
        )
    if not clip_ratio_high >= 0.0:
        raise ConfigError(
            f"actor.clip_ratio_high: must be >= 0, got {clip_ratio_high}; use 0.2 (0.28 for clip-higher)"
        )
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ConfigError(
            f"actor.clip_ratio_c: the dual-clip bound must be > 1, got {clip_ratio_c}; "
            "use 3.0, or null to disable"
        )


def compute_policy_loss(
    old_logprob: torch.Tensor,
    logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    tis_weights: torch.Tensor | None = None,
    **agg_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO loss over `[N, R]` tensors; returns (scalar loss, metrics).

    `clip_ratio_c=None` disables the dual clip. `agg_kwargs` go to `agg_loss`
    (`global_num_tokens`, `global_num_seqs`, `horizon`).
    """
    _check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c)
    mask = response_mask.bool()  # [N, R]
    adv = advantages.float()
    log_ratio = logprob.float() - old_logprob.float()  # [N, R]
    log_ratio = torch.clamp(log_ratio, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)  # [N, R]
    ppo_kl = masked_mean(-log_ratio.detach(), mask)

    loss_unclipped = -adv * ratio  # [N, R]
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # [N, R]
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)  # [N, R]
    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), mask)

    if clip_ratio_c is not None:
        loss_dual = -adv * clip_ratio_c  # [N, R]
        negative = adv < 0
        pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)  # [N, R]
        clipfrac_lower = masked_mean((torch.gt(loss_ppo, loss_dual) & negative).float(), mask)
    else:
        pg_losses = loss_ppo
        clipfrac_lower = torch.zeros((), device=pg_losses.device)

    if tis_weights is not None:
        pg_losses = pg_losses * tis_weights.detach().float()

    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode, **agg_kwargs)
    metrics = {
        "actor/pg_loss": pg_loss.detach(),
        "actor/pg_clipfrac": clipfrac.detach(),
        "actor/ppo_kl": ppo_kl,
        "actor/pg_clipfrac_lower": clipfrac_lower.detach(),
    }
    return pg_loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **agg_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss over `[N, R]` tensors; returns (scalar loss, metrics)."""
    if not cliprange_value > 0:
        raise ConfigError(
            f"critic.cliprange_value: must be > 0, got {cliprange_value}; 0.5 is the usual value"
        )
    mask = response_mask.bool()
    v = vpreds.float()
    v_old = values_old.float()
    ret = returns.float()
    v_clipped = torch.maximum(torch.minimum(v, v_old + cliprange_value), v_old - cliprange_value)  # [N, R]
    err_unclipped = (v - ret) ** 2  # [N, R]
    err_clipped = (v_clipped - ret) ** 2  # [N, R]
    vf_loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), mask, loss_agg_mode, **agg_kwargs)
    vf_clipfrac = masked_mean(torch.gt(err_clipped, err_unclipped).float(), mask)
    return vf_loss, {"critic/vf_loss": vf_loss.detach(), "critic/vf_clipfrac": vf_clipfrac.detach()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: `[..., V]` -> `[...]`, fp32.

    Stable for large logits (logsumexp) and for -inf logits (masked vocabulary entries add 0).
    """
    z = logits.float()  # [..., V]
    # Shift by the row max: the same entropy, without the cancellation of two large numbers.
    z = z - z.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(z, dim=-1)  # [..., V]
    # Zero the logits that have probability 0 (e.g. -inf) before the product, so that neither the
    # value nor the gradient sees 0 * -inf.
    z_safe = torch.where(probs > 0, z, torch.zeros_like(z))  # [..., V]
    return torch.logsumexp(z, dim=-1) - (probs * z_safe).sum(dim=-1)
