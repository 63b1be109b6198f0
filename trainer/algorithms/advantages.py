"""Advantage estimators: GRPO, Dr.GRPO, RLOO (critic-free, outcome reward) and GAE (with a critic).

Outcome estimators take one scalar score per response, `scores[i]`, and the group (prompt) of each
response, `group_index[i]`. For a group g with n_g responses, mean mu_g and unbiased std sigma_g:

    GRPO     (Shao et al. 2024, DeepSeekMath)   A_i = (r_i - mu_g) / (sigma_g + eps)
    Dr.GRPO  (Liu et al. 2025)                  A_i =  r_i - mu_g          (no std division; the
             selected by `norm_by_std=False`, verl's `norm_adv_by_std_in_grpo: false`)
    RLOO     (Kool et al. 2019; Ahmadian et al. 2024)
                                                A_i = r_i - mean_{j != i} r_j = n_g/(n_g-1) (r_i - mu_g)

The scalar is broadcast over the response tokens and zeroed on padding: `A[i, t] = A_i * m[i, t]`.
Returns equal advantages for these estimators (there is no critic).

Groups of one response, as in verl: GRPO/Dr.GRPO use mu = 0 and sigma = 1 (so A = r / (1 + eps)
or A = r); RLOO leaves the score as is (A = r). verl's `rloo_vectorized` gives 0 there instead;
this follows verl's `rloo`, the one registered under that name.

GAE (Schulman et al. 2016), token-level rewards r_t and critic values V_t, for valid tokens only
(masked tokens, e.g. tool observations, are skipped: they neither receive nor break the recursion):

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}
    returns_t = A_t + V_t                       (before whitening)
    A       = masked_whiten(A)                  (batch mean 0, unit variance over valid tokens)

This is verl's `compute_gae_advantage_return`. Departure: advantages and returns are zeroed on
masked positions (verl leaves carried-over values there; every loss masks them anyway).

The math runs in fp32 under `torch.no_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.algorithms.aggregation import masked_whiten
from trainer.errors import ConfigError


def _dense_groups(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids `[N]` to 0..G-1; return (dense ids `[N]`, G)."""
    uniq, dense = torch.unique(group_index, return_inverse=True)
    return dense, int(uniq.numel())


def group_mean_std(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-response group statistics: (mean `[N]`, unbiased std `[N]`, group size `[N]`).

    Groups of size 1 get mean 0 and std 1 (verl's convention).
    """
    scores = scores.float()
    dense, num_groups = _dense_groups(group_index)
    count = torch.zeros(num_groups, dtype=torch.float32, device=scores.device)
    count.index_add_(0, dense, torch.ones_like(scores))  # [G]
    total = torch.zeros_like(count).index_add_(0, dense, scores)  # [G]
    mean_g = total / count  # [G]
    sq_dev = (scores - mean_g[dense]) ** 2  # [N]
    ss_g = torch.zeros_like(count).index_add_(0, dense, sq_dev)  # [G]
    std_g = torch.sqrt(ss_g / (count - 1).clamp(min=1.0))  # [G]
    single = count == 1
    mean_g = torch.where(single, torch.zeros_like(mean_g), mean_g)
    std_g = torch.where(single, torch.ones_like(std_g), std_g)
    return mean_g[dense], std_g[dense], count[dense]


def _check_scores(scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor) -> None:
    assert scores.dim() == 1, f"scores must be [N], got {tuple(scores.shape)}"
    assert group_index.shape == scores.shape, "group_index must be [N] like scores"
    assert response_mask.dim() == 2, "response_mask must be [N, R]"
    assert response_mask.shape[0] == scores.shape[0], "response_mask must have one row per score"


@torch.no_grad()
def compute_grpo_advantages(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (norm_by_std=True) or Dr.GRPO (False) advantages; returns (adv `[N, R]`, returns `[N, R]`)."""
    _check_scores(scores, group_index, response_mask)
    mean, std, _ = group_mean_std(scores, group_index)  # [N] each
    adv = scores.float() - mean  # [N]
    if norm_by_std:
        adv = adv / (std + eps)
    adv_tok = adv.unsqueeze(-1) * response_mask.float()  # [N, R]
    return adv_tok, adv_tok.clone()


@torch.no_grad()
def compute_rloo_advantages(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO leave-one-out advantages; returns (adv `[N, R]`, returns `[N, R]`).

    `eps` is unused; it keeps the signature of `compute_grpo_advantages`.
    """
    _check_scores(scores, group_index, response_mask)
    mean, _, count = group_mean_std(scores, group_index)  # [N] each
    scores = scores.float()
    scale = count / (count - 1).clamp(min=1.0)  # [N], n/(n-1)
    adv = torch.where(count > 1, scale * (scores - mean), scores)  # [N]
    adv_tok = adv.unsqueeze(-1) * response_mask.float()  # [N, R]
    return adv_tok, adv_tok.clone()


@torch.no_grad()
def compute_gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over `[N, R]` token rewards and values; returns (whitened adv `[N, R]`, returns `[N, R]`)."""
    assert token_rewards.shape == values.shape == response_mask.shape, "rewards, values, mask must be [N, R]"
    rewards = token_rewards.float()
    vals = values.float()
    mask = response_mask.float()
    num_seqs, resp_len = rewards.shape
    next_value = torch.zeros(num_seqs, dtype=torch.float32, device=rewards.device)  # [N]
    last_gae = torch.zeros_like(next_value)  # [N]
    adv = torch.zeros_like(rewards)  # [N, R]
    for t in reversed(range(resp_len)):
        m_t = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        gae_t = delta + gamma * lam * last_gae
        # Masked tokens keep the running values, so the recursion jumps over them.
        next_value = m_t * vals[:, t] + (1.0 - m_t) * next_value
        last_gae = m_t * gae_t + (1.0 - m_t) * last_gae
        adv[:, t] = last_gae
    returns = (adv + vals) * mask  # [N, R]
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv * mask, returns


def scores_to_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each response's scalar score on its last valid token: `[N]` -> `[N, R]` (verl's layout).

    Responses without a valid token get all zeros.
    """
    mask = response_mask.bool()  # [N, R]
    num_seqs, resp_len = mask.shape
    positions = torch.arange(resp_len, device=mask.device).expand(num_seqs, resp_len)  # [N, R]
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=-1).values  # [N]
    out = torch.zeros(num_seqs, resp_len, dtype=torch.float32, device=mask.device)
    has = last >= 0
    rows = torch.arange(num_seqs, device=mask.device)[has]
    out[rows, last[has]] = scores.float()[has]
    return out


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: its function and whether it needs a critic (values)."""

    name: str
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    needs_critic: bool


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": AdvantageEstimator("grpo", compute_grpo_advantages, needs_critic=False),
    "rloo": AdvantageEstimator("rloo", compute_rloo_advantages, needs_critic=False),
    "gae": AdvantageEstimator("gae", compute_gae_advantages, needs_critic=True),
}


def get_advantage_estimator(name: str, *, field: str = "algorithm.adv_estimator") -> AdvantageEstimator:
    """Look an estimator up by its config name; unknown names raise a one-line ConfigError."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ConfigError(
            f"{field}: unknown advantage estimator {name!r}; use one of {', '.join(ADVANTAGE_ESTIMATORS)}"
        )
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(
    adv_estimator: str,
    response_mask: torch.Tensor,
    *,
    scores: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    token_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch on the config's `adv_estimator` (`grpo | rloo | gae`), as verl's `compute_advantage`.

    grpo/rloo need `scores` `[N]` and `group_index` `[N]`; `norm_adv_by_std_in_grpo=False` turns
    grpo into Dr.GRPO. gae needs `values` `[N, R]` and either `token_rewards` `[N, R]` (which
    may already hold a KL-in-reward penalty) or `scores`, which are put on the last valid token.
    """
    est = get_advantage_estimator(adv_estimator)
    if not est.needs_critic:
        assert scores is not None and group_index is not None, f"{est.name} needs scores and group_index"
        if est.name == "grpo":
            return compute_grpo_advantages(
                scores, group_index, response_mask, norm_by_std=norm_adv_by_std_in_grpo, eps=eps
            )
        return compute_rloo_advantages(scores, group_index, response_mask, eps=eps)
    assert values is not None, "gae needs critic values"
    if token_rewards is None:
        assert scores is not None, "gae needs token_rewards or scores"
        token_rewards = scores_to_token_rewards(scores, response_mask)
    return compute_gae_advantages(token_rewards, values, response_mask, gamma=gamma, lam=lam)
