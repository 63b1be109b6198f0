"""Synthetic arithmetic tasks in verl's row format, as files or generated on the fly.

    python -m trainer.data.synthetic --task arithmetic --difficulty easy \\
        --num-train 2000 --num-val 200 --seed 0 --out data/arith_easy
    # -> data/arith_easy/train.parquet, data/arith_easy/val.parquet

Difficulties (``difficulty`` may also be the level number 1, 2, 3):

| level | name | problem | example | distinct problems |
|---|---|---|---|---|
| 1 | easy | single-digit a + b | ``What is 3 + 5?`` | 100 |
| 2 | medium | two-digit a + b or a - b (negative results allowed) | ``What is 23 - 57?`` | 16,200 |
| 3 | hard | three two-digit operands, at least one ``*`` | ``What is 12 * 34 + 56?`` | 3.6 M |

Each prompt is one user message ending in "Answer with just the number."; the ground truth is
the integer value as a string (``*`` binds before ``+``/``-``); data_source is
``synthetic/arithmetic`` (scored by `trainer.rewards.arithmetic`); extra_info holds the split,
index, difficulty, operands and operators.

Train/validation split: every problem belongs to exactly one split, fixed by a hash of its text
(about 20% go to validation), so train and validation rows never share a problem whatever the
seed or sizes. Within a split, rows are drawn without repetition until that split's problems
run out (easy has ~80 train problems, so 2000 easy rows repeat each ~25 times), then cycled.

Configs can name a task instead of a file (``data.train_files`` / ``data.val_files``):

    synthetic:arithmetic-<difficulty>[?num=<rows>&seed=<int>&split=<train|val>]

e.g. ``synthetic:arithmetic-easy?num=2000&seed=0``. ``synthetic:geometry-<difficulty>`` names the
visual task of `trainer.data.synthetic_geometry` (rendered figures, verl's image rows). Defaults: num 2000 for train, 200 for val;
seed 0; split train. `ensure_synthetic(spec)` returns both splits (the val size from
``num_val``, default 200).
"""

from __future__ import annotations

import argparse
import random
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from trainer.data.splits import VAL_PERCENT, resolve_difficulty, write_splits
from trainer.errors import DataError

DATA_SOURCE = "synthetic/arithmetic"
SPEC_PREFIX = "synthetic:"
DEFAULT_NUM = {"train": 2000, "val": 200}
TASKS = ("arithmetic", "geometry")

Problem = tuple[tuple[int, ...], tuple[str, ...]]  # (operands, operators)


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Value of ``a op b [op c]`` with ``*`` before ``+``/``-``, left to right otherwise."""
    terms, signs = [operands[0]], []
    for op, value in zip(operators, operands[1:]):
        if op == "*":
            terms[-1] *= value
        else:
            signs.append(op)
            terms.append(value)
    total = terms[0]
    for sign, term in zip(signs, terms[1:]):
        total = total + term if sign == "+" else total - term
    return total


def question_text(problem: Problem) -> str:
    operands, operators = problem
    expr = str(operands[0]) + "".join(f" {op} {v}" for op, v in zip(operators, operands[1:]))
    return f"What is {expr}? Answer with just the number."


def split_of(problem: Problem) -> str:
    """'val' for ~VAL_PERCENT% of problems, fixed by a hash of the question text; else 'train'."""
    return "val" if zlib.crc32(question_text(problem).encode()) % 100 < VAL_PERCENT else "train"


def _enumerate(difficulty: str) -> list[Problem]:
    if difficulty == "easy":
        return [((a, b), ("+",)) for a in range(10) for b in range(10)]
    return [((a, b), (op,)) for a in range(10, 100) for b in range(10, 100) for op in ("+", "-")]


def _draw_hard(rng: random.Random) -> Problem:
    operands = tuple(rng.randint(10, 99) for _ in range(3))
    operators = (rng.choice("+-*"), rng.choice("+-*"))
    if "*" not in operators:
        operators = (operators[0], "*") if rng.random() < 0.5 else ("*", operators[1])
    return operands, operators


def _sample_problems(num: int, difficulty: str, rng: random.Random, split: str | None) -> list[Problem]:
    """`num` problems of one split: distinct while the split has unused ones, then cycled."""
    if difficulty == "hard":  # too many to enumerate; rejection-sample distinct ones
        seen: set[Problem] = set()
        out: list[Problem] = []
        while len(out) < num:
            p = _draw_hard(rng)
            if p not in seen and (split is None or split_of(p) == split):
                seen.add(p)
                out.append(p)
        return out
    pool = [p for p in _enumerate(difficulty) if split is None or split_of(p) == split]
    out = []
    while len(out) < num:
        perm = pool[:]
        rng.shuffle(perm)
        out.extend(perm)
    return out[:num]


def make_arithmetic_rows(
    num: int, *, difficulty: str | int, seed: int, split: str | None = None
) -> list[dict[str, Any]]:
    """`num` verl-format rows; `split` 'train'/'val' keeps to that half of the problems, None mixes."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if split not in (None, "train", "val"):
        raise ValueError(f"split must be 'train', 'val' or None, got {split!r}")
    name = resolve_difficulty(difficulty)
    rng = random.Random(f"arithmetic/{name}/{split}/{seed}")
    rows = []
    for i, problem in enumerate(_sample_problems(num, name, rng, split)):
        operands, operators = problem
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question_text(problem)}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(evaluate(operands, operators))},
                "extra_info": {
                    "split": split or "all",
                    "index": i,
                    "difficulty": name,
                    "operands": list(operands),
                    "operators": list(operators),
                },
            }
        )
    return rows


def split_rows(
    rows: Sequence[dict[str, Any]], val_fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shuffle `rows` with `seed` and cut off round(len * val_fraction) of them as validation.

    Rows are split by position, so duplicate problems can land on both sides; synthetic data
    made with ``split='train'``/``'val'`` is disjoint by construction instead.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    num_val = round(len(rows) * val_fraction)
    return [rows[i] for i in order[num_val:]], [rows[i] for i in order[:num_val]]


@dataclass(frozen=True)
class SyntheticSpec:
    """A parsed ``synthetic:<task>-<difficulty>?num=&seed=&split=&num_val=`` string."""

    task: str
    difficulty: str
    num: int | None
    num_val: int
    seed: int
    split: str


def parse_spec(spec: str) -> SyntheticSpec:
    """Parse a synthetic data spec; DataError naming the spec and the fix when malformed."""
    fix = ("(fix: write synthetic:<arithmetic|geometry>-<easy|medium|hard>[?num=N&seed=S&split=train|val], "
           "or synthetic:geometry-count)")
    if not spec.startswith(SPEC_PREFIX):
        raise DataError(f"not a synthetic data spec: {spec!r} {fix}")
    body, _, query = spec[len(SPEC_PREFIX):].partition("?")
    task, _, difficulty = body.partition("-")
    if task not in TASKS:
        raise DataError(f"unknown synthetic task {task!r} in {spec!r} {fix}")
    try:
        if not (task == "geometry" and difficulty == "count"):  # geometry's extra level (synthetic_geometry.py)
            difficulty = resolve_difficulty(int(difficulty) if difficulty.isdigit() else difficulty)
    except ValueError:
        raise DataError(f"unknown difficulty {difficulty!r} in {spec!r} {fix}") from None
    params = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(params) - {"num", "num_val", "seed", "split"}
    if unknown:
        raise DataError(f"unknown parameter(s) {sorted(unknown)} in {spec!r} {fix}")
    try:
        num = int(params["num"]) if "num" in params else None
        num_val = int(params.get("num_val", DEFAULT_NUM["val"]))
        seed = int(params.get("seed", 0))
    except ValueError:
        raise DataError(f"num, num_val and seed must be integers in {spec!r} {fix}") from None
    split = params.get("split", "train")
    if split not in ("train", "val") or (num is not None and num <= 0) or num_val < 0:
        raise DataError(f"bad split or size in {spec!r} {fix}")
    return SyntheticSpec(task, difficulty, num, num_val, seed, split)


def _make_rows(task: str, num: int, *, difficulty: str, seed: int, split: str) -> list[dict[str, Any]]:
    if task == "geometry":
        from trainer.data.synthetic_geometry import make_geometry_rows

        return make_geometry_rows(num, difficulty=difficulty, seed=seed, split=split)
    return make_arithmetic_rows(num, difficulty=difficulty, seed=seed, split=split)


def load_synthetic(spec: str) -> list[dict[str, Any]]:
    """The rows a spec names: its split, `num` rows (default 2000 train / 200 val)."""
    s = parse_spec(spec)
    num = s.num if s.num is not None else DEFAULT_NUM[s.split]
    return _make_rows(s.task, num, difficulty=s.difficulty, seed=s.seed, split=s.split)


def ensure_synthetic(spec: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, val rows) for a spec, disjoint and deterministic in its seed.

    `num` sizes the train split (default 2000) and `num_val` the validation split (default 200);
    a ``split`` parameter in the spec is ignored here.
    """
    s = parse_spec(spec)
    train = _make_rows(s.task, s.num or DEFAULT_NUM["train"], difficulty=s.difficulty, seed=s.seed, split="train")
    val = _make_rows(s.task, s.num_val, difficulty=s.difficulty, seed=s.seed, split="val")
    return train, val


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data.synthetic", description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="arithmetic", choices=["arithmetic"])
    parser.add_argument("--difficulty", default="easy", help="easy | medium | hard (or 1 | 2 | 3)")
    parser.add_argument("--num-train", type=int, default=DEFAULT_NUM["train"])
    parser.add_argument("--num-val", type=int, default=DEFAULT_NUM["val"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])
    parser.add_argument("--out", required=True, help="output directory for train.<fmt> and val.<fmt>")
    args = parser.parse_args(argv)
    return write_splits(make_arithmetic_rows, args, args.format)


if __name__ == "__main__":
    sys.exit(main())
