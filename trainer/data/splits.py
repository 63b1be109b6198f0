"""What the synthetic generators share: difficulty names, the validation share, writing rows and splits.

    from trainer.data.splits import resolve_difficulty, write_rows
    write_rows(rows, "data/train.parquet")   # .parquet, .jsonl or .json

Below `synthetic.py` (arithmetic, and the task dispatch of a `synthetic:` spec) and
`synthetic_geometry.py` (the figures), so neither imports the other's module for these.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.errors import DataError, RLBenchError

DIFFICULTIES = ("easy", "medium", "hard")
VAL_PERCENT = 20


def resolve_difficulty(difficulty: str | int) -> str:
    """'easy'/'medium'/'hard' or level 1/2/3 -> the name; ValueError otherwise."""
    if isinstance(difficulty, int) and 1 <= difficulty <= len(DIFFICULTIES):
        return DIFFICULTIES[difficulty - 1]
    if isinstance(difficulty, str) and difficulty.lower() in DIFFICULTIES:
        return difficulty.lower()
    raise ValueError(f"difficulty must be one of {DIFFICULTIES} or 1-3, got {difficulty!r}")


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to ``.parquet`` (pandas/pyarrow), ``.jsonl`` or ``.json``; returns the path."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pd.DataFrame(list(rows)).to_parquet(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(list(rows)))
    else:
        raise DataError(f"cannot write {path}: unknown extension (fix: use .parquet, .jsonl or .json)")
    return path


def write_splits(make_rows: Any, args: argparse.Namespace, fmt: str) -> int:
    """The generators' CLIs: `make_rows(num, difficulty=, seed=, split=)` for the train and val splits of
    `args` (difficulty, num_train, num_val, seed, out), written as `<out>/<split>.<fmt>`; 2 on bad input."""
    try:
        difficulty = resolve_difficulty(int(args.difficulty) if args.difficulty.isdigit() else args.difficulty)
        for split, num in (("train", args.num_train), ("val", args.num_val)):
            rows = make_rows(num, difficulty=difficulty, seed=args.seed, split=split)
            path = write_rows(rows, Path(args.out) / f"{split}.{fmt}")
            print(f"wrote {len(rows)} {difficulty} {split} rows to {path}")
    except (ValueError, RLBenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
