"""Clipped PPO policy loss (clip-higher, dual clip, TIS), clipped value loss, entropy."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.policy_loss import compute_policy_loss, compute_value_loss, entropy_from_logits
from trainer.errors import ConfigError

# Five valid tokens and one padding token, old log-prob 0 so that log-prob = log(ratio).
# clip_ratio_low = 0.2, clip_ratio_high = 0.28, clip_ratio_c = 3.
#   t1  A=+1 ratio 1.5   L1=-1.5 L2=-1.28 -> -1.28 (clipped)
#   t2  A=+1 ratio 0.5   L1=-0.5 L2=-0.8  -> -0.5
#   t3  A=-1 ratio 0.5   L1=0.5  L2=0.8   -> 0.8   (clipped), dual bound 3 not active
#   t4  A=-1 ratio 10    L1=10   L2=1.28  -> 10, dual clip -> min(10, 3) = 3 (clipfrac_lower)
#   t5  A=+2 ratio 1     -> -2
#   pad A=5  ratio 100   ignored
RATIO = torch.tensor([[1.5, 0.5, 0.5], [10.0, 1.0, 100.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 2.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.zeros(2, 3)
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}


def test_known_example_loss_and_metrics() -> None:
    loss, m = compute_policy_loss(OLD, torch.log(RATIO), ADV, MASK, **CLIP, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0 - 2.0) / 5, abs=1e-6)  # 0.004
    assert m["actor/pg_loss"].item() == pytest.approx(loss.item())
    assert m["actor/pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert m["actor/pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    # ppo_kl = mean(old - new) = -(ln 1.5 + ln 0.5 + ln 0.5 + ln 10 + 0) / 5
    expected_kl = -(math.log(1.5) + 2 * math.log(0.5) + math.log(10.0)) / 5
    assert m["actor/ppo_kl"].item() == pytest.approx(expected_kl, rel=1e-5)
    assert set(m) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


def test_dual_clip_bounds_negative_advantage_with_huge_ratio_and_stops_its_gradient() -> None:
    logp = torch.log(RATIO).requires_grad_(True)
    loss, _ = compute_policy_loss(OLD, logp, ADV, MASK, **CLIP, clip_ratio_c=3.0)
    loss.backward()
    grad = logp.grad
    assert grad[1, 0].item() == 0.0  # t4: dual-clipped, constant -A*c
    assert grad[0, 0].item() == 0.0  # t1: clipped above
    assert grad[0, 1].item() == pytest.approx(-1.0 * 0.5 / 5)  # t2: d(-A*ratio)/dlogp = -A*ratio, / 5 tokens
    assert grad[1, 2].item() == 0.0  # padding

    loss_nodual, m = compute_policy_loss(OLD, torch.log(RATIO), ADV, MASK, **CLIP, clip_ratio_c=None)
    assert loss_nodual.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 10.0 - 2.0) / 5, abs=1e-6)
    assert m["actor/pg_clipfrac_lower"].item() == 0.0


def test_clip_higher_is_asymmetric() -> None:
    one = torch.ones(1, 1)
    # ratio 1.25, A > 0: inside [0.8, 1.28] -> not clipped; with symmetric 0.2 it is clipped at 1.2
    up = torch.log(torch.tensor([[1.25]]))
    asym, m_asym = compute_policy_loss(torch.zeros(1, 1), up, one, one, **CLIP)
    sym, m_sym = compute_policy_loss(torch.zeros(1, 1), up, one, one, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert asym.item() == pytest.approx(-1.25) and m_asym["actor/pg_clipfrac"].item() == 0.0
    assert sym.item() == pytest.approx(-1.2) and m_sym["actor/pg_clipfrac"].item() == 1.0
    # ratio 0.75, A < 0: the low side still clips at 0.8 -> loss max(0.75, 0.8) = 0.8
    down = torch.log(torch.tensor([[0.75]]))
    low, m_low = compute_policy_loss(torch.zeros(1, 1), down, -one, one, **CLIP)
    assert low.item() == pytest.approx(0.8) and m_low["actor/pg_clipfrac"].item() == 1.0


def test_on_policy_has_zero_kl_and_clipfrac() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 6, generator=gen) * 3
    adv = torch.randn(4, 6, generator=gen)
    mask = (torch.arange(6) < torch.tensor([6, 3, 1, 4])[:, None]).float()
    loss, m = compute_policy_loss(logp, logp.clone(), adv, mask, **CLIP)
    assert m["actor/ppo_kl"].item() == 0.0
    assert m["actor/pg_clipfrac"].item() == 0.0
    assert m["actor/pg_clipfrac_lower"].item() == 0.0
    # ratio 1 everywhere: loss = -token-mean(A)
    assert loss.item() == pytest.approx(-(adv * mask).sum().item() / mask.sum().item(), rel=1e-5)


def test_tis_weights_multiply_the_per_token_loss() -> None:
    w = torch.tensor([[2.0, 1.0, 1.0], [0.5, 1.0, 99.0]])
    loss, _ = compute_policy_loss(OLD, torch.log(RATIO), ADV, MASK, **CLIP, tis_weights=w)
    assert loss.item() == pytest.approx((-2.56 - 0.5 + 0.8 + 1.5 - 2.0) / 5, abs=1e-6)  # -0.552


def test_aggregation_mode_and_global_counts_are_forwarded() -> None:
    loss, _ = compute_policy_loss(
        OLD, torch.log(RATIO), ADV, MASK, **CLIP, loss_agg_mode="seq-mean-token-sum", global_num_seqs=4
    )
    assert loss.item() == pytest.approx(((-1.28 - 0.5 + 0.8) + (3.0 - 2.0)) / 4, abs=1e-6)


def test_bad_clip_settings_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        compute_policy_loss(OLD, OLD, ADV, MASK, **CLIP, clip_ratio_c=1.0)
    with pytest.raises(ConfigError, match="clip_ratio_low"):
        compute_policy_loss(OLD, OLD, ADV, MASK, clip_ratio_low=1.0, clip_ratio_high=0.2)


def test_value_loss_by_hand() -> None:
    # cliprange 0.2:
    #   t1 v=1, old 0.5 -> clipped 0.7; R=2: (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 1.69 (clipped term wins)
    #   t2 v=2, old 0.5 -> clipped 0.7; R=0: 4 vs 0.49 -> 4
    #   t3 v=0, old 0   -> 0; R=1: 1 vs 1 -> 1
    #   padding ignored
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 50.0]])
    old = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 1.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = compute_value_loss(vpreds, old, returns, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 4.0 + 1.0) / 3)  # 1.115
    assert m["critic/vf_loss"].item() == pytest.approx(loss.item())
    assert m["critic/vf_clipfrac"].item() == pytest.approx(1 / 3)


def test_entropy_by_hand_and_stable() -> None:
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    probs = torch.tensor([0.5, 0.25, 0.25])
    assert entropy_from_logits(torch.log(probs) + 7.0).item() == pytest.approx(1.5 * math.log(2), rel=1e-6)
    assert entropy_from_logits(torch.tensor([1000.0, 1000.0])).item() == pytest.approx(math.log(2))
    logits = torch.tensor([[0.0, float("-inf"), 0.0]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h.shape == (1,) and h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert entropy_from_logits(torch.zeros(2, 5, 8, dtype=torch.bfloat16)).dtype == torch.float32
