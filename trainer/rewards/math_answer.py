"""MATH reward (``lighteval/MATH``, ``DigitalLearningGMU/MATH-lighteval``, ``HuggingFaceH4/MATH-500``,
``math``): the last ``\\boxed{...}`` checked for mathematical equivalence with math-verify.

Reference: verl ``verl/utils/reward_score/math_verify.py`` (math-verify, Hugging Face) and the
Hendrycks et al. (NeurIPS 2021) convention that the final answer is boxed.

1. ``pred`` = content of the last ``\\boxed``/``\\fbox`` (nested braces matched). No box -> 0.
2. Gold and prediction are each wrapped as ``\\boxed{...}`` and parsed by ``math_verify.parse``
   with LaTeX extraction, then compared by ``math_verify.verify`` (numeric, symbolic, sets,
   intervals, matrices), so ``\\frac{1}{2}`` = ``0.5`` = ``\\dfrac12``.
3. When math-verify raises, times out, or cannot parse either side, fall back to comparing the
   two answers after `strip_latex_answer` normalization (exact string equality).

Score is 1.0/0.0 and equals acc.

Departure from verl: verl's math_verify scorer lets math-verify search the whole response for an
answer (any ``$...$`` or bare expression counts); here only the last box counts, which is what
the MATH prompt asks for and what verl's default ``math.py`` scorer does. Timeouts: math-verify
guards parsing with ``signal.alarm``, which only works in the main thread; in any other thread
(a Ray actor's worker thread, a thread pool) the timeout is disabled instead of crashing, and the
short box content keeps sympy's worst cases rare.
"""

from __future__ import annotations

import logging
import threading

from trainer.rewards.boxed import last_boxed_content, normalize_unicode, strip_latex_answer
from trainer.rewards.result import RewardResult

log = logging.getLogger(__name__)

TIMEOUT_S = 5


def _timeout_s() -> int | None:
    """math-verify's signal-based timeout works only in the main thread."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _strip_outer_box(answer: str) -> str:
    """Ground truths are sometimes stored boxed already; keep only the content."""
    inner = last_boxed_content(answer)
    return inner if inner is not None and answer.strip().startswith(("\\boxed", "\\fbox")) else answer


def is_equivalent(pred: str, gold: str) -> bool:
    """True when `pred` and `gold` (bare LaTeX answers, no box) denote the same mathematical object."""
    try:
        from math_verify import parse, verify
        from math_verify.parser import LatexExtractionConfig

        config = [LatexExtractionConfig()]
        timeout = _timeout_s()
        gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=timeout,
                            raise_on_error=True)
        pred_parsed = parse("\\boxed{" + pred + "}", extraction_config=config, parsing_timeout=timeout,
                            raise_on_error=True)
        # verify can say False when only one side parsed symbolically; the string check below
        # still catches identical answers, so a False falls through instead of returning.
        if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=timeout,
                                                  raise_on_error=True):
            return True
    except Exception as exc:  # noqa: BLE001 - sympy can raise anything; math-verify's timeout too
        log.debug("math-verify failed on pred=%r gold=%r: %s; using string compare", pred, gold, exc)
    return strip_latex_answer(pred) == strip_latex_answer(gold)


def compute_score(solution_str: str, ground_truth: str) -> RewardResult:
    """1.0 when the last boxed answer is equivalent to `ground_truth`, else 0.0."""
    pred = last_boxed_content(normalize_unicode(solution_str))
    if pred is None:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    gold = _strip_outer_box(normalize_unicode(str(ground_truth)).strip())
    correct = is_equivalent(pred, gold)
    return RewardResult(score=1.0 if correct else 0.0, acc=1.0 if correct else 0.0, pred=pred)
