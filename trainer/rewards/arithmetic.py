"""Synthetic arithmetic reward (``synthetic/arithmetic``): exact integer answer, score 1 / 0.

The tasks come from `trainer.data.synthetic` ("What is 3 + 5? Answer with just the number.").
The response's answer is the *last number* in it, so all of these read as 8:
``8``, ``Answer: 8``, ``\\boxed{8}``, ``3 + 5 = 8.``, ``The answer is **8**!``.

Number syntax: optional sign, digits, optional thousands groups (``1,234``) and decimal part.
A ``-`` counts as a sign only when it does not follow a digit, letter or closing bracket, so
``10-2`` reads as 10 then 2 (a subtraction), while ``= -2`` and ``(-2)`` read as -2. Unicode
minus counts as ``-``. A decimal that is a whole number (``8.0``) equals 8; ``8.5`` does not.

score = acc = 1.0 when the value equals the integer ground truth, else 0.0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from trainer.rewards.boxed import normalize_unicode
from trainer.rewards.result import RewardResult

_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-\s*)?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|(?:(?<![\w)\]}])-\s*)?\d+(?:\.\d+)?")


def extract_answer(solution_str: str) -> str | None:
    """The last number in the response, without spaces or thousands commas; None if there is none."""
    found = _NUMBER_RE.findall(normalize_unicode(solution_str))
    if not found:
        return None
    return re.sub(r"[\s,]", "", found[-1])


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None


def compute_score(solution_str: str, ground_truth: str) -> RewardResult:
    """1.0 when the last number in the response equals the integer ground truth."""
    pred = extract_answer(solution_str)
    gold = _as_decimal(normalize_unicode(str(ground_truth)))
    value = _as_decimal(pred) if pred is not None else None
    correct = value is not None and gold is not None and value == gold
    return RewardResult(score=1.0 if correct else 0.0, acc=1.0 if correct else 0.0, pred=pred)
