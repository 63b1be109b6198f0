"""Programmatic entry point: `train(cfg)` runs a whole training job and returns its metrics path.

    from trainer.config import load_config
    from trainer.api import train
    train(load_config("trainer/configs/grpo_smollm2_arithmetic.yaml", ["trainer.total_steps=5"]))

Before anything is loaded: the start-time checks (`trainer/platform/preflight.py`), a lock on the out_dir
(a second run in the same folder is an error, not two writers of one log), and, when resuming,
the newest intact checkpoint: a run whose checkpoint is at `trainer.total_steps` says it is
complete and returns without loading a model.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from trainer.config import TrainerConfig
from trainer.errors import ConfigError

LOCK_FILE = ".lock"


@contextmanager
def out_dir_lock(out_dir: Path) -> Iterator[None]:
    """An exclusive `flock` on `<out_dir>/.lock` for the run (released by the kernel if the process dies)."""
    with (out_dir / LOCK_FILE).open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise ConfigError(f"trainer.out_dir={out_dir}: in use by a running trainer ({holder}) (fix: wait for it, "
                              f"or choose another trainer.out_dir)") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def train(cfg: TrainerConfig) -> Path:
    """Run the configured job (colocated or fully-async) and return `<out_dir>/metrics.jsonl`."""
    from trainer.backends.strategy import check_strategy
    from trainer.platform.preflight import preflight

    check_strategy(cfg)  # actor.strategy: never a silent fallback to another backend
    preflight(cfg)
    out_dir = Path(cfg.trainer.out_dir)
    with out_dir_lock(out_dir):
        return _train(cfg, out_dir)


def _train(cfg: TrainerConfig, out_dir: Path) -> Path:
    from trainer.components.checkpoint import (
        checkpoint_step,
        completed_message,
        restore_log,
        resume_checkpoint,
    )

    log_path = out_dir / "metrics.jsonl"
    ckpt = resume_checkpoint(out_dir) if cfg.trainer.resume else None
    if ckpt is not None and checkpoint_step(ckpt) >= cfg.trainer.total_steps:
        restore_log(log_path, ckpt, checkpoint_step(ckpt))
        print(completed_message(out_dir, ckpt, cfg.trainer.total_steps), file=sys.stderr, flush=True)
        return log_path
    (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    from trainer.platform.env import prepare_run_env

    env = prepare_run_env(cfg.rollout.engine)  # ROCm/AITER defaults (user settings win), then recorded
    (out_dir / "env.json").write_text(json.dumps(env, indent=2, default=str))
    if cfg.trainer.mode == "fully_async":
        from trainer.modes.fully_async import train_fully_async

        return train_fully_async(cfg)
    from trainer.distributed.colocated_ray import train_colocated_ray, uses_ray

    if uses_ray(cfg):  # several devices (or trainer.use_ray): Ray workers with FSDP2 across them
        return train_colocated_ray(cfg)
    from trainer.modes.colocated import train_colocated
    from trainer.modes.steps import build_components

    return train_colocated(build_components(cfg))
