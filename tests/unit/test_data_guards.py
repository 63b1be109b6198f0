"""Size guards of `trainer/data/dataset.py`: a 20 MB .jsonl line is dropped unread with a warning, and a
prompt far over max_prompt_length is counted overlong without reaching the tokenizer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainer.data import dataset
from trainer.data.dataset import MAX_ROW_BYTES, PromptDataset, load_rows
from trainer.errors import DataError

ROW = {"data_source": "synthetic/arithmetic", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
       "reward_model": {"style": "rule", "ground_truth": "2"}}


def _big_row(chars: int) -> dict:
    return dict(ROW, prompt=[{"role": "user", "content": "x" * chars}])


def test_a_20mb_line_is_dropped_unread_with_a_warning(tmp_path: Path, caplog, monkeypatch):
    path = tmp_path / "rows.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(ROW) + "\n")
        f.write(json.dumps(_big_row(20 << 20)) + "\n")
        f.write(json.dumps(ROW) + "\n")
    parsed: list[int] = []
    real_loads = json.loads
    monkeypatch.setattr(dataset.json, "loads", lambda s, *a, **k: parsed.append(len(s)) or real_loads(s, *a, **k))
    with caplog.at_level(logging.WARNING, logger="trainer.data.dataset"):
        rows = load_rows(path)
    assert len(rows) == 2
    assert max(parsed) < 1000  # the big line was never parsed (nor held whole: read in bounded chunks)
    assert "line 2" in caplog.text and "20.0 MiB" in caplog.text and f"{MAX_ROW_BYTES >> 20} MiB limit" in caplog.text


class _CountingTokenizer:
    """Stands in for a tokenizer: no chat template, one token per character, counts the characters it sees."""

    chat_template = None
    pad_token_id = 0

    def __init__(self) -> None:
        self.seen = 0

    def encode(self, text: str) -> list[int]:
        self.seen = max(self.seen, len(text))
        return [1] * len(text)


def test_a_huge_prompt_is_overlong_without_tokenizing(caplog):
    tok = _CountingTokenizer()
    with caplog.at_level(logging.WARNING, logger="trainer.data.dataset"):
        ds = PromptDataset([ROW, _big_row(1 << 20), ROW], tok, max_prompt_length=64, batch_size=1, shuffle=False)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert tok.seen < 1000  # the 1 MB prompt never reached the tokenizer
    assert "dropped 1 of 3" in caplog.text and "not tokenized" in caplog.text


def test_a_huge_prompt_without_filtering_is_an_error_naming_the_row():
    with pytest.raises(DataError, match=r"row 1: prompt is 1048576 characters, far over data.max_prompt_length=64"):
        PromptDataset([ROW, _big_row(1 << 20)], _CountingTokenizer(), max_prompt_length=64, batch_size=1,
                      filter_overlong_prompts=False)
