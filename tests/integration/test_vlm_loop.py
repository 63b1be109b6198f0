"""GRPO with images end to end: the tiny Qwen2.5-VL on the synthetic geometry task in the colocated loop."""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import pytest

from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = pytest.mark.integration
pytest.importorskip("PIL", reason="image rows need Pillow (a base dependency: pip install pillow)")


def test_vlm_grpo_run_writes_metrics_and_image_samples(tmp_path: Path):
    from PIL import Image

    from trainer.api import train
    from trainer.components.val_samples import read_samples

    cfg = load_config("trainer/configs/grpo_tiny_vlm_geometry.yaml", [
        f"trainer.out_dir={tmp_path}", "trainer.total_steps=2", "trainer.test_freq=2", "trainer.save_freq=0",
        "trainer.log_val_generations=3", "data.train_files=synthetic:geometry-easy?num=32&num_val=4"])
    rows = {r["step"]: r["data"] for r in read_metrics(train(cfg))}
    assert sorted(rows) == [0, 1, 2]
    for step in (1, 2):
        m = rows[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        # on-policy: the old log-probs are the update forward's, on the same images as the engine's prefill
        assert m["training/rollout_probs_diff_max"] < 1e-4
    samples = read_samples(tmp_path)
    assert sorted(samples) == [0, 2]
    for step, records in samples.items():
        assert len(records) == 3
        for r in records:
            assert r["step"] == step and r["data_source"] == "synthetic/geometry"
            assert r["ground_truth"] in {"1", "2", "3", "4", "5"} and r["score"] in (0.0, 1.0)
            assert r["prompt"].count("<|image_pad|>") == 1  # 9 image tokens collapsed to one in the text
            (png,) = r["images"]
            assert Image.open(io.BytesIO(base64.b64decode(png))).size == (48, 48)
