"""A synthetic visual geometry task: rendered figures whose length, area or angle is read off.

    python -m trainer.data.synthetic_geometry --difficulty easy --num-train 512 --num-val 64 --out data/geo_easy
    # -> data/geo_easy/train.parquet, data/geo_easy/val.parquet (images as PNG bytes, verl's geo3k layout)

Configs name it like the arithmetic task: ``synthetic:geometry-<difficulty>[?num=&num_val=&seed=&split=]``.

Each figure is a ``SIZE x SIZE`` RGB image (48 px) on a light grid of ``CELL``-pixel cells (8 px,
so 6 x 6 cells), drawn with Pillow:

| level | name | figure | question | answers |
|---|---|---|---|---|
| 0 | count | 1-4 black 8-px squares, not overlapping, corners on a 4-px lattice | how many black squares? | 1..4 |
| 1 | easy | a horizontal or vertical black segment 1-5 cells long | how many cells long is the segment? | 1..5 |
| 2 | medium | a filled black rectangle, width and height 1-4 cells | how many cells does the rectangle cover? | 1..16 |
| 3 | hard | a ray from the image centre at a multiple of 45 degrees | what angle does it make with the ray pointing right, counter-clockwise? | 0..315 |

A row is verl's multimodal format (`trainer.data.multimodal`): one user message starting with the
``<image>`` placeholder, ``images: [{"bytes": <PNG>, "path": None}]``, data_source
``synthetic/geometry`` (scored by `trainer.rewards.arithmetic`: the last number in the response),
extra_info with the figure's parameters. The answer can only be read from the image: the text of
every question of a level is the same.

``count`` (``synthetic:geometry-count``) is the easiest level, made for a model that learns to
see from scratch (the cpu-vlm profile's warm start, `trainer/models/warm_start_vlm.py`): the answer is
the figure's amount of black, which the tiny vision tower's 9 merged tokens carry even when it
cannot locate a segment's ends. Its 4 classes are balanced (121 figures each: every place of
one square, and 121 seeded sets of 2, 3, 4 places), so always giving one answer scores about 0.25.

Train/validation split: every figure (its parameters) belongs to one split by a hash (~20% val),
so the two never share a figure; within a split figures are drawn without repetition and then
cycled, as in `trainer.data.synthetic`.
"""

from __future__ import annotations

import argparse
import random
import sys
import zlib
from typing import Any

from trainer.data.multimodal import IMAGE_PLACEHOLDER, png_bytes
from trainer.data.splits import VAL_PERCENT, resolve_difficulty, write_splits

DATA_SOURCE = "synthetic/geometry"
SIZE = 48
CELL = 8
NUM_CELLS = SIZE // CELL

LEVELS = ("count", "easy", "medium", "hard")  # geometry's levels: the shared three plus count
QUESTIONS = {
    "count": "How many black squares?",
    "easy": "How many grid cells long is the black segment? Answer with just the number.",
    "medium": "How many grid cells does the black rectangle cover? Answer with just the number.",
    "hard": "What angle in degrees does the black ray make with a ray pointing right, measured counter-clockwise? "
            "Answer with just the number.",
}

Figure = tuple[int, ...]
COUNT_STEP = 4  # count: a square's top-left corner lies on a 4-px lattice, so it may straddle cells
COUNT_STEPS = (SIZE - CELL) // COUNT_STEP + 1  # 11 corner places per axis


def _corner(place: int) -> tuple[int, int]:
    return (place % COUNT_STEPS) * COUNT_STEP, (place // COUNT_STEPS) * COUNT_STEP


def _apart(a: int, b: int) -> bool:
    (xa, ya), (xb, yb) = _corner(a), _corner(b)
    return abs(xa - xb) >= CELL or abs(ya - yb) >= CELL


def _figures(difficulty: str) -> list[Figure]:
    """Every figure of a level as a parameter tuple."""
    if difficulty == "count":  # (k, square places): k cell-sized squares, none overlapping
        places = range(COUNT_STEPS * COUNT_STEPS)
        rng = random.Random("geometry/count")
        figs: list[Figure] = [(1, c) for c in places]
        for k in (2, 3, 4):
            seen: set[Figure] = set()
            while len(seen) < len(places):
                pick = sorted(rng.sample(places, k))
                if all(_apart(a, b) for i, a in enumerate(pick) for b in pick[i + 1:]):
                    seen.add((k, *pick))
            figs += sorted(seen)
        return figs
    if difficulty == "easy":  # (orientation, length, x0, y0): segment along a grid line
        return [(o, n, x, y) for o in (0, 1) for n in range(1, NUM_CELLS) for x in range(0, NUM_CELLS - n + 1)
                for y in range(1, NUM_CELLS)]
    if difficulty == "medium":  # (w, h, x0, y0): cells covered
        return [(w, h, x, y) for w in range(1, 5) for h in range(1, 5) for x in range(NUM_CELLS - w + 1)
                for y in range(NUM_CELLS - h + 1)]
    return [(a, r) for a in range(0, 360, 45) for r in (2, 3)]  # (angle, length in cells)


def answer_of(difficulty: str, fig: Figure) -> int:
    if difficulty == "count":
        return fig[0]
    if difficulty == "easy":
        return fig[1]
    if difficulty == "medium":
        return fig[0] * fig[1]
    return fig[0]


def render(difficulty: str, fig: Figure) -> Any:
    """The figure as an RGB PIL image."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for k in range(0, SIZE + 1, CELL):  # light grid
        draw.line([(k, 0), (k, SIZE)], fill=(200, 200, 200))
        draw.line([(0, k), (SIZE, k)], fill=(200, 200, 200))
    if difficulty == "count":
        for place in fig[1:]:
            x, y = _corner(place)
            draw.rectangle([x, y, x + CELL - 1, y + CELL - 1], fill=(0, 0, 0))
    elif difficulty == "easy":
        o, n, x, y = fig
        if o == 0:
            draw.line([(x * CELL, y * CELL), ((x + n) * CELL, y * CELL)], fill=(0, 0, 0), width=3)
        else:
            draw.line([(y * CELL, x * CELL), (y * CELL, (x + n) * CELL)], fill=(0, 0, 0), width=3)
    elif difficulty == "medium":
        w, h, x, y = fig
        draw.rectangle([x * CELL, y * CELL, (x + w) * CELL - 1, (y + h) * CELL - 1], fill=(0, 0, 0))
    else:
        import math

        a, r = fig
        c = SIZE // 2
        end = (c + r * CELL * math.cos(math.radians(a)), c - r * CELL * math.sin(math.radians(a)))
        draw.line([(c, c), end], fill=(0, 0, 0), width=3)
        draw.ellipse([c - 2, c - 2, c + 2, c + 2], fill=(0, 0, 0))
    return img


def resolve_level(difficulty: str | int) -> str:
    """A geometry level: 'count' (or 0), or one of the shared easy/medium/hard (1-3)."""
    if difficulty in ("count", 0):
        return "count"
    return resolve_difficulty(difficulty)


def split_of(difficulty: str, fig: Figure) -> str:
    return "val" if zlib.crc32(f"geometry/{difficulty}/{fig}".encode()) % 100 < VAL_PERCENT else "train"


def make_geometry_rows(num: int, *, difficulty: str | int, seed: int, split: str | None = None) -> list[dict[str, Any]]:
    """`num` verl-format image rows; `split` 'train'/'val' keeps to that split's figures, None mixes."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if split not in (None, "train", "val"):
        raise ValueError(f"split must be 'train', 'val' or None, got {split!r}")
    name = resolve_level(difficulty)
    pool = [f for f in _figures(name) if split is None or split_of(name, f) == split]
    rng = random.Random(f"geometry/{name}/{split}/{seed}")
    figs: list[Figure] = []
    while len(figs) < num:
        perm = pool[:]
        rng.shuffle(perm)
        figs.extend(perm)
    rows = []
    for i, fig in enumerate(figs[:num]):
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": IMAGE_PLACEHOLDER + QUESTIONS[name]}],
            "images": [{"bytes": png_bytes(render(name, fig)), "path": None}],
            "ability": "geometry",
            "reward_model": {"style": "rule", "ground_truth": str(answer_of(name, fig))},
            "extra_info": {"split": split or "all", "index": i, "difficulty": name, "figure": list(fig)},
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data.synthetic_geometry", description=__doc__.split("\n")[0])
    parser.add_argument("--difficulty", default="easy", help=" | ".join(LEVELS) + " (or 0 | 1 | 2 | 3)")
    parser.add_argument("--num-train", type=int, default=512)
    parser.add_argument("--num-val", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output directory for train.parquet and val.parquet")
    args = parser.parse_args(argv)
    return write_splits(make_geometry_rows, args, "parquet")


if __name__ == "__main__":
    sys.exit(main())
