"""Programmatic entry point: `train(cfg)` runs a whole training job and returns its metrics path.

    from trainer.config import load_config
    from trainer.api import train
    train(load_config("trainer/configs/grpo_smollm2_arithmetic.yaml", ["trainer.total_steps=5"]))
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trainer.config import TrainerConfig


def train(cfg: TrainerConfig) -> Path:
    """Run the configured job (colocated or fully-async) and return `<out_dir>/metrics.jsonl`."""
    from trainer.backends.strategy import check_strategy

    check_strategy(cfg)  # actor.strategy: never a silent fallback to another backend
    out_dir = Path(cfg.trainer.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    from trainer.platform import prepare_run_env

    env = prepare_run_env(cfg.rollout.engine)  # ROCm/AITER defaults (user settings win), then recorded
    (out_dir / "env.json").write_text(json.dumps(env, indent=2, default=str))
    if cfg.trainer.mode == "fully_async":
        from trainer.modes.fully_async import train_fully_async

        return train_fully_async(cfg)
    from trainer.distributed.colocated_ray import train_colocated_ray, uses_ray

    if uses_ray(cfg):  # several devices (or trainer.use_ray): Ray workers with FSDP2 across them
        return train_colocated_ray(cfg)
    from trainer.modes.colocated import train_colocated
    from trainer.steps import build_components

    return train_colocated(build_components(cfg))
