"""Synthetic arithmetic tasks: values, difficulty levels, disjoint splits, specs and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.data import ensure_synthetic, load_rows, make_arithmetic_rows, split_rows
from trainer.data.splits import resolve_difficulty
from trainer.data.synthetic import evaluate, main, parse_spec
from trainer.errors import DataError
from trainer.rewards import compute_score


def _question(row: dict) -> str:
    return row["prompt"][0]["content"]


@pytest.mark.parametrize(
    ("operands", "operators", "value"),
    [((3, 5), ("+",), 8), ((23, 57), ("-",), -34), ((12, 34, 56), ("*", "+"), 464),
     ((12, 34, 56), ("+", "*"), 1916), ((20, 3, 4), ("-", "*"), 8), ((50, 10, 5), ("-", "-"), 35),
     ((11, 12, 13), ("*", "*"), 1716)],
)
def test_evaluate_precedence(operands: tuple, operators: tuple, value: int) -> None:
    assert evaluate(operands, operators) == value


def test_row_format_and_ground_truth_matches_question() -> None:
    for difficulty in ("easy", "medium", "hard"):
        for row in make_arithmetic_rows(30, difficulty=difficulty, seed=1):
            info = row["extra_info"]
            assert row["data_source"] == "synthetic/arithmetic"
            assert row["reward_model"] == {"style": "rule", "ground_truth": str(evaluate(info["operands"], info["operators"]))}
            expr = " ".join(str(x) for pair in zip(info["operands"], info["operators"] + [""]) for x in pair).strip()
            assert _question(row) == f"What is {expr}? Answer with just the number."
            assert info["difficulty"] == difficulty
            # the reward function accepts the ground truth as the answer
            assert compute_score(row["data_source"], f"Answer: {row['reward_model']['ground_truth']}",
                                 row["reward_model"]["ground_truth"]).acc == 1.0


def test_difficulty_ranges() -> None:
    easy = make_arithmetic_rows(100, difficulty="easy", seed=0)
    assert all(0 <= x <= 9 for r in easy for x in r["extra_info"]["operands"])
    assert {op for r in easy for op in r["extra_info"]["operators"]} == {"+"}
    medium = make_arithmetic_rows(200, difficulty=2, seed=0)
    assert all(10 <= x <= 99 and len(r["extra_info"]["operands"]) == 2 for r in medium for x in r["extra_info"]["operands"])
    assert {op for r in medium for op in r["extra_info"]["operators"]} == {"+", "-"}
    hard = make_arithmetic_rows(200, difficulty="hard", seed=0)
    assert all(len(r["extra_info"]["operands"]) == 3 and "*" in r["extra_info"]["operators"] for r in hard)


def test_resolve_difficulty() -> None:
    assert [resolve_difficulty(x) for x in (1, 2, 3, "HARD")] == ["easy", "medium", "hard", "hard"]
    with pytest.raises(ValueError, match="difficulty"):
        resolve_difficulty(4)


def test_deterministic_by_seed() -> None:
    a = make_arithmetic_rows(50, difficulty="medium", seed=3, split="train")
    assert a == make_arithmetic_rows(50, difficulty="medium", seed=3, split="train")
    assert a != make_arithmetic_rows(50, difficulty="medium", seed=4, split="train")


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_train_and_val_never_share_a_problem(difficulty: str) -> None:
    train = {_question(r) for r in make_arithmetic_rows(500, difficulty=difficulty, seed=0, split="train")}
    val = {_question(r) for r in make_arithmetic_rows(100, difficulty=difficulty, seed=1, split="val")}
    assert train and val and not train & val


def test_distinct_until_exhausted() -> None:
    medium = make_arithmetic_rows(300, difficulty="medium", seed=0, split="train")
    assert len({_question(r) for r in medium}) == 300
    easy_val = make_arithmetic_rows(200, difficulty="easy", seed=0, split="val")
    unique = {_question(r) for r in easy_val}
    assert 10 <= len(unique) <= 35  # ~20% of the 100 easy problems, each repeated
    first_pass = [_question(r) for r in easy_val[: len(unique)]]
    assert len(set(first_pass)) == len(unique)  # every problem once before any repeats


def test_split_rows() -> None:
    rows = [{"i": i} for i in range(10)]
    train, val = split_rows(rows, 0.3, seed=0)
    assert len(val) == 3 and len(train) == 7
    assert sorted(r["i"] for r in train + val) == list(range(10))
    assert split_rows(rows, 0.3, seed=0) == (train, val)
    with pytest.raises(ValueError):
        split_rows(rows, 1.0, seed=0)


def test_parse_spec_and_ensure_synthetic() -> None:
    spec = parse_spec("synthetic:arithmetic-hard?num=40&seed=2&num_val=10")
    assert (spec.difficulty, spec.num, spec.num_val, spec.seed, spec.split) == ("hard", 40, 10, 2, "train")
    assert parse_spec("synthetic:arithmetic-1").difficulty == "easy"
    train, val = ensure_synthetic("synthetic:arithmetic-hard?num=40&seed=2&num_val=10")
    assert len(train) == 40 and len(val) == 10
    assert not {_question(r) for r in train} & {_question(r) for r in val}
    assert train == load_rows("synthetic:arithmetic-hard?num=40&seed=2")
    default_train, default_val = ensure_synthetic("synthetic:arithmetic-easy")
    assert (len(default_train), len(default_val)) == (2000, 200)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("synthetic:sorting-easy", "unknown synthetic task 'sorting'"),
     ("synthetic:arithmetic-extreme", "unknown difficulty 'extreme'"),
     ("synthetic:arithmetic-easy?n=5", "unknown parameter(s) ['n']"),
     ("synthetic:arithmetic-easy?num=five", "must be integers"),
     ("synthetic:arithmetic-easy?split=test", "bad split or size")],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(DataError) as info:
        load_rows(spec)
    assert message in str(info.value) and "(fix:" in str(info.value)


def test_cli_writes_train_and_val_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "arith_easy"
    rc = main(["--task", "arithmetic", "--difficulty", "easy", "--num-train", "40", "--num-val", "8", "--out", str(out)])
    assert rc == 0
    train, val = load_rows(out / "train.parquet"), load_rows(out / "val.parquet")
    assert len(train) == 40 and len(val) == 8
    assert train == make_arithmetic_rows(40, difficulty="easy", seed=0, split="train")
    assert "wrote 40 easy train rows" in capsys.readouterr().out
    assert main(["--difficulty", "impossible", "--out", str(out)]) == 2
