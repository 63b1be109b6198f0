"""verl-format loading and validation, prompt tokenization, and the resumable sampler."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.data import (
    PromptDataset,
    load_rows,
    make_arithmetic_rows,
    tokenize_prompt,
    validate_rows,
    write_rows,
)
from trainer.data.dataset import to_python
from trainer.data.sampler import EpochSampler
from trainer.data.tiny_tokenizer import IM_END, PAD_TOKEN, build_tiny_tokenizer
from trainer.errors import DataError


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return build_tiny_tokenizer()


def _row(i: int, content: str = "What is 1 + 1?") -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i, "tags": ["a", "b"]},
    }


# ---------------------------------------------------------------- files
@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_roundtrip_through_verl_format(tmp_path: Path, suffix: str) -> None:
    rows = [_row(i) for i in range(5)]
    path = write_rows(rows, tmp_path / f"d{suffix}")
    back = load_rows(path)
    assert back == rows  # plain lists and dicts again, numpy arrays converted
    assert type(back[0]["prompt"]) is list and type(back[0]["extra_info"]["tags"]) is list


def test_parquet_really_returns_numpy_and_it_is_converted(tmp_path: Path) -> None:
    import pandas as pd

    path = write_rows([_row(0)], tmp_path / "d.parquet")
    raw = pd.read_parquet(path).to_dict(orient="records")[0]
    assert isinstance(raw["prompt"], np.ndarray)  # what pandas hands back
    assert to_python(raw)["prompt"][1] == {"role": "user", "content": "What is 1 + 1?"}
    assert to_python({"x": np.int64(3), "y": np.array([1, 2])}) == {"x": 3, "y": [1, 2]}


def test_missing_file_names_path_and_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(DataError, match=r"data file not found: data.train_files: .*nope.parquet \(fix:"):
        load_rows(missing, field="data.train_files")


def test_empty_dataset_names_path(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="empty.jsonl: dataset is empty"):
        load_rows(path)


def test_unsupported_suffix(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_rows(path)


def test_bad_json_line_names_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n{oops\n")
    with pytest.raises(DataError, match="d.jsonl line 2: not valid JSON"):
        load_rows(path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(prompt="What is 2+2?"), "row 17: 'prompt' must be a list of {role, content} messages"),
        (lambda r: r.update(prompt=[{"role": "user"}]), "row 17: 'prompt' must be a list"),
        (lambda r: r.update(prompt=[]), "row 17: 'prompt' must be a list"),
        (lambda r: r.pop("data_source"), "row 17: 'data_source' must be a non-empty string"),
        (lambda r: r.update(reward_model={"style": "rule"}), "row 17: 'reward_model' must be a mapping with a 'ground_truth'"),
        (lambda r: r["reward_model"].update(ground_truth=["1", "2"]), "row 17: 'reward_model.ground_truth' must be"),
        (lambda r: r.update(extra_info=[1]), "row 17: 'extra_info' must be a mapping"),
    ],
)
def test_malformed_row_names_file_row_and_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    rows = [_row(i) for i in range(20)]
    mutate(rows[17])
    path = tmp_path / "x.jsonl"
    write_rows(rows, path)
    with pytest.raises(DataError) as info:
        load_rows(path, field="data.train_files")
    msg = str(info.value)
    assert msg.startswith(f"data.train_files: {path} row 17:"), msg
    assert message in msg and "\n" not in msg


def test_optional_fields_and_numeric_ground_truth() -> None:
    row = {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": 7}}
    (out,) = validate_rows([row], "<mem>")
    assert out["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert out["extra_info"] == {} and out["ability"] == ""


def test_synthetic_spec_through_load_rows() -> None:
    rows = load_rows("synthetic:arithmetic-medium?num=12&seed=3")
    assert len(rows) == 12 and all(r["extra_info"]["split"] == "train" for r in rows)
    val = load_rows("synthetic:arithmetic-medium?num=5&seed=3&split=val")
    assert len(val) == 5 and all(r["extra_info"]["split"] == "val" for r in val)


# ---------------------------------------------------------------- tokenization
def test_tiny_tokenizer_specials_and_roundtrip(tok) -> None:  # type: ignore[no-untyped-def]
    assert tok.eos_token == IM_END and tok.pad_token == PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    for text in ["What is 12 * 34 + 56?", "héllo — wörld −3 ✓ \t\n", "<|im_start|>user\nhi<|im_end|>"]:
        assert tok.decode(tok.encode(text)) == text
    assert all(len(tok.encode(d)) == 1 for d in "0123456789")
    assert tok.convert_ids_to_tokens(tok.encode("123")) == ["1", "2", "3"]  # one digit per token


def test_tiny_tokenizer_is_deterministic(tok) -> None:  # type: ignore[no-untyped-def]
    assert build_tiny_tokenizer().get_vocab() == tok.get_vocab()


def test_chat_template_applied(tok) -> None:  # type: ignore[no-untyped-def]
    ids = tokenize_prompt(tok, [{"role": "user", "content": "What is 3 + 5?"}])
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 3 + 5?<|im_end|>\n<|im_start|>assistant\n"


def test_plain_text_fallback_without_chat_template(tok) -> None:  # type: ignore[no-untyped-def]
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 5?"}]
    assert plain.decode(tokenize_prompt(plain, msgs)) == "system: Be brief.\nuser: What is 3 + 5?\nassistant:"


def test_dataset_items_and_overlong_filter(tok) -> None:  # type: ignore[no-untyped-def]
    rows = [_row(0, "short"), _row(1, "long " * 50), _row(2, "short too")]
    ds = PromptDataset(rows, tok, max_prompt_length=100, batch_size=1, shuffle=False)
    assert ds.num_filtered == 1 and len(ds) == 2
    first = ds[0]
    assert set(first) == {"prompt_ids", "data_source", "ground_truth", "extra_info", "index"}
    assert first["prompt_ids"] == tokenize_prompt(tok, rows[0]["prompt"])
    assert (first["data_source"], first["ground_truth"], first["index"]) == ("openai/gsm8k", "0", 0)
    assert ds[1]["index"] == 2  # index keeps the original row position after filtering
    with pytest.raises(DataError, match=r"row 1: prompt is \d+ tokens, over data.max_prompt_length=100"):
        PromptDataset(rows, tok, max_prompt_length=100, batch_size=1, filter_overlong_prompts=False)
    with pytest.raises(DataError, match="all 3 prompts are longer"):
        PromptDataset(rows, tok, max_prompt_length=3, batch_size=1)


def test_sequential_iteration_covers_all_rows(tok) -> None:  # type: ignore[no-untyped-def]
    ds = PromptDataset([_row(i) for i in range(7)], tok, max_prompt_length=64, batch_size=3)
    sizes = [len(b) for b in ds]
    assert sizes == [3, 3, 1]
    assert [item["index"] for batch in ds for item in batch] == list(range(7))


# ---------------------------------------------------------------- sampler
def _draw(sampler: EpochSampler, n: int) -> list[list[int]]:
    return [sampler.next_indices() for _ in range(n)]


def test_sampler_epochs_are_permutations_and_seeded() -> None:
    s = EpochSampler(10, 3, seed=7)
    batches = _draw(s, 3)
    seen = sorted(i for b in batches for i in b)
    assert len(set(seen)) == 9 and all(0 <= i < 10 for i in seen)  # 3 batches, tail of 1 dropped
    assert s.epoch == 0
    s.next_indices()
    assert s.epoch == 1 and s.position == 3
    again = _draw(EpochSampler(10, 3, seed=7), 3)
    other = _draw(EpochSampler(10, 3, seed=8), 3)
    assert again == batches and other != batches


def test_sampler_without_shuffle_is_in_order() -> None:
    assert _draw(EpochSampler(5, 2, shuffle=False), 3) == [[0, 1], [2, 3], [0, 1]]


def test_sampler_resume_matches_uninterrupted_run() -> None:
    full = _draw(EpochSampler(11, 4, seed=3), 9)  # crosses several epochs
    first = EpochSampler(11, 4, seed=3)
    head = _draw(first, 4)
    state = first.state_dict()
    resumed = EpochSampler(11, 4, seed=999)  # seed comes from the state
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert head + _draw(resumed, 5) == full


def test_sampler_state_for_another_dataset_is_rejected() -> None:
    state = EpochSampler(11, 4).state_dict()
    with pytest.raises(DataError, match="saved for 11 prompts but the dataset now has 12"):
        EpochSampler(12, 4).load_state_dict(state)


def test_batch_larger_than_dataset() -> None:
    with pytest.raises(DataError, match="fewer than one batch of 8 .*data.train_batch_size"):
        EpochSampler(5, 8)


def test_dataset_state_resume(tok) -> None:  # type: ignore[no-untyped-def]
    rows = make_arithmetic_rows(20, difficulty="easy", seed=0, split="train")

    def make() -> PromptDataset:
        return PromptDataset(rows, tok, max_prompt_length=64, batch_size=6, seed=5)

    uninterrupted = make()
    ref = [[it["index"] for it in uninterrupted.next_batch()] for _ in range(7)]
    ds = make()
    head = [[it["index"] for it in ds.next_batch()] for _ in range(3)]
    state = ds.state_dict()
    ds2 = make()
    ds2.load_state_dict(state)
    tail = [[it["index"] for it in ds2.next_batch()] for _ in range(4)]
    assert head + tail == ref
    assert ds2.epoch == 2  # 3 batches per epoch; the 7th batch is in epoch 2
