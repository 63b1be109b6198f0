"""`trainer.modes.steps.collect_scored_batch`: DAPO dynamic sampling shared by the single-process and Ray loops."""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.components.batch import Batch, batch_from_rollout
from trainer.config import TrainerConfig
from trainer.modes.steps import collect_scored_batch
from trainer.rollout.base import Rollout


def _cfg(*, dynamic: bool, want: int = 4, cap: int = 4) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": {"path": "tiny:qwen2"}, "data": {"train_files": "synthetic:arithmetic-easy", "train_batch_size": want},
        "rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2}, "algorithm": {"dynamic_sampling": dynamic, "max_num_gen_batches": cap}})


def _calls(score_lists: list[list[float]]) -> tuple[Callable[[], Batch], list[int]]:
    """A fake generate call per entry: groups of 2 responses with the given scores; response token 0 of
    row i is `100 * call + i` so the test can tell which rows were kept."""
    count = [0]

    def next_scored() -> Batch:
        k = count[0]
        scores = score_lists[k]
        count[0] += 1
        rows = len(scores)
        rollout = Rollout(prompt_ids=[[1, 2]] * rows, response_ids=[[100 * k + i, 3] for i in range(rows)],
                          response_logprobs=[[-0.5, -0.5]] * rows, finish_reasons=["stop"] * rows,
                          group_index=[i // 2 for i in range(rows)])
        batch = batch_from_rollout(rollout, pad_token_id=0)
        batch.scores = torch.tensor(scores)
        batch.meta = {"acc": list(scores)}
        return batch

    return next_scored, count


def test_without_dynamic_sampling_one_call_unchanged() -> None:
    fn, count = _calls([[1, 0, 1, 1, 0, 0, 1, 1]])
    batch, stats = collect_scored_batch(fn, _cfg(dynamic=False), pad_token_id=0)
    assert count[0] == 1 and stats == {} and len(batch) == 8


def test_refills_until_enough_groups_and_keeps_the_first_ones() -> None:
    # call 0: groups 0 (1,0) and 3 (0,1) informative -> 2 groups; call 1: groups 0, 1, 2 informative -> 5 >= 4
    fn, count = _calls([[1, 0, 1, 1, 0, 0, 0, 1], [1, 0, 0, 1, 1, 0, 1, 1]])
    batch, stats = collect_scored_batch(fn, _cfg(dynamic=True), pad_token_id=0)
    assert count[0] == 2
    assert stats == {"train/num_gen_batches": 2.0, "train/kept_groups": 4.0}
    # rows kept: call 0 rows 0,1 and 6,7; call 1 rows 0,1 and 2,3 (its group 2 is the fifth: dropped)
    assert batch.responses[:, 0].tolist() == [0, 1, 6, 7, 100, 101, 102, 103]
    assert batch.meta["acc"] == [1, 0, 0, 1, 1, 0, 0, 1]
    assert torch.unique(batch.group_index).numel() == 4


def test_rounds_down_to_whole_mini_batches_at_the_cap() -> None:
    # cap 2 calls; 3 informative groups in all -> rounded down to 2 with multiple_of=2
    fn, count = _calls([[1, 0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 1, 1, 1]])
    batch, stats = collect_scored_batch(fn, _cfg(dynamic=True, cap=2), pad_token_id=0, multiple_of=2)
    assert count[0] == 2
    assert stats == {"train/num_gen_batches": 2.0, "train/kept_groups": 2.0}
    assert batch.responses[:, 0].tolist() == [0, 1, 102, 103]
    # the same draws without rounding keep all 3 informative groups
    fn, _ = _calls([[1, 0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 1, 1, 1]])
    batch, stats = collect_scored_batch(fn, _cfg(dynamic=True, cap=2), pad_token_id=0)
    assert stats["train/kept_groups"] == 3.0 and batch.responses[:, 0].tolist() == [0, 1, 102, 103, 104, 105]


def test_too_few_informative_groups_train_on_the_last_call_unfiltered() -> None:
    # one informative group, but whole mini-batches of 2 are needed: the last call's 4 groups are used as is
    fn, _ = _calls([[1, 0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 1, 1]])
    batch, stats = collect_scored_batch(fn, _cfg(dynamic=True, cap=2), pad_token_id=0, multiple_of=2)
    assert stats == {"train/num_gen_batches": 2.0, "train/kept_groups": 4.0}
    assert batch.responses[:, 0].tolist() == [100, 101, 102, 103, 104, 105, 106, 107]
