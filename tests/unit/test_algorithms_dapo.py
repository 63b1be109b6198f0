"""DAPO dynamic sampling (group filter) and soft overlong punishment."""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms.dapo import dynamic_sampling_keep, overlong_reward_penalty
from trainer.errors import ConfigError


def test_dynamic_sampling_drops_groups_with_equal_scores() -> None:
    # group 0 all 1 (drop), group 1 mixed (keep), group 2 all 0 (drop), group 3 single (kept, as verl)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 1, 0, 0, 1, 1, 2, 2, 3])
    keep = dynamic_sampling_keep(scores, groups)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, False, False, True, True, False, False, True]
    no_single = dynamic_sampling_keep(scores, groups, keep_singletons=False)
    assert no_single.tolist() == [False, True, False, False, True, True, False, False, False]


def test_dynamic_sampling_with_large_sparse_group_ids_and_fractional_scores() -> None:
    scores = torch.tensor([0.5, 0.5, -1.0, 0.25])
    groups = torch.tensor([10**12, 10**12, 7, 7])
    assert dynamic_sampling_keep(scores, groups).tolist() == [False, False, True, True]


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (10, 0.0),  # well inside
        (16, 0.0),  # exactly max - buffer: no penalty
        (17, -0.25),  # 1 token into the 4-token buffer
        (18, -0.5),
        (20, -1.0),  # at max_response_length: -penalty_factor
    ],
)
def test_overlong_penalty_at_the_boundaries(length: int, expected: float) -> None:
    out = overlong_reward_penalty(
        torch.tensor([length]), max_response_length=20, overlong_buffer_len=4, penalty_factor=1.0
    )
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(expected)


def test_overlong_penalty_scales_with_factor() -> None:
    out = overlong_reward_penalty(
        torch.tensor([16, 18, 20]), max_response_length=20, overlong_buffer_len=4, penalty_factor=0.5
    )
    assert out.tolist() == pytest.approx([0.0, -0.25, -0.5])


def test_overlong_bad_settings_raise_config_error() -> None:
    lengths = torch.tensor([1])
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        overlong_reward_penalty(lengths, max_response_length=20, overlong_buffer_len=0, penalty_factor=1.0)
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        overlong_reward_penalty(lengths, max_response_length=20, overlong_buffer_len=21, penalty_factor=1.0)
    with pytest.raises(ConfigError, match="penalty_factor"):
        overlong_reward_penalty(lengths, max_response_length=20, overlong_buffer_len=4, penalty_factor=-1.0)
