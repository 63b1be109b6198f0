"""Truncated importance sampling weights and rollout-vs-trainer probability metrics."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.mismatch import rollout_mismatch_metrics, truncated_is_weights
from trainer.errors import ConfigError

# valid tokens: p_old = [0.5, 0.2, 0.9], p_rollout = [0.25, 0.4, 0.3]; ratios 2, 0.5, 3. Last is padding.
OLD = torch.log(torch.tensor([[0.5, 0.2], [0.9, 0.7]]))
ROLLOUT = torch.log(torch.tensor([[0.25, 0.4], [0.3, 1e-30]]))
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_tis_weights_are_truncated_detached_and_zero_on_padding() -> None:
    old = OLD.clone().requires_grad_(True)
    w = truncated_is_weights(old, ROLLOUT, MASK, cap=2.5)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5], [2.5, 0.0]]))
    assert not w.requires_grad
    w_low = truncated_is_weights(OLD, ROLLOUT, MASK, cap=1.0)
    torch.testing.assert_close(w_low, torch.tensor([[1.0, 0.5], [1.0, 0.0]]))


def test_tis_cap_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="tis_cap"):
        truncated_is_weights(OLD, ROLLOUT, MASK, cap=0.0)


def test_mismatch_metrics_by_hand() -> None:
    m = rollout_mismatch_metrics(OLD, ROLLOUT, MASK, tis_cap=2.5)
    # |diff| = [0.25, 0.2, 0.6]: mean 0.35, max 0.6, unbiased std sqrt(0.095 / 2)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.35, rel=1e-5)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.6, rel=1e-5)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(math.sqrt(0.0475), rel=1e-5)
    # Pearson: cov sum -0.031667, sums of squares 0.246667 and 0.011667
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(
        -0.0316667 / math.sqrt(0.2466667 * 0.0116667), rel=1e-4
    )
    assert m["training/rollout_tis_clipfrac"] == pytest.approx(1 / 3)


def test_identical_logprobs_have_no_mismatch() -> None:
    m = rollout_mismatch_metrics(OLD, OLD.clone(), MASK)
    assert m["training/rollout_probs_diff_max"] == 0.0
    assert m["training/rollout_probs_diff_mean"] == 0.0
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert "training/rollout_tis_clipfrac" not in m


def test_no_valid_token_gives_nan() -> None:
    m = rollout_mismatch_metrics(OLD, ROLLOUT, torch.zeros(2, 2))
    assert all(math.isnan(v) for v in m.values())
