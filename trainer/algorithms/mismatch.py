"""Rollout-vs-trainer log-prob mismatch: truncated importance sampling weights and mismatch metrics.

The rollout engine (vLLM, SGLang, the HF generator) samples y_t ~ pi_rollout and reports
log pi_rollout(y_t); the trainer recomputes log pi_old(y_t) with the same weights. Kernels,
precision (bf16 vs fp32) and batch shapes make the two differ, so the update is slightly
off-policy even when the weights are identical. Truncated importance sampling (TIS, Yao et al.
2025, "Your efficient RL framework secretly brings you off-policy RL training") reweights each
token's loss by

    w_t = min( pi_old(y_t) / pi_rollout(y_t), C ) = min( exp(log pi_old - log pi_rollout), C )

treated as a constant (detached). This is verl's token-level rollout correction
(`rollout_is: token`, `rollout_is_threshold: C`; here `actor.tis_cap: C`), including the clamp
of the log ratio to [-20, 20] before exp. Weights are 0 on padding.

Metrics, over valid tokens, with p = exp(logp) (verl's `calculate_debug_metrics` names):
    training/rollout_probs_diff_mean / _max / _std   |p_old - p_rollout|  (std unbiased)
    training/rollout_actor_probs_pearson_corr        Pearson correlation of p_old and p_rollout
    training/rollout_tis_clipfrac                    (with `tis_cap`) fraction of valid tokens whose
                                                     ratio exceeds the cap; not a verl metric
With no valid token every metric is NaN (verl does the same); with a single valid token the std and
the correlation are NaN (torch's definitions) instead of an error.
"""

from __future__ import annotations

import torch

from trainer.errors import ConfigError

_LOG_RATIO_BOUND = 20.0


@torch.no_grad()
def truncated_is_weights(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cap: float,
) -> torch.Tensor:
    """Token TIS weights `[N, R]` = min(exp(old - rollout), cap), detached, 0 on padding."""
    if not cap > 0:
        raise ConfigError(f"actor.tis_cap: the TIS cap must be > 0, got {cap}; 2.0 is the usual value")
    log_ratio = old_logprob.float() - rollout_logprob.float()  # [N, R]
    log_ratio = torch.clamp(log_ratio, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    weights = torch.clamp(torch.exp(log_ratio), max=cap)  # [N, R]
    return torch.where(response_mask.bool(), weights, torch.zeros_like(weights))


@torch.no_grad()
def rollout_mismatch_metrics(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tis_cap: float | None = None,
) -> dict[str, float]:
    """verl's rollout/trainer probability-difference metrics over valid tokens.

    With `tis_cap`, also `training/rollout_tis_clipfrac`: the fraction of valid tokens whose
    importance ratio exceeds the cap (how often truncation bites).
    """
    mask = response_mask.bool()
    nan = float("nan")
    if not bool(mask.any()):
        out = {
            "training/rollout_probs_diff_mean": nan,
            "training/rollout_probs_diff_max": nan,
            "training/rollout_probs_diff_std": nan,
            "training/rollout_actor_probs_pearson_corr": nan,
        }
        if tis_cap is not None:
            out["training/rollout_tis_clipfrac"] = nan
        return out
    old = old_logprob.float()[mask]  # [T_valid]
    rollout = rollout_logprob.float()[mask]  # [T_valid]
    p_old = torch.exp(old)
    p_rollout = torch.exp(rollout)
    diff = (p_old - p_rollout).abs()
    if diff.numel() > 1:
        std = float(diff.std().item())
        corr = float(torch.corrcoef(torch.stack([p_old, p_rollout]))[0, 1].item())
    else:
        std = corr = nan
    out = {
        "training/rollout_probs_diff_mean": float(diff.mean().item()),
        "training/rollout_probs_diff_max": float(diff.max().item()),
        "training/rollout_probs_diff_std": std,
        "training/rollout_actor_probs_pearson_corr": corr,
    }
    if tis_cap is not None:
        log_ratio = (old - rollout).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        out["training/rollout_tis_clipfrac"] = float((torch.exp(log_ratio) > tis_cap).float().mean().item())
    return out
