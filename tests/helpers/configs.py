"""Small trainer configs on a tiny random-init model that run in seconds on a CPU."""

from __future__ import annotations

from typing import Any


def tiny_config(out_dir: str, **sections: Any) -> dict[str, Any]:
    """A complete trainer config dict for `tiny:qwen2` on synthetic addition; `sections` deep-merge over it."""
    from trainer.config import deep_merge

    base: dict[str, Any] = {
        "model": {"path": "tiny:qwen2", "dtype": "float32"},
        "data": {"train_files": "synthetic:arithmetic-easy?num=64&num_val=8", "max_prompt_length": 64,
                 "max_response_length": 6, "train_batch_size": 4},
        "rollout": {"engine": "hf", "n": 4, "temperature": 1.0},
        "algorithm": {"name": "grpo", "adv_estimator": "grpo"},
        "actor": {"lr": 1e-3, "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 8},
        "trainer": {"total_steps": 3, "test_freq": 2, "save_freq": 0, "out_dir": out_dir, "device": "cpu",
                    "progress": False, "seed": 0},
    }
    return deep_merge(base, sections)
