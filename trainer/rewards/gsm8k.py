"""GSM8K reward (data_source ``openai/gsm8k``, ``gsm8k``), verl's rule-based scorer.

Reference: verl ``verl/utils/reward_score/gsm8k.py`` (itself after ReFT, Trung et al., ACL 2024).

Extraction looks only at the last 300 characters of the response (the final answer sits at the
end; regexes on 20k-token responses are slow), then:

- ``method="strict"`` (default): the *last* ``#### <number>`` in that window. This is the format
  the GSM8K prompt asks for, so it also checks that the model followed it.
- ``method="flexible"``: the last number anywhere in the window.

Commas and ``$`` are stripped from the number and it is compared to the ground truth *as a
string*: ``score`` (1.0) when equal, ``format_score`` (0.0) when a number was found but differs,
0.0 when none was found.

Departures from verl, all on inputs verl scores 0 for a surface reason:
- ``#### $42`` is read (verl's regex needs a digit right after ``#### ``), and ``####42`` too;
- a trailing period (``#### 42.``) is dropped before comparing;
- Unicode minus and dashes count as ``-``;
- the ground truth gets the same cleanup, so ``"1,234"`` as ground truth matches ``1234``.
"""

from __future__ import annotations

import re

from trainer.rewards.boxed import normalize_unicode
from trainer.rewards.result import RewardResult

SOLUTION_CLIP_CHARS = 300
_STRICT_RE = re.compile(r"####\s*\$?\s*(-?[0-9.,]+)")
_NUMBER_RE = re.compile(r"-?[0-9.,]+")
_METHODS = ("strict", "flexible")


def _clean_number(raw: str) -> str | None:
    """Drop ``,`` and ``$`` and trailing periods; None if nothing numeric is left."""
    s = raw.replace(",", "").replace("$", "").strip().rstrip(".")
    if s in ("", "-") or not any(ch.isdigit() for ch in s):
        return None
    return s


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer string GSM8K scoring compares, or None when the response has none."""
    if method not in _METHODS:
        raise ValueError(f"gsm8k method must be one of {_METHODS}, got {method!r}")
    text = normalize_unicode(solution_str)[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT_RE.findall(text)
        return _clean_number(found[-1]) if found else None
    for candidate in reversed(_NUMBER_RE.findall(text)):
        cleaned = _clean_number(candidate)
        if cleaned is not None:
            return cleaned
    return None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> RewardResult:
    """`score` if the extracted number equals the ground truth, `format_score` if it differs."""
    pred = extract_answer(solution_str, method=method)
    if pred is None:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    gold = _clean_number(normalize_unicode(str(ground_truth))) or str(ground_truth).strip()
    correct = pred == gold
    return RewardResult(score=score if correct else format_score, acc=1.0 if correct else 0.0, pred=pred)
