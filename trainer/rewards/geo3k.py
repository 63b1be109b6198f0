"""Geometry3K reward (``hiyouga/geometry3k``, ``geo3k``): boxed-answer accuracy plus a format bonus.

Reference: verl ``verl/utils/reward_score/geo3k.py``:

    score = 0.9 * acc + 0.1 * format
    format = 1 if the whole response matches  <think>.*</think>.*\\boxed{.*}.*  (DOTALL) else 0
    acc    = 1 if the last boxed answer grades equal to the ground truth else 0

Departure: verl grades with ``mathruler.grader.grade_answer``; this uses the same math-verify
equivalence as the MATH scorer (`trainer.rewards.math_answer.is_equivalent`), which accepts the
same numeric forms (``\\frac{3}{2}`` = ``1.5``) and needs no extra package.
"""

from __future__ import annotations

import re

from trainer.rewards.boxed import last_boxed_content, normalize_unicode
from trainer.rewards.math_answer import is_equivalent
from trainer.rewards.result import RewardResult

FORMAT_WEIGHT = 0.1
_FORMAT_RE = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(solution_str: str) -> float:
    """1.0 when the response thinks inside <think>...</think> and then boxes an answer."""
    return 1.0 if _FORMAT_RE.fullmatch(solution_str) else 0.0


def compute_score(solution_str: str, ground_truth: str, format_weight: float = FORMAT_WEIGHT) -> RewardResult:
    """(1 - format_weight) * acc + format_weight * format."""
    text = normalize_unicode(solution_str)
    pred = last_boxed_content(text)
    acc = 1.0 if pred is not None and is_equivalent(pred, normalize_unicode(str(ground_truth)).strip()) else 0.0
    score = (1.0 - format_weight) * acc + format_weight * format_reward(text)
    return RewardResult(score=score, acc=acc, pred=pred)
