"""Images in verl's row format: read, validate, and turn into a vision-language model's inputs.

A multimodal row is a text row (`trainer.data.dataset`) plus an ``images`` list, as verl's
``examples/data_preprocess/geo3k.py`` writes it:

    {"data_source": "hiyouga/geometry3k",
     "prompt": [{"role": "user", "content": "<image>Find x. ..."}],   # one <image> per image
     "images": [{"bytes": b"\\x89PNG...", "path": None}],              # or {"path": "img/0.png"}, or "img/0.png"
     "reward_model": {"style": "rule", "ground_truth": "3"}, ...}

Each entry is a mapping with ``bytes`` (an encoded PNG/JPEG/...; what the HF ``datasets`` Image
feature stores in parquet) and/or ``path``, a plain path string, raw bytes, or an already decoded PIL image. A relative path is
resolved against the data file's folder. Checks, each a one-line `DataError` naming the file, row
and field: ``images`` must be a list; each entry must be readable (path found) and decode as an
image (Pillow); the number of ``<image>`` placeholders in the prompt's messages must equal the
number of images. Decoded images are converted to RGB.

Model inputs (`VisionProcessor.encode_prompt`, Qwen2-VL / Qwen2.5-VL conventions): each
``<image>`` becomes ``<|vision_start|><|image_pad|><|vision_end|>`` in the message text, the chat
template renders the prompt, and the one ``<|image_pad|>`` id of image i is repeated
``grid_thw[i].prod() // merge_size**2`` times, the number of features the vision tower's patch
merger outputs for it (what the transformers Qwen2-VL processor does to the text). The image
processor (transformers' `Qwen2VLImageProcessorPil`) gives ``pixel_values [num_patches, C*T*P*P]``
and ``image_grid_thw [num_images, 3]``; these two are a prompt's ``multi_modal_inputs`` (verl's name).

Needs Pillow (`pip install pillow`; a base dependency of the project).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.data.chat import tokenize_prompt
from trainer.errors import DataError

IMAGE_PLACEHOLDER = "<image>"
IMAGE_KEY = "images"


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DataError("image rows need Pillow (fix: pip install pillow)") from None
    return Image


def decode_image(data: bytes, where: str) -> Any:
    """Encoded image bytes -> an RGB PIL image; DataError naming `where` when they do not decode."""
    Image = _pil()
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for corrupt data
        raise DataError(f"{where}: image bytes do not decode ({type(exc).__name__}) "
                        "(fix: store PNG/JPEG bytes, e.g. as written by the datasets Image feature)") from None
    return img.convert("RGB")


def _entry_bytes(entry: Any, where: str, base_dir: Path | None) -> bytes:
    if isinstance(entry, (bytes, bytearray)):
        return bytes(entry)
    path = None
    if isinstance(entry, Mapping):
        data = entry.get("bytes")
        if isinstance(data, (bytes, bytearray)) and data:
            return bytes(data)
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise DataError(f"{where}: image has neither 'bytes' nor 'path' (fix: give the encoded image or its file path)")
    elif isinstance(entry, str):
        path = entry
    else:
        raise DataError(f"{where}: an image must be bytes, a path string or a mapping with 'bytes'/'path' "
                        f"(got {type(entry).__name__})")
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if not p.is_file():
        raise DataError(f"{where}: image file not found: {p} (fix: check the path; relative paths are read from the "
                        "data file's folder)")
    return p.read_bytes()


def count_placeholders(messages: Sequence[Mapping[str, str]]) -> int:
    return sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)


def validate_images(row: Mapping[str, Any], messages: Sequence[Mapping[str, str]], where: str,
                    base_dir: Path | None = None) -> list[Any]:
    """The row's images decoded to RGB PIL images ([] for a text row), checked against the placeholders."""
    images = row.get(IMAGE_KEY)
    num_placeholders = count_placeholders(messages)
    if images is None:
        images = []
    if not isinstance(images, list):
        raise DataError(f"{where}: '{IMAGE_KEY}' must be a list of images (got {type(images).__name__})")
    if len(images) != num_placeholders:
        raise DataError(f"{where}: 'prompt' has {num_placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but "
                        f"'{IMAGE_KEY}' has {len(images)} image(s) (fix: put one {IMAGE_PLACEHOLDER} in the messages "
                        "per image)")
    out = []
    for i, e in enumerate(images):
        if _is_pil(e):  # rows validated before (load_rows, then a dataset): already decoded
            out.append(e.convert("RGB"))
        else:
            out.append(decode_image(_entry_bytes(e, f"{where} {IMAGE_KEY}[{i}]", base_dir), f"{where} {IMAGE_KEY}[{i}]"))
    return out


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "convert")


def png_bytes(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def thumbnail_b64(image: Any, max_side: int = 128) -> str:
    """A PNG thumbnail (longest side at most `max_side`) as base64 text, for run-directory samples."""
    img = image.copy()
    img.thumbnail((max_side, max_side))
    return base64.b64encode(png_bytes(img)).decode("ascii")


@dataclass
class VisionProcessor:
    """The image processor plus the prompt-side token conventions of a Qwen2-VL-family model."""

    image_processor: Any
    image_token: str = "<|image_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"
    image_token_id: int = -1
    merge_size: int = 2

    def image_text(self) -> str:
        return self.vision_start + self.image_token + self.vision_end

    def encode_images(self, images: Sequence[Any]) -> dict[str, torch.Tensor]:
        """`pixel_values [num_patches, D]` and `image_grid_thw [num_images, 3]` of a prompt's images."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"].long()}

    def encode_prompt(self, tokenizer: Any, messages: Sequence[Mapping[str, str]], images: Sequence[Any]
                      ) -> tuple[list[int], dict[str, torch.Tensor]]:
        """Prompt ids with each image's placeholder expanded to its feature count, and its `multi_modal_inputs`."""
        msgs = [{"role": m["role"], "content": m["content"].replace(IMAGE_PLACEHOLDER, self.image_text())}
                for m in messages]
        ids = tokenize_prompt(tokenizer, msgs)
        mm = self.encode_images(images)
        counts = (mm["image_grid_thw"].prod(-1) // self.merge_size ** 2).tolist()
        if ids.count(self.image_token_id) != len(counts):
            raise DataError(f"the tokenizer split {self.image_token!r} (found {ids.count(self.image_token_id)} of "
                            f"{len(counts)} image tokens) (fix: add the vision special tokens to the tokenizer)")
        out: list[int] = []
        it = iter(counts)
        for tok in ids:
            out.extend([tok] * next(it) if tok == self.image_token_id else [tok])
        return out, mm
