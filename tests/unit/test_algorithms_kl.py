"""KL estimators k1/abs/k2/k3 (and aliases, straight-through '+') and the KL-in-reward penalty."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.kl import KL_KINDS, apply_kl_in_reward, kl_penalty
from trainer.errors import ConfigError

LN2 = math.log(2.0)
# token 0: pi = 0.5, pi_ref = 0.25 (d = +ln 2); token 1: pi = 0.25, pi_ref = 0.5 (d = -ln 2)
LOGP = torch.log(torch.tensor([[0.5, 0.25]]))
REF = torch.log(torch.tensor([[0.25, 0.5]]))


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("k1", "kl"), [LN2, -LN2]),
        (("abs",), [LN2, LN2]),
        (("k2", "mse"), [0.5 * LN2**2, 0.5 * LN2**2]),  # 0.240227
        # k3 = r - log r - 1 with r = pi_ref / pi: r = 0.5 -> 0.193147, r = 2 -> 0.306853
        (("k3", "low_var_kl"), [0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0]),
    ],
)
def test_estimators_by_hand(kinds: tuple[str, ...], expected: list[float]) -> None:
    for kind in kinds:
        out = kl_penalty(LOGP, REF, kind)
        assert out.shape == (1, 2) and out.dtype == torch.float32
        assert out[0].tolist() == pytest.approx(expected, rel=1e-5)


def test_identical_policies_give_zero_for_every_kind() -> None:
    logp = torch.log(torch.tensor([[0.1, 0.7, 0.2]]))
    for kind in KL_KINDS:
        assert torch.count_nonzero(kl_penalty(logp, logp, kind)) == 0


def test_k3_is_clamped_to_ten() -> None:
    # ref much more likely than pi: -d = 30 -> clamped to 20 -> exp(20) - 21 -> clamped to 10
    out = kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "low_var_kl")
    assert out.item() == 10.0


def test_plus_suffix_keeps_value_and_takes_k2_gradient() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    out = kl_penalty(logp, REF, "k3+")
    assert out[0].tolist() == pytest.approx([0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0], rel=1e-5)
    out.sum().backward()
    # d/dlogp of 0.5 * (logp - ref)^2 = logp - ref
    assert logp.grad[0].tolist() == pytest.approx([LN2, -LN2], rel=1e-5)


def test_unknown_kind_raises_config_error() -> None:
    for kind in ("full", "k4", ""):
        with pytest.raises(ConfigError, match="kl_loss_type"):
            kl_penalty(LOGP, REF, kind)


def test_kl_in_reward_by_hand() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ref = torch.zeros(2, 3)
    old = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])  # k1 = old - ref; 9.0 is padding
    rewards, metrics = apply_kl_in_reward(scores, old, ref, mask, kl_coef=0.5, kind="kl")
    expected = torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]])
    torch.testing.assert_close(rewards, expected)
    # per-sequence token-mean KL: 0.2 and 0.45 -> batch mean 0.325
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.325)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
