"""GRPO / Dr.GRPO / RLOO / GAE advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
    scores_to_token_rewards,
)
from trainer.errors import ConfigError

EPS = 1e-6


def _mask(lengths: list[int], resp_len: int) -> torch.Tensor:
    return (torch.arange(resp_len) < torch.tensor(lengths)[:, None]).float()


def test_grpo_std_normalized_binary_group() -> None:
    # One group of 4: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3).
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = _mask([3, 2, 1, 3], 3)
    adv, ret = compute_grpo_advantages(scores, torch.tensor([5, 5, 5, 5]), mask)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)  # 0.866025
    expected = torch.tensor([a, -a, a, -a])[:, None] * mask
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_grpo_interleaved_groups_of_three() -> None:
    # group 10 = [0, 1, 2]: mean 1, std 1; group 3 = [1, 2, 6]: mean 3, var (4+1+9)/2 = 7.
    scores = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 6.0])
    groups = torch.tensor([10, 3, 10, 3, 10, 3])
    mask = torch.ones(6, 2)
    adv, _ = compute_grpo_advantages(scores, groups, mask)
    s7 = math.sqrt(7.0) + EPS
    expected = [-1 / (1 + EPS), -2 / s7, 0.0, -1 / s7, 1 / (1 + EPS), 3 / s7]
    assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
    assert adv[:, 1].tolist() == pytest.approx(expected, rel=1e-5)


def test_dr_grpo_does_not_divide_by_std() -> None:
    scores = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 6.0])
    groups = torch.tensor([10, 3, 10, 3, 10, 3])
    adv, _ = compute_grpo_advantages(scores, groups, torch.ones(6, 1), norm_by_std=False)
    assert adv[:, 0].tolist() == pytest.approx([-1.0, -2.0, 0.0, -1.0, 1.0, 3.0], abs=1e-6)


def test_size_one_groups_use_mean_zero_std_one_like_verl() -> None:
    scores = torch.tensor([3.0, 1.0, 0.0])
    groups = torch.tensor([0, 1, 1])
    mask = torch.ones(3, 2)
    adv, _ = compute_grpo_advantages(scores, groups, mask)
    assert adv[0].tolist() == pytest.approx([3.0 / (1.0 + EPS)] * 2)
    adv_dr, _ = compute_grpo_advantages(scores, groups, mask, norm_by_std=False)
    assert adv_dr[0].tolist() == pytest.approx([3.0, 3.0])
    assert adv_dr[1:, 0].tolist() == pytest.approx([0.5, -0.5])


def test_all_equal_group_has_zero_advantage() -> None:
    groups = torch.zeros(3, dtype=torch.long)
    adv, _ = compute_grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), groups, torch.ones(3, 4))
    assert torch.count_nonzero(adv) == 0


def test_rloo_leave_one_out_by_hand() -> None:
    # group [1, 2, 6]: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; singleton keeps its score.
    scores = torch.tensor([1.0, 2.0, 6.0, 5.0])
    groups = torch.tensor([0, 0, 0, 9])
    mask = _mask([2, 1, 2, 2], 2)
    adv, ret = compute_rloo_advantages(scores, groups, mask)
    expected = torch.tensor([[-3.0, -3.0], [-1.5, 0.0], [4.5, 4.5], [5.0, 5.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


# GAE, gamma = 0.9, lam = 0.8 (gamma * lam = 0.72). By hand:
# row 0, mask [1,1,1], r = [0,0,1], V = [0.5,0.4,0.3]
#   t2: delta = 1 - 0.3 = 0.7                       A2 = 0.7
#   t1: delta = 0.9*0.3 - 0.4 = -0.13               A1 = -0.13 + 0.72*0.7   = 0.374
#   t0: delta = 0.9*0.4 - 0.5 = -0.14               A0 = -0.14 + 0.72*0.374 = 0.12928
# row 1, mask [1,1,0] (padding, garbage value 9.9), r = [0,1,0], V = [0.2,0.6,9.9]
#   t1: delta = 1 - 0.6 = 0.4                       A1 = 0.4
#   t0: delta = 0.9*0.6 - 0.2 = 0.34                A0 = 0.34 + 0.72*0.4 = 0.628
# row 2, mask [1,0,1] (an observation token in the middle is skipped), r = [0,0,1], V = [0.5,7,0.3]
#   t2: A2 = 0.7, next value 0.3 carried over t1
#   t0: delta = 0.9*0.3 - 0.5 = -0.23               A0 = -0.23 + 0.72*0.7 = 0.274
GAE_R = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
GAE_V = torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.6, 9.9], [0.5, 7.0, 0.3]])
GAE_M = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
GAE_RAW = torch.tensor([[0.12928, 0.374, 0.7], [0.628, 0.4, 0.0], [0.274, 0.0, 0.7]])


def test_gae_by_hand_without_whitening() -> None:
    adv, ret = compute_gae_advantages(GAE_R, GAE_V, GAE_M, gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, GAE_RAW, atol=1e-6, rtol=0)
    expected_ret = (GAE_RAW + GAE_V) * GAE_M  # [[0.62928, 0.774, 1.0], [0.828, 1.0, 0], [0.774, 0, 1.0]]
    torch.testing.assert_close(ret, expected_ret, atol=1e-6, rtol=0)
    assert ret[0].tolist() == pytest.approx([0.62928, 0.774, 1.0], abs=1e-6)


def test_gae_whitens_over_valid_tokens_only() -> None:
    adv, ret = compute_gae_advantages(GAE_R, GAE_V, GAE_M, gamma=0.9, lam=0.8)
    valid = [0.12928, 0.374, 0.7, 0.628, 0.4, 0.274, 0.7]
    mean = sum(valid) / 7
    var = sum((v - mean) ** 2 for v in valid) / 6
    expected = (GAE_RAW - mean) / math.sqrt(var + 1e-8) * GAE_M
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv[1, 2].item() == 0.0 and adv[2, 1].item() == 0.0
    # returns are computed before whitening
    assert ret[0].tolist() == pytest.approx([0.62928, 0.774, 1.0], abs=1e-6)


def test_gae_gamma_lam_one_is_return_to_go_minus_value() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 0.25, 1.0]])
    adv, ret = compute_gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0, whiten=False)
    assert adv[0].tolist() == pytest.approx([6.0 - 0.5, 5.0 - 0.25, 3.0 - 1.0])
    assert ret[0].tolist() == pytest.approx([6.0, 5.0, 3.0])


def test_scores_go_on_the_last_valid_token() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    out = scores_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))


def test_dispatch_by_config_name() -> None:
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 2)
    dr, _ = compute_advantages("grpo", mask, scores=scores, group_index=groups, norm_adv_by_std_in_grpo=False)
    assert dr[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    rloo, _ = compute_advantages("rloo", mask, scores=scores, group_index=groups)
    assert rloo[:, 0].tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])
    # gae from scores: the score lands on the last token; V = 0, gamma = lam = 1 -> raw A = score everywhere
    adv, ret = compute_advantages("gae", mask, scores=scores, values=torch.zeros(4, 2), gamma=1.0, lam=1.0)
    assert ret[:, 0].tolist() == pytest.approx([1.0, 0.0, 2.0, 2.0])
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "rloo", "gae"}
    assert ADVANTAGE_ESTIMATORS["gae"].needs_critic and not ADVANTAGE_ESTIMATORS["grpo"].needs_critic


def test_unknown_estimator_names_the_field() -> None:
    with pytest.raises(ConfigError, match="adv_estimator"):
        compute_advantages("remax", torch.ones(1, 1), scores=torch.ones(1), group_index=torch.zeros(1))
