"""Rule-based rewards by data_source: extraction on tricky strings and the score each task pays."""

from __future__ import annotations

import threading

import pytest

from trainer.errors import DataError, RLBenchError
from trainer.rewards import RewardResult, compute_score, known_data_sources, register
from trainer.rewards.boxed import last_boxed_content, strip_latex_answer
from trainer.rewards.dapo import normalize_final_answer


# ---------------------------------------------------------------- boxed extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
        ("\\fbox{7}", "7"),
        ("the answer is \\boxed 5$", "5"),
        ("no box here, 5", None),
        ("\\boxed{3} and truncated \\boxed{12", None),
        ("\\boxed{}", None),
        ("\\boxed{ {1,2} }", "{1,2}"),
    ],
)
def test_last_boxed_content(text: str, expected: str | None) -> None:
    assert last_boxed_content(text) == expected


def test_boxed_command_prefix_is_not_a_box() -> None:
    assert last_boxed_content("\\boxedx{3}") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("$\\dfrac{1}{2}$", "\\frac{1}{2}"), ("x = 3", "3"), ("1,234", "1234"), (".5", "0.5"), ("90^\\circ", "90"),
     ("\\text{ 4 }.", "4")],
)
def test_strip_latex_answer(raw: str, expected: str) -> None:
    assert strip_latex_answer(raw) == expected


# ---------------------------------------------------------------- GSM8K
@pytest.mark.parametrize(
    ("response", "gt", "acc"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### $42", "42", 1.0),
        ("#### 42.", "42", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### \u22125", "-5", 1.0),  # unicode minus
        ("#### 3\nwait, recheck\n#### 4", "4", 1.0),  # last #### wins
        ("#### 3\nwait, recheck\n#### 4", "3", 0.0),
        ("The answer is 7", "7", 0.0),  # strict needs ####
        ("", "7", 0.0),
        ("#### 7.5", "7", 0.0),
    ],
)
def test_gsm8k_strict(response: str, gt: str, acc: float) -> None:
    result = compute_score("openai/gsm8k", response, gt)
    assert result.acc == acc
    assert result.score == acc  # score 1.0 / format_score 0.0


def test_gsm8k_flexible_takes_last_number() -> None:
    r = compute_score("gsm8k", "3 + 4 = 7, so she pays $1,250.", "1250", method="flexible")
    assert (r.score, r.acc, r.pred) == (1.0, 1.0, "1250")
    assert compute_score("gsm8k", "nothing numeric", "3", method="flexible").pred is None


def test_gsm8k_format_score_and_clip() -> None:
    r = compute_score("gsm8k", "#### 8", "7", format_score=0.1)
    assert (r.score, r.acc, r.pred) == (0.1, 0.0, "8")
    # the #### line is outside the last 300 characters -> not seen
    r = compute_score("gsm8k", "#### 7\n" + "x" * 400, "7")
    assert (r.score, r.pred) == (0.0, None)


def test_gsm8k_unknown_method() -> None:
    with pytest.raises(ValueError, match="strict"):
        compute_score("gsm8k", "#### 7", "7", method="loose")


# ---------------------------------------------------------------- MATH via math-verify
@pytest.mark.parametrize(
    ("response", "gt", "acc"),
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("\\boxed{5}", "\\boxed{5}", 1.0),  # boxed ground truth
        ("\\boxed 5", "5", 1.0),
        ("\\fbox{12}", "12", 1.0),
        ("\\boxed{\u22123}", "-3", 1.0),
        ("\\boxed{3} no wait \\boxed{4}", "3", 0.0),  # last box counts
        ("the answer is 5", "5", 0.0),  # no box
        ("", "5", 0.0),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
    ],
)
def test_math_scorer(response: str, gt: str, acc: float) -> None:
    for source in ("lighteval/MATH", "HuggingFaceH4/MATH-500", "DigitalLearningGMU/MATH-lighteval", "math"):
        r = compute_score(source, response, gt)
        assert (r.acc, r.score) == (acc, acc), source


def test_math_scorer_in_worker_thread_falls_back_without_signal() -> None:
    """math-verify's signal timeout cannot run off the main thread; the scorer must still work."""
    out: list[RewardResult] = []
    t = threading.Thread(target=lambda: out.append(compute_score("math", "\\boxed{\\frac{2}{4}}", "0.5")))
    t.start()
    t.join()
    assert out[0].acc == 1.0


def test_math_falls_back_to_string_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("sympy blew up")

    monkeypatch.setattr(math_verify, "parse", broken)
    assert compute_score("math", "\\boxed{\\text{ 4 }}", "4").acc == 1.0
    assert compute_score("math", "\\boxed{0.5}", "\\frac{1}{2}").acc == 0.0  # strings differ


# ---------------------------------------------------------------- DAPO / AIME
@pytest.mark.parametrize(
    ("raw", "expected"),
    [("x = 5", "5"), ("$10$ dollars", "10"), ("1,000", "1000"), ("\\frac12", "\\frac{1}{2}"),
     ("\\text{(A)}", "(A)"), ("\\boxed{34}", "34"), ("90^\\circ", "90")],
)
def test_minerva_normalization(raw: str, expected: str) -> None:
    assert normalize_final_answer(raw) == expected


@pytest.mark.parametrize("source", ["math_dapo", "dapo", "aime-2024", "aime2024", "aime25"])
def test_dapo_plus_minus_one(source: str) -> None:
    right = compute_score(source, "Reasoning...\nAnswer: 204", "204")
    assert (right.score, right.acc, right.pred) == (1.0, 1.0, "204")
    wrong = compute_score(source, "Reasoning...\nAnswer: 205", "204")
    assert (wrong.score, wrong.acc) == (-1.0, 0.0)
    missing = compute_score(source, "I think 204", "204")
    assert (missing.score, missing.pred) == (-1.0, "[INVALID]")


def test_dapo_last_answer_line_and_case() -> None:
    assert compute_score("dapo", "answer: 3\nno...\nANSWER: $1,000$", "1000").acc == 1.0
    # only the last 300 characters are read
    assert compute_score("dapo", "Answer: 7\n" + "." * 400, "7").score == -1.0


def test_dapo_strict_box() -> None:
    r = compute_score("dapo", "Answer: \\boxed{17}", "17", strict_box_verify=True)
    assert (r.score, r.pred) == (1.0, "17")
    # the box must sit in the last 100 characters
    assert compute_score("dapo", "\\boxed{17}" + " " * 120, "17", strict_box_verify=True).score == -1.0


def test_retool_tool_call_shaping() -> None:
    assert compute_score("retool", "Answer: \\boxed{42}", "42", {"num_turns": 8}).score == 1.0
    # wrong: -1 + (num_turns - 2) / 2 * 0.1, capped at -0.6
    assert compute_score("retool", "Answer: \\boxed{41}", "42", {"num_turns": 6}).score == pytest.approx(-0.8)
    assert compute_score("retool", "Answer: \\boxed{41}", "42", {"num_turns": 20}).score == pytest.approx(-0.6)
    assert compute_score("retool", "Answer: \\boxed{41}", "42", {"num_turns": 2}).score == pytest.approx(-1.0)
    assert compute_score("retool", "Answer: \\boxed{41}", "42").score == -1.0
    assert compute_score("retool", "Answer: 42", "42").acc == 0.0  # box required


# ---------------------------------------------------------------- geo3k
def test_geo3k_format_and_accuracy() -> None:
    good = compute_score("hiyouga/geometry3k", "<think>angles sum</think> so \\boxed{\\frac{3}{2}}", "1.5")
    assert (good.score, good.acc) == (pytest.approx(1.0), 1.0)
    wrong_but_formatted = compute_score("geo3k", "<think>hm</think>\\boxed{2}", "1.5")
    assert (wrong_but_formatted.score, wrong_but_formatted.acc) == (pytest.approx(0.1), 0.0)
    right_no_think = compute_score("geo3k", "\\boxed{1.5}", "1.5")
    assert (right_no_think.score, right_no_think.acc) == (pytest.approx(0.9), 1.0)
    assert compute_score("geo3k", "", "1.5").score == 0.0


# ---------------------------------------------------------------- synthetic arithmetic
@pytest.mark.parametrize(
    ("response", "gt", "acc"),
    [
        ("8", "8", 1.0),
        ("Answer: 8", "8", 1.0),
        ("\\boxed{8}", "8", 1.0),
        ("3 + 5 = 8.", "8", 1.0),
        ("The answer is **8**!", "8", 1.0),
        ("23 - 57 = -34", "-34", 1.0),
        ("= \u221234", "-34", 1.0),
        ("1,234", "1234", 1.0),
        ("8.0", "8", 1.0),
        ("8.5", "8", 0.0),
        ("10-2", "8", 0.0),  # a subtraction left unevaluated reads as 2
        ("8 or maybe 9", "8", 0.0),
        ("", "8", 0.0),
        ("eight", "8", 0.0),
    ],
)
def test_arithmetic(response: str, gt: str, acc: float) -> None:
    r = compute_score("synthetic/arithmetic", response, gt)
    assert (r.score, r.acc) == (acc, acc)


def test_ground_truth_may_be_an_int() -> None:
    assert compute_score("synthetic/arithmetic", "Answer: 12", 12).acc == 1.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- registry
def test_unknown_data_source_names_it_and_lists_known() -> None:
    with pytest.raises(DataError) as info:
        compute_score("my/dataset", "x", "y")
    msg = str(info.value)
    assert "'my/dataset'" in msg and "openai/gsm8k" in msg and "synthetic/arithmetic" in msg
    assert "\n" not in msg
    assert isinstance(info.value, RLBenchError)


def test_register_custom_scorer() -> None:
    register("test/always", lambda s, gt, extra, **kw: RewardResult(score=0.5, acc=1.0, pred=s))
    assert compute_score("test/always", "hi", "x") == RewardResult(0.5, 1.0, "hi")
    assert "test/always" in known_data_sources()
