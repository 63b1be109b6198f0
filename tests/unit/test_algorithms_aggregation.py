"""Loss aggregation modes: hand-computed values with padding, and global-count invariance."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.aggregation import (
    LOSS_AGG_MODES,
    agg_loss,
    global_counts,
    masked_mean,
    masked_whiten,
)
from trainer.errors import ConfigError

NAN, INF = float("nan"), float("inf")

# Row 0: 3 valid tokens (sum 6, mean 2); row 1: 2 valid tokens (sum 9, mean 4.5) with inf/NaN in
# its padding; row 2: fully masked (must not count as a sequence).
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, NAN, INF], [7.0, 7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 15.0 / 5.0),  # (1+2+3+4+5) / 5 tokens
        ("seq-mean-token-sum", (6.0 + 9.0) / 2.0),  # 2 non-empty sequences
        ("seq-mean-token-mean", (2.0 + 4.5) / 2.0),
        ("seq-mean-token-sum-norm", (6.0 + 9.0) / 2.0 / 4.0),  # horizon = R = 4
    ],
)
def test_modes_by_hand_with_padding(mode: str, expected: float) -> None:
    out = agg_loss(LOSS, MASK, mode)
    assert out.dim() == 0 and out.dtype == torch.float32
    assert out.item() == pytest.approx(expected, rel=1e-6)


def test_seq_mean_token_sum_norm_constant_horizon() -> None:
    out = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", horizon=10)
    assert out.item() == pytest.approx(7.5 / 10.0)


def test_bool_mask_and_bf16_losses_give_the_same_value() -> None:
    loss_bf16 = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 0.0, 0.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    assert agg_loss(loss_bf16, mask, "token-mean").item() == pytest.approx(3.0)
    assert agg_loss(loss_bf16, mask, "token-mean").dtype == torch.float32


def test_global_counts_override_local_ones() -> None:
    assert agg_loss(LOSS, MASK, "token-mean", global_num_tokens=10).item() == pytest.approx(1.5)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_num_seqs=5).item() == pytest.approx(3.0)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", global_num_seqs=13).item() == pytest.approx(0.5)


def test_empty_micro_batch_gives_zero_not_nan() -> None:
    empty = torch.zeros(2, 3)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(torch.ones(2, 3), empty, mode).item() == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_summing_micro_batches_with_global_counts_gives_the_full_batch_loss(mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    num_seqs, resp_len = 12, 7
    loss = torch.randn(num_seqs, resp_len, generator=gen)
    lengths = torch.tensor([7, 1, 3, 0, 5, 2, 7, 4, 6, 1, 0, 3])  # uneven, two empty sequences
    mask = (torch.arange(resp_len) < lengths[:, None]).float()
    loss = torch.where(mask.bool(), loss, torch.full_like(loss, INF))  # garbage in padding
    full = agg_loss(loss, mask, mode)
    counts = global_counts(mask)
    assert counts == {"global_num_tokens": float(lengths.sum()), "global_num_seqs": 10.0}

    # 2 "workers" x uneven micro-batches.
    splits = [(0, 1), (1, 4), (4, 6), (6, 11), (11, 12)]
    total = sum(
        agg_loss(loss[a:b], mask[a:b], mode, **counts, horizon=resp_len) for a, b in splits
    )
    assert total.item() == pytest.approx(full.item(), rel=1e-5, abs=1e-6)

    # Without global counts, averaging local results is not the full-batch loss here.
    local_avg = sum(agg_loss(loss[a:b], mask[a:b], mode) for a, b in splits) / len(splits)
    assert not math.isclose(local_avg.item(), full.item(), rel_tol=1e-3)


def test_unknown_mode_raises_one_line_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        agg_loss(LOSS, MASK, "token-sum-weird")
    msg = str(err.value)
    assert "loss_agg_mode" in msg and "seq-mean-token-sum-norm" in msg and "\n" not in msg


def test_masked_mean_and_whiten_by_hand() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    # mean 2, unbiased var ((1)^2 + 0 + 1^2) / 2 = 1
    white = masked_whiten(values, mask)
    scale = 1.0 / math.sqrt(1.0 + 1e-8)
    assert white[0, :3].tolist() == pytest.approx([-scale, 0.0, scale], abs=1e-6)
    assert masked_whiten(values, mask, shift_mean=False)[0, :3].tolist() == pytest.approx(
        [2.0 - scale, 2.0, 2.0 + scale], abs=1e-6
    )
