"""Per-token KL estimators between the policy and the reference policy, and the KL-in-reward penalty.

With `d = logprob - ref_logprob = log pi(y_t) - log pi_ref(y_t)` on the sampled token y_t ~ pi,
the estimators of KL(pi || pi_ref) from Schulman's note "Approximating KL divergence" (2020):

    k1  (alias kl)          d                          unbiased, high variance, can be negative
    abs                     |d|
    k2  (alias mse)         0.5 * d^2                  biased, low variance; its gradient is the
                                                       gradient of KL in expectation
    k3  (alias low_var_kl)  exp(-d) - 1 + d            unbiased, low variance, always >= 0

k3 is computed as verl does (`kl_penalty_forward`): `-d` is clamped to [-20, 20] before exp and the
result is clamped to [-10, 10].

A `+` suffix (`k1+`, `k3+`, `low_var_kl+`, ...) keeps the forward value of the named estimator and
takes the gradient of k2 (straight-through), as verl's `kl_penalty`: k1 and k3 have the right
value in expectation but not the right gradient, k2 has the right gradient.

Two ways to use them (as in verl): a KL *loss* added to the actor loss (`actor.use_kl_loss`,
usually k3 / low_var_kl, as GRPO does) or a KL penalty *in the reward* before advantages
(`algorithm.use_kl_in_reward`, PPO-style, `apply_kl_in_reward`).
"""

from __future__ import annotations

import torch

from trainer.algorithms.aggregation import masked_mean
from trainer.errors import ConfigError

# Canonical name of every accepted kind (aliases included), without the "+" suffix.
_KIND_ALIASES: dict[str, str] = {
    "k1": "k1",
    "kl": "k1",
    "abs": "abs",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
}
KL_KINDS: tuple[str, ...] = tuple(_KIND_ALIASES) + tuple(f"{k}+" for k in _KIND_ALIASES)

_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


def check_kl_kind(kind: str, *, field: str = "actor.kl_loss_type") -> str:
    """Return the canonical estimator name of `kind` (without '+'); raise ConfigError if unknown."""
    base = kind.removesuffix("+")
    if base not in _KIND_ALIASES:
        raise ConfigError(
            f"{field}: unknown KL estimator {kind!r}; use one of {', '.join(_KIND_ALIASES)} "
            "(optionally with a '+' suffix for a k2 straight-through gradient)"
        )
    return _KIND_ALIASES[base]


def _kl_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, canonical: str) -> torch.Tensor:
    diff = logprob.float() - ref_logprob.float()  # [N, R]
    if canonical == "k1":
        return diff
    if canonical == "abs":
        return diff.abs()
    if canonical == "k2":
        return 0.5 * diff.square()
    # k3: r = pi_ref / pi, KL ~ r - log r - 1
    log_r = torch.clamp(-diff, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    k3 = torch.exp(log_r) - log_r - 1.0
    return torch.clamp(k3, min=-_K3_BOUND, max=_K3_BOUND)


def kl_penalty(
    logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str, *, field: str = "actor.kl_loss_type"
) -> torch.Tensor:
    """Per-token KL estimate `[N, R]` (fp32) of kind k1|kl|abs|k2|mse|k3|low_var_kl, optionally '+'.

    Not masked: aggregate with `agg_loss(..., response_mask, ...)` or `masked_mean`.
    """
    canonical = check_kl_kind(kind, field=field)
    forward = _kl_forward(logprob, ref_logprob, canonical)
    if not kind.endswith("+") or canonical == "k2":
        return forward
    backward = 0.5 * (logprob.float() - ref_logprob.float()).square()
    return backward - backward.detach() + forward.detach()


@torch.no_grad()
def apply_kl_in_reward(
    token_scores: torch.Tensor,
    old_logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards `[N, R]` = token scores - kl_coef * KL estimate, and verl's metrics.

    verl's `apply_kl_penalty`: the penalty is `kl_coef * kl_penalty(old, ref, kind)` on every valid
    token; the logged `actor/reward_kl_penalty` is the batch mean of per-sequence token-mean KL.
    """
    kld = kl_penalty(old_logprob, ref_logprob, kind, field="algorithm.kl_penalty")
    mask = response_mask.bool()
    kld = torch.where(mask, kld, torch.zeros_like(kld))  # [N, R]
    token_rewards = token_scores.float() - kl_coef * kld  # [N, R]
    seq_kl = masked_mean(kld, mask, dim=-1)  # [N]
    return token_rewards, {
        "actor/reward_kl_penalty": float(seq_kl.mean().item()) if seq_kl.numel() else 0.0,
        "actor/reward_kl_penalty_coeff": float(kl_coef),
    }
