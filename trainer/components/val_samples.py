"""Validation samples in the run directory: what the model answered, next to the image it saw.

With ``trainer.log_val_generations: K`` (verl's name) each validation writes the first K of its
responses to ``<out_dir>/samples/step_<step>.jsonl``, one JSON object per line:

    {"step": 10,                      # the training step whose weights answered (0: before training)
     "index": 3,                      # the row's extra_info.index (else its position in this validation batch)
     "data_source": "synthetic/geometry",
     "prompt": "<|im_start|>user\\n<|vision_start|><|image_pad|>...",   # decoded prompt, image tokens collapsed to one
     "response": "4",                 # decoded response (special tokens dropped, as the reward sees it)
     "ground_truth": "3", "score": 0.0, "acc": 0.0,
     "images": ["iVBORw0KGgo..."]}    # each prompt image as a base64 PNG, longest side <= 128 px ([] for text rows)

A report renders an image with ``<img src="data:image/png;base64,{images[i]}">``. Rewriting a
step (a resumed run repeating it) replaces its file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from trainer.components.batch import Batch
from trainer.data.multimodal import thumbnail_b64


def sample_records(batch: Batch, tokenizer: Any, scores: torch.Tensor, acc: torch.Tensor, *, step: int,
                   num: int) -> list[dict[str, Any]]:
    """The first `num` responses of a scored validation batch as sample records (module docstring)."""
    p = batch.prompt_len
    out = []
    for i in range(min(num, len(batch))):
        ids = batch.input_ids[i, :p][batch.attention_mask[i, :p].bool()].tolist()
        prompt = tokenizer.decode(ids, skip_special_tokens=False)
        prompt = re.sub(r"(<\|image_pad\|>)+", "<|image_pad|>", prompt)
        images = (batch.meta.get("images") or [None] * len(batch))[i] or []
        out.append({
            "step": int(step), "index": int(batch.meta["extra_info"][i].get("index", i)),
            "data_source": batch.meta["data_source"][i], "prompt": prompt, "response": batch.meta["text"][i],
            "ground_truth": batch.meta["ground_truth"][i], "score": float(scores[i]), "acc": float(acc[i]),
            "images": [thumbnail_b64(img) for img in images],
        })
    return out


def write_samples(out_dir: str | Path, step: int, records: list[dict[str, Any]]) -> Path:
    """`<out_dir>/samples/step_<step>.jsonl` with one record per line (replaced if it exists)."""
    path = Path(out_dir) / "samples" / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    return path


def read_samples(out_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every step's sample records of a run directory, by step."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((Path(out_dir) / "samples").glob("step_*.jsonl")):
        out[int(path.stem.split("_", 1)[1])] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return dict(sorted(out.items()))
