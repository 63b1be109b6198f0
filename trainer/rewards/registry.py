"""Reward functions by data_source: the name in each dataset row picks the scorer.

Semantics follow verl's ``default_compute_score(data_source, solution_str, ground_truth,
extra_info)``: the row's ``data_source`` selects a rule-based scorer, which returns a score, an
accuracy and the extracted answer (`RewardResult`).

| data_source | scorer | score |
|---|---|---|
| ``openai/gsm8k``, ``gsm8k`` | `gsm8k` (``#### n``; ``method="flexible"`` = last number) | 1 / 0 |
| ``lighteval/MATH``, ``DigitalLearningGMU/MATH-lighteval``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``, ``math`` | `math_answer` (last box, math-verify) | 1 / 0 |
| ``math_dapo``, ``dapo``, ``aime-2024``, ``aime2024``, any ``aime*`` | `dapo` (``Answer: x``, Minerva normalization) | +1 / -1 |
| ``retool`` | `dapo.compute_retool_score` (strict box + tool-call shaping) | +1 / <= -0.6 |
| ``hiyouga/geometry3k``, ``geo3k`` | `geo3k` (0.9 acc + 0.1 format) | 0 .. 1 |
| ``synthetic/arithmetic``, ``synthetic/geometry`` | `arithmetic` (last integer) | 1 / 0 |

Like verl, any data_source starting with ``aime`` goes to the DAPO scorer. Extra keyword
arguments to `compute_score` go to the scorer (``method="flexible"`` for GSM8K,
``strict_box_verify=True`` for DAPO). An unknown data_source is a `DataError`.

Register another scorer with `register("name", fn)` where ``fn(solution_str, ground_truth,
extra_info, **kwargs) -> RewardResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.errors import DataError
from trainer.rewards import arithmetic, dapo, geo3k, gsm8k, math_answer
from trainer.rewards.result import RewardResult

Scorer = Callable[..., RewardResult]


def _gsm8k(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return gsm8k.compute_score(solution_str, ground_truth, **kw)


def _math(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return math_answer.compute_score(solution_str, ground_truth, **kw)


def _dapo(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return dapo.compute_score(solution_str, ground_truth, **kw)


def _retool(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return dapo.compute_retool_score(solution_str, ground_truth, extra_info, **kw)


def _geo3k(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return geo3k.compute_score(solution_str, ground_truth, **kw)


def _arithmetic(solution_str: str, ground_truth: str, extra_info: dict | None, **kw: Any) -> RewardResult:
    return arithmetic.compute_score(solution_str, ground_truth, **kw)


_REGISTRY: dict[str, Scorer] = {
    "openai/gsm8k": _gsm8k,
    "gsm8k": _gsm8k,
    "lighteval/MATH": _math,
    "DigitalLearningGMU/MATH-lighteval": _math,
    "DigitalLearningGmbH/MATH-lighteval": _math,
    "HuggingFaceH4/MATH-500": _math,
    "math": _math,
    "math_dapo": _dapo,
    "dapo": _dapo,
    "aime-2024": _dapo,
    "aime2024": _dapo,
    "retool": _retool,
    "hiyouga/geometry3k": _geo3k,
    "geo3k": _geo3k,
    "synthetic/arithmetic": _arithmetic,
    "synthetic/geometry": _arithmetic,
}
_PREFIXES: dict[str, Scorer] = {"aime": _dapo}


def register(data_source: str, scorer: Scorer) -> None:
    """Add or replace the scorer for `data_source`."""
    _REGISTRY[data_source] = scorer


def known_data_sources() -> list[str]:
    """Every data_source name with a scorer (prefix rules shown as ``aime*``)."""
    return sorted(_REGISTRY) + [p + "*" for p in sorted(_PREFIXES)]


def get_scorer(data_source: str) -> Scorer:
    """The scorer for `data_source`; DataError naming it and the known names when there is none."""
    scorer = _REGISTRY.get(data_source)
    if scorer is not None:
        return scorer
    for prefix, prefix_scorer in _PREFIXES.items():
        if data_source.startswith(prefix):
            return prefix_scorer
    raise DataError(
        f"no reward function for data_source {data_source!r} (fix: set each row's data_source to one of "
        f"{', '.join(known_data_sources())}, or register one with trainer.rewards.register)"
    )


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> RewardResult:
    """Score one response for the row's data_source (verl ``default_compute_score`` semantics)."""
    return get_scorer(data_source)(solution_str, str(ground_truth), extra_info, **kwargs)
