"""Image rows in verl's format: parquet round trip, the synthetic geometry task, one-line errors."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL", reason="image rows need Pillow (a base dependency: pip install pillow)")

from trainer.data.dataset import PromptDataset, load_rows, validate_rows  # noqa: E402
from trainer.data.multimodal import decode_image, png_bytes  # noqa: E402
from trainer.data.splits import write_rows  # noqa: E402
from trainer.data.synthetic import ensure_synthetic  # noqa: E402
from trainer.data.synthetic_geometry import _figures, answer_of, make_geometry_rows, render, split_of  # noqa: E402
from trainer.errors import DataError  # noqa: E402


def _row(images, content="<image>How long is it?"):
    return {"data_source": "synthetic/geometry", "prompt": [{"role": "user", "content": content}],
            "images": images, "reward_model": {"ground_truth": "3"}}


def test_geometry_rows_round_trip_through_parquet(tmp_path):
    rows = make_geometry_rows(6, difficulty="medium", seed=3, split="train")
    path = write_rows(rows, tmp_path / "train.parquet")
    back = load_rows(path)
    assert len(back) == 6
    for row, orig in zip(back, rows):
        (img,) = row["images"]
        assert img.size == (48, 48) and img.mode == "RGB"
        assert png_bytes(img) == png_bytes(decode_image(orig["images"][0]["bytes"], "x"))  # same pixels
        assert row["reward_model"]["ground_truth"] == orig["reward_model"]["ground_truth"]


def test_geometry_answer_is_in_the_pixels():
    # easy: a segment of n cells has n * CELL + 1 dark pixels along its line (3 px wide)
    for fig in [(0, 3, 1, 2), (1, 5, 0, 4)]:
        img = render("easy", fig)
        dark = sum(1 for x in range(48) for y in range(48) if img.getpixel((x, y))[0] < 100)
        assert answer_of("easy", fig) == fig[1]
        assert abs(dark - 3 * (fig[1] * 8 + 1)) <= 3
    # medium: a w x h rectangle covers w * h cells of 64 px each
    img = render("medium", (2, 3, 1, 1))
    dark = sum(1 for x in range(48) for y in range(48) if img.getpixel((x, y))[0] < 100)
    assert dark == 6 * 64 and answer_of("medium", (2, 3, 1, 1)) == 6


def test_geometry_count_level_is_balanced_and_counted_in_the_pixels():
    from collections import Counter

    figs = _figures("count")
    assert Counter(f[0] for f in figs) == {1: 121, 2: 121, 3: 121, 4: 121}  # always one answer scores 0.25
    for fig in figs[::37]:  # k squares of 64 black pixels each, none overlapping
        img = render("count", fig)
        dark = sum(1 for x in range(48) for y in range(48) if img.getpixel((x, y))[0] < 100)
        assert dark == 64 * fig[0] == 64 * answer_of("count", fig)
    train, val = ensure_synthetic("synthetic:geometry-count?num=64&num_val=16&seed=0")
    assert {r["reward_model"]["ground_truth"] for r in train} == {"1", "2", "3", "4"}
    assert all(split_of("count", tuple(r["extra_info"]["figure"])) == "val" for r in val)


def test_geometry_splits_are_disjoint():
    train, val = ensure_synthetic("synthetic:geometry-easy?num=100&num_val=20&seed=1")
    key = lambda r: tuple(r["extra_info"]["figure"])  # noqa: E731
    assert {key(r) for r in train}.isdisjoint({key(r) for r in val})
    assert all(split_of("easy", key(r)) == "train" for r in train)
    assert len({key(r) for r in train}) == len(train)  # distinct while the split has unused figures
    assert len([f for f in _figures("easy") if split_of("easy", f) == "train"]) >= 100


def test_image_path_relative_to_the_data_file(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png_bytes(render("easy", (0, 2, 0, 1))))
    path = write_rows([_row([{"bytes": None, "path": "img/a.png"}]), _row(["img/a.png"])], tmp_path / "d.jsonl")
    rows = load_rows(path)
    assert [r["images"][0].size for r in rows] == [(48, 48), (48, 48)]


@pytest.mark.parametrize("images, content, message", [
    ([], "<image>How long?", "has 1 <image> placeholder(s) but 'images' has 0 image(s)"),
    ([b"\x89PNG"] * 2, "<image>How long?", "has 1 <image> placeholder(s) but 'images' has 2 image(s)"),
    ([b"not an image"], "<image>How long?", "row 0 images[0]: image bytes do not decode"),
    ([{"path": "missing.png"}], "<image>x", "row 0 images[0]: image file not found"),
    ([{"bytes": None, "path": None}], "<image>x", "images[0]: image has neither 'bytes' nor 'path'"),
    ([3], "<image>x", "images[0]: an image must be bytes, a path string or a mapping"),
    ("a.png", "<image>x", "'images' must be a list of images"),
])
def test_malformed_image_rows_are_one_line_errors(tmp_path, images, content, message):
    with pytest.raises(DataError) as err:
        validate_rows([_row(images, content)], "d.parquet", "data.train_files", base_dir=tmp_path)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert text.startswith("data.train_files: d.parquet row 0")


def test_image_rows_need_a_vision_language_model():
    from trainer.data.tiny_tokenizer import build_tiny_tokenizer

    rows = make_geometry_rows(2, difficulty="easy", seed=0)
    with pytest.raises(DataError, match="row 0: has 1 image\\(s\\) but the model is text-only"):
        PromptDataset(rows, build_tiny_tokenizer(), max_prompt_length=64, batch_size=2)


def test_vllm_prompt_has_one_placeholder_per_image():
    from trainer.rollout.multimodal_prompts import check_expansion, collapse_image_tokens, vllm_prompt

    pad = 7
    ids = [1, 5, pad, pad, pad, 6, 2, 5, pad, pad, 6, 3]  # two images: 3 and 2 tokens
    assert collapse_image_tokens(ids, pad) == [1, 5, pad, 6, 2, 5, pad, 6, 3]
    prompt = vllm_prompt(ids, ["img0", "img1"], pad)
    assert prompt == {"prompt_token_ids": [1, 5, pad, 6, 2, 5, pad, 6, 3], "multi_modal_data": {"image": ["img0", "img1"]}}
    with pytest.raises(ValueError, match="2 image placeholder\\(s\\) for 1 image"):
        vllm_prompt(ids, ["img0"], pad)
    check_expansion(ids, list(ids))
    with pytest.raises(ValueError, match="expanded the image prompt to 11 tokens, the trainer to 12 .*token 4"):
        check_expansion(ids, ids[:4] + ids[5:])
