"""DAPO-style rewards (``math_dapo``, ``dapo``, ``aime-2024``/``aime2024``/``aime*``, ``retool``): +1 / -1.

Reference: verl ``verl/utils/reward_score/math_dapo.py`` (DAPO, Yu et al. 2025), whose answer
normalization follows Minerva (Lewkowycz et al. 2022) as in lm-evaluation-harness
``hendrycks_math``.

Default ("Minerva") check, `compute_score`:
1. Keep the last 300 characters of the response (the longest MATH-500 answer is 159 chars).
2. ``pred`` = the text after the *last* ``Answer:`` (case-insensitive) up to the end of its line;
   ``[INVALID]`` when there is none.
3. Normalize pred and ground truth with `normalize_final_answer` (keep the part after the last
   ``=``, drop units, ``\\text{}``, ``$``, spaces, thousands commas, unbox, expand ``\\fracab``)
   and compare the strings. score = +1.0 if equal, -1.0 otherwise; acc = 1/0.

Strict-box check (`strict_box_verify=True`, used by ReTool): the last ``\\boxed{...}`` within the
last 100 of those 300 characters must equal the ground truth exactly (no normalization beyond
stripping whitespace).

ReTool (`compute_retool_score`, from verl ``recipe/retool``): strict-box score, and a wrong answer
earns back 0.1 per tool round trip beyond the first turn, capped so it stays <= -0.6:
``score = min(-0.6, -1 + (num_turns - 2) / 2 * 0.1)`` with ``num_turns`` from extra_info
(left unshaped when extra_info has no ``num_turns``).

Departure from verl: Unicode minus/dashes are read as ``-`` before any of this.
"""

from __future__ import annotations

import re

from trainer.rewards.boxed import last_boxed_content, normalize_unicode
from trainer.rewards.result import RewardResult

SOLUTION_CLIP_CHARS = 300
STRICT_BOX_CHARS = 100
INVALID = "[INVALID]"
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva normalization tables: (substring, replacement), then substrings removed outright.
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_REMOVED: tuple[str, ...] = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)


def normalize_final_answer(answer: str) -> str:
    """Minerva normal form of a final answer string (see module docstring, step 3)."""
    s = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)  # keep only the first $...$ span
    for command in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + command + r"\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)  # \frac12 -> \frac{1}{2}
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)  # \sqrt2 -> \sqrt{2}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _minerva(solution_tail: str, ground_truth: str) -> tuple[bool, str]:
    found = _ANSWER_RE.findall(solution_tail)
    pred = normalize_final_answer(found[-1] if found else INVALID)
    return pred == normalize_final_answer(ground_truth), pred


def _strict_box(solution_tail: str, ground_truth: str) -> tuple[bool, str | None]:
    pred = last_boxed_content(solution_tail[-STRICT_BOX_CHARS:])
    return pred is not None and pred == ground_truth.strip(), pred


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> RewardResult:
    """+1.0 for a correct final answer, -1.0 otherwise (including no answer)."""
    tail = normalize_unicode(solution_str)[-SOLUTION_CLIP_CHARS:]
    gold = normalize_unicode(str(ground_truth))
    correct, pred = _strict_box(tail, gold) if strict_box_verify else _minerva(tail, gold)
    return RewardResult(score=1.0 if correct else -1.0, acc=1.0 if correct else 0.0, pred=pred)


def compute_retool_score(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """Strict-box DAPO score; wrong answers get a small bonus per tool call (never above -0.6)."""
    result = compute_score(solution_str, ground_truth, strict_box_verify=True)
    if result.score >= 0:
        return result
    if not extra_info or extra_info.get("num_turns") is None:
        return result  # no turn count recorded (single-turn rollout): nothing to shape
    num_turns = int(extra_info["num_turns"])
    shaped = min(-0.6, result.score + (num_turns - 2) / 2 * 0.1)
    return RewardResult(score=shaped, acc=result.acc, pred=result.pred)
