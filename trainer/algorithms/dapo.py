"""DAPO's dynamic sampling filter and soft overlong punishment (Yu et al. 2025, "DAPO").

Dynamic sampling. A group whose responses all got the same score has zero GRPO advantage for
every token, so it adds no gradient but dilutes the batch. DAPO drops such groups and keeps
sampling until the batch is full. `dynamic_sampling_keep` returns the per-response keep mask;
it is verl's `algorithm.filter_groups` with `metric: score` (`seq_final_reward`, the sum of the
token rewards). verl keeps a group if its scores have std > 0 *or* it has a single response;
a singleton group is kept here too (`keep_singletons=True`), since its GRPO advantage is the
score itself (mu = 0, sigma = 1), not zero.

Soft overlong punishment. With L_max the maximum response length, L_buf the buffer and |y| the
response length, the length reward added to the task score is (DAPO eq. 13):

    R_len(y) = 0                                   if |y| <= L_max - L_buf
             = ((L_max - L_buf) - |y|) / L_buf * p  if L_max - L_buf < |y| <= L_max

i.e. 0 up to the expected length, then linearly down to -p at |y| = L_max. This is verl's DAPO
reward manager: `min(-(|y| - (L_max - L_buf)) / L_buf * p, 0)`. As there, no floor is applied
beyond L_max (responses cannot be longer than L_max).
"""

from __future__ import annotations

import torch

from trainer.errors import ConfigError


def dynamic_sampling_keep(
    scores: torch.Tensor, group_index: torch.Tensor, *, keep_singletons: bool = True
) -> torch.Tensor:
    """Keep mask `[N]` (bool): True for responses whose group's scores are not all equal.

    Args:
        scores: `[N]` scalar score of each response.
        group_index: `[N]` group (prompt) id of each response, any integers.
        keep_singletons: keep groups of one response (verl's behaviour).
    """
    assert scores.dim() == 1 and group_index.shape == scores.shape, "scores and group_index must both be [N]"
    scores = scores.float()
    uniq, dense = torch.unique(group_index, return_inverse=True)
    num_groups = int(uniq.numel())
    g_max = torch.full((num_groups,), float("-inf"), device=scores.device).scatter_reduce(
        0, dense, scores, reduce="amax"
    )  # [G]
    g_min = torch.full((num_groups,), float("inf"), device=scores.device).scatter_reduce(
        0, dense, scores, reduce="amin"
    )  # [G]
    count = torch.zeros(num_groups, device=scores.device).index_add_(0, dense, torch.ones_like(scores))  # [G]
    keep_g = g_max > g_min  # [G], std > 0  <=>  not all equal
    if keep_singletons:
        keep_g = keep_g | (count == 1)
    return keep_g[dense]


def overlong_reward_penalty(
    response_lengths: torch.Tensor,
    *,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float,
) -> torch.Tensor:
    """DAPO soft overlong punishment `[N]` (fp32, <= 0) for response lengths `[N]`; add it to the score."""
    if max_response_length <= 0:
        raise ConfigError(f"data.max_response_length: must be > 0, got {max_response_length}")
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ConfigError(
            f"algorithm.overlong_buffer.len: must be in (0, data.max_response_length={max_response_length}], "
            f"got {overlong_buffer_len}; DAPO uses 4096 with max_response_length 20480"
        )
    if penalty_factor < 0:
        raise ConfigError(
            f"algorithm.overlong_buffer.penalty_factor: must be >= 0, got {penalty_factor}; DAPO uses 1.0"
        )
    expected_len = max_response_length - overlong_buffer_len
    exceed = response_lengths.float() - expected_len  # [N]
    return torch.clamp(-exceed / overlong_buffer_len * penalty_factor, max=0.0)
