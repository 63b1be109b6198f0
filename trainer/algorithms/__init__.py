"""RL algorithm functions: advantages, policy/value losses, KL estimators, loss aggregation,
DAPO's dynamic sampling and overlong shaping, and rollout/trainer mismatch correction (TIS).

Pure torch functions over response-level tensors `[N, R]` (N sequences, R = max response length,
right padded) with a `response_mask` `[N, R]` that is 1 on real response tokens. Definitions follow
verl (`verl/trainer/ppo/core_algos.py`); each module's docstring gives the math, the paper and any
departure.

May import: `trainer.errors` only (the layer just above the errors; `trainer.config` imports it).
"""

from __future__ import annotations

from trainer.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    compute_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
    get_advantage_estimator,
    group_mean_std,
    scores_to_token_rewards,
)
from trainer.algorithms.aggregation import (
    LOSS_AGG_MODES,
    agg_loss,
    check_loss_agg_mode,
    global_counts,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from trainer.algorithms.dapo import dynamic_sampling_keep, overlong_reward_penalty
from trainer.algorithms.kl import KL_KINDS, apply_kl_in_reward, check_kl_kind, kl_penalty
from trainer.algorithms.mismatch import rollout_mismatch_metrics, truncated_is_weights
from trainer.algorithms.policy_loss import compute_policy_loss, compute_value_loss, entropy_from_logits

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "AdvantageEstimator",
    "agg_loss",
    "apply_kl_in_reward",
    "check_kl_kind",
    "check_loss_agg_mode",
    "compute_advantages",
    "compute_gae_advantages",
    "compute_grpo_advantages",
    "compute_policy_loss",
    "compute_rloo_advantages",
    "compute_value_loss",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "get_advantage_estimator",
    "global_counts",
    "group_mean_std",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_reward_penalty",
    "rollout_mismatch_metrics",
    "scores_to_token_rewards",
    "truncated_is_weights",
]
