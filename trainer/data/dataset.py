"""verl-format prompt datasets: read and validate rows, tokenize prompts, serve seeded batches.

A row (one prompt) in verl's format, as stored in ``.parquet``, ``.jsonl`` or ``.json``:

    {"data_source": "openai/gsm8k",                       # picks the reward function
     "prompt": [{"role": "user", "content": "..."}],      # chat messages
     "ability": "math",                                   # optional
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0}}        # optional, passed to the reward

`load_rows(path)` reads a file (or a ``synthetic:...`` spec, see `trainer.data.synthetic`) and
validates every row; bad input raises `DataError` naming the file, the row index and the field.
Parquet hands back nested lists as numpy arrays; rows are converted to plain Python first.

`PromptDataset` tokenizes each prompt with `trainer.data.chat.tokenize_prompt` (the tokenizer's chat
template, or a plain-text fallback). Prompts longer than `max_prompt_length`
tokens are dropped and counted (`num_filtered`), or are an error with
``filter_overlong_prompts=False``. `next_batch()` serves training batches from a seeded
`EpochSampler` whose state resumes exactly; iterating the dataset gives one pass in row order
(validation).

Each item: ``{"prompt_ids": list[int], "data_source": str, "ground_truth": str,
"extra_info": dict, "index": int}`` where ``index`` is the row's position in the input.

Images (`trainer.data.multimodal`): a row may carry verl's ``images`` list beside ``prompt``,
one ``<image>`` placeholder per image in the messages; they are validated and decoded with the
row. `PromptDataset(..., processor=VisionProcessor)` then expands the placeholders into image
tokens and adds ``"multi_modal_inputs"`` (``pixel_values``, ``image_grid_thw``) and ``"images"``
to the item; image rows without a processor (a text-only model) are an error.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.chat import tokenize_prompt
from trainer.data.multimodal import IMAGE_KEY, validate_images
from trainer.data.sampler import EpochSampler
from trainer.errors import DataError

log = logging.getLogger(__name__)

_SUFFIXES = (".parquet", ".jsonl", ".json")
ROLES = ("system", "user", "assistant", "tool")
# Size guards: a .jsonl line over MAX_ROW_BYTES is dropped unread (bounded memory), and a prompt whose
# text is over MAX_CHARS_PER_TOKEN characters per allowed token is counted overlong without tokenizing
# (bounded time: a 20 MB prompt is not fed to the chat template to find out it does not fit).
MAX_ROW_BYTES = 16 << 20
MAX_CHARS_PER_TOKEN = 32


def to_python(value: Any) -> Any:
    """Numpy arrays/scalars (as parquet returns them) -> lists/Python scalars, recursively."""
    if isinstance(value, np.ndarray):
        return [to_python(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    return value


def _where(source: str, field: str | None) -> str:
    return f"{field}: {source}" if field else source


def validate_row(row: Any, where: str, base_dir: Path | None = None) -> dict[str, Any]:
    """One row checked and normalized; `where` is ``"<field>: <path> row <i>"`` for messages;
    `base_dir` resolves relative image paths."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: must be a mapping with data_source, prompt, reward_model (got {type(row).__name__}) (fix: one JSON object per row, in verl's format)")
    row = to_python(row)
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        raise DataError(f"{where}: 'data_source' must be a non-empty string naming the reward function "
                        "(fix: e.g. 'openai/gsm8k'; trainer.rewards.known_data_sources() lists them)")
    prompt = row.get("prompt")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in prompt)
    ):
        bad = next((j for j, m in enumerate(prompt) if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)
                                                             and isinstance(m.get("content"), str))), None) \
            if isinstance(prompt, list) else None
        at = f" (message {bad} is not {{role: str, content: str}})" if bad is not None else ""
        raise DataError(f"{where}: 'prompt' must be a list of {{role, content}} messages{at} "
                        "(fix: at least one, e.g. [{\"role\": \"user\", \"content\": \"What is 2 + 2?\"}])")
    for j, m in enumerate(prompt):
        if m["role"] not in ROLES:
            raise DataError(f"{where}: 'prompt[{j}].role' is {m['role']!r}, not a chat role (fix: use one of "
                            f"{', '.join(ROLES)})")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise DataError(f"{where}: 'reward_model' must be a mapping with a 'ground_truth' key "
                        "(fix: e.g. {\"style\": \"rule\", \"ground_truth\": \"72\"})")
    truth = reward_model["ground_truth"]
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        raise DataError(f"{where}: 'reward_model.ground_truth' must be a string or number, got {type(truth).__name__} (fix: the answer as a string, e.g. \"72\")")
    if isinstance(truth, float) and not math.isfinite(truth):
        raise DataError(f"{where}: 'reward_model.ground_truth' is {truth}, no answer can match it (fix: give the "
                        "row its real answer, or drop the row)")
    if isinstance(truth, str) and (not truth.strip() or truth.strip().lower() in ("nan", "none", "null")):
        raise DataError(f"{where}: 'reward_model.ground_truth' is {truth!r}, no answer can match it (fix: give the "
                        "row its real answer, or drop the row)")
    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, Mapping):
        raise DataError(f"{where}: 'extra_info' must be a mapping or absent (fix: e.g. {{\"index\": 0}}, or drop it)")
    ability = row.get("ability")
    images = validate_images(row, prompt, where, base_dir)
    return {
        "data_source": source,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "ability": ability if isinstance(ability, str) else "",
        "reward_model": {"style": reward_model.get("style") or "rule", "ground_truth": str(truth)},
        "extra_info": dict(extra_info),
        **({IMAGE_KEY: images} if images else {}),
    }


def validate_rows(rows: Sequence[Any], source: str, field: str | None = None,
                  base_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every row validated (see `validate_row`); DataError when there are none."""
    if len(rows) == 0:
        raise DataError(f"{_where(source, field)}: dataset is empty (fix: point it at a file with rows)")
    return [validate_row(row, f"{_where(source, field)} row {i}", base_dir) for i, row in enumerate(rows)]


def _read_file(path: Path, where: str) -> list[Any]:
    try:
        if path.suffix == ".parquet":
            import pandas as pd

            return pd.read_parquet(path).to_dict(orient="records")
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if not isinstance(data, list):
                raise DataError(f"{where}: a .json dataset must hold a list of rows (fix: or use .jsonl)")
            return data
        return _read_jsonl(path, where)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any pyarrow/OS error means an unreadable file
        raise DataError(f"{where}: cannot read ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}) "
                        "(fix: check the file is a valid verl dataset)") from None


def _skip_rest_of_line(f: Any) -> int:
    """Read past the rest of an over-long line in bounded chunks; the bytes skipped."""
    skipped = 0
    while chunk := f.readline(1 << 20):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _read_jsonl(path: Path, where: str) -> list[Any]:
    """One row per non-empty line; a line over MAX_ROW_BYTES is dropped with a warning (never held whole)."""
    rows: list[Any] = []
    with path.open("rb") as f:
        lineno = 0
        while line := f.readline(MAX_ROW_BYTES + 1):
            lineno += 1
            if len(line) > MAX_ROW_BYTES and not line.endswith(b"\n"):
                size = len(line) + _skip_rest_of_line(f)
                log.warning("%s line %d: %.1f MiB, over the %d MiB limit of one row: dropped", where, lineno,
                            size / 2**20, MAX_ROW_BYTES >> 20)
                continue
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
                raise DataError(f"{where} line {lineno}: not valid JSON ({msg}) (fix: one JSON object per line)") from None
    return rows


def load_rows(path: str | Path, *, field: str | None = None) -> list[dict[str, Any]]:
    """Validated rows from a ``.parquet``/``.jsonl``/``.json`` file or a ``synthetic:`` spec.

    `field` (e.g. ``"data.train_files"``) prefixes error messages so they name the config key.
    """
    if isinstance(path, str) and path.startswith("synthetic:"):
        from trainer.data.synthetic import load_synthetic

        return validate_rows(load_synthetic(path), path, field)
    path = Path(path).expanduser()
    where = _where(str(path), field)
    if path.is_dir():
        raise DataError(f"{where}: is a directory, not a data file (fix: name a .parquet, .jsonl or .json file in it)")
    if not path.is_file():
        raise DataError(f"data file not found: {where} (fix: check the path, or use synthetic:arithmetic-easy)")
    if path.suffix not in _SUFFIXES:
        raise DataError(f"{where}: unsupported file type {path.suffix!r} (fix: use .parquet, .jsonl or .json)")
    return validate_rows(_read_file(path, where), str(path), field, base_dir=path.parent)


class PromptDataset:
    """Tokenized prompts plus a resumable, seeded batch sampler (see the module docstring)."""

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        *,
        max_prompt_length: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        filter_overlong_prompts: bool = True,
        source: str = "<rows>",
        field: str | None = None,
        processor: Any = None,
    ) -> None:
        where = _where(source, field)
        rows = validate_rows(rows, source, field)
        from trainer.rewards.registry import get_scorer

        for ds, i in {r["data_source"]: i for i, r in reversed(list(enumerate(rows)))}.items():
            try:  # at start, not at the first scoring after a model load and a rollout
                get_scorer(ds)
            except DataError as exc:
                raise DataError(f"{where} row {i}: {exc}") from None
        self.items: list[dict[str, Any]] = []
        self.num_filtered = 0
        longest = unread = 0
        for i, row in enumerate(rows):
            images = row.get("images") or []
            if images and processor is None:
                raise DataError(f"{where} row {i}: has {len(images)} image(s) but the model is text-only "
                                "(fix: use a vision-language model.path, e.g. tiny:qwen2.5-vl, or text rows)")
            mm = None
            chars = sum(len(m["content"]) for m in row["prompt"])
            if not images and chars > max_prompt_length * MAX_CHARS_PER_TOKEN:  # cannot fit: not tokenized
                if not filter_overlong_prompts:
                    raise DataError(
                        f"{where} row {i}: prompt is {chars} characters, far over data.max_prompt_length="
                        f"{max_prompt_length} tokens (fix: shorten it or set data.filter_overlong_prompts=true)")
                self.num_filtered += 1
                unread += 1
                continue
            try:
                if images:
                    ids, mm = processor.encode_prompt(tokenizer, row["prompt"], images)
                else:
                    ids = tokenize_prompt(tokenizer, row["prompt"])
            except DataError as exc:
                raise DataError(f"{where} row {i}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - jinja errors from a template that rejects the messages
                raise DataError(f"{where} row {i}: chat template failed on 'prompt' ({exc}) "
                                "(fix: use roles the model's template accepts)") from None
            if len(ids) > max_prompt_length:
                if not filter_overlong_prompts:
                    raise DataError(
                        f"{where} row {i}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                        f"{max_prompt_length} (fix: raise data.max_prompt_length or set data.filter_overlong_prompts=true)"
                    )
                self.num_filtered += 1
                longest = max(longest, len(ids))
                continue
            self.items.append(
                {
                    "prompt_ids": ids,
                    "data_source": row["data_source"],
                    "ground_truth": row["reward_model"]["ground_truth"],
                    "extra_info": row["extra_info"],
                    "index": i,
                    **({"multi_modal_inputs": mm, "images": images} if mm is not None else {}),
                }
            )
        if self.num_filtered:
            log.warning("%s: dropped %d of %d prompts longer than max_prompt_length=%d tokens (longest tokenized %d; "
                        "%d over %d characters not tokenized)", where, self.num_filtered, len(rows), max_prompt_length,
                        longest, unread, max_prompt_length * MAX_CHARS_PER_TOKEN)
        if not self.items:
            raise DataError(f"{where}: all {len(rows)} prompts are longer than data.max_prompt_length="
                            f"{max_prompt_length} tokens (fix: raise data.max_prompt_length)")
        self.batch_size = batch_size
        self.sampler = EpochSampler(len(self.items), batch_size, seed=seed, shuffle=shuffle)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        """One pass in row order, `batch_size` items at a time, last batch possibly short."""
        for start in range(0, len(self.items), self.batch_size):
            yield self.items[start : start + self.batch_size]

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def next_batch(self) -> list[dict[str, Any]]:
        """The next training batch (`batch_size` items); moves to the next epoch when needed."""
        return [self.items[i] for i in self.sampler.next_indices()]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
