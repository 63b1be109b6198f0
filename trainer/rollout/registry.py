"""Rollout engines by registered name (`rollout.engine: hf | static | vllm | sglang`)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.config import TrainerConfig
from trainer.errors import ConfigError
from trainer.models.specs import resolve_dtype
from trainer.rollout.base import RolloutEngine


def build_engine(cfg: TrainerConfig, model: torch.nn.Module, tokenizer: Any, eos_ids: list[int],
                 device: torch.device) -> RolloutEngine:
    """The configured engine, holding its own copy of `model`'s weights."""
    name = cfg.rollout.engine
    dtype = resolve_dtype(cfg.model.dtype)
    if name == "hf":
        from trainer.rollout.hf import HFRolloutEngine
        return HFRolloutEngine(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=eos_ids,
                               seed=cfg.trainer.seed, dtype=dtype, device=device)
    if name == "static":
        try:
            from trainer.rollout.static import StaticRolloutEngine
        except ImportError as e:
            raise ConfigError(f"rollout.engine=static is not available in this build ({e}) (fix: use rollout.engine=hf)") from None
        return StaticRolloutEngine(model, cfg=cfg.rollout, pad_token_id=tokenizer.pad_token_id, eos_token_ids=eos_ids,
                                   seed=cfg.trainer.seed, dtype=dtype, device=device,
                                   max_prompt_length=cfg.data.max_prompt_length,
                                   max_response_length=cfg.data.max_response_length)
    if name in ("vllm", "sglang"):
        module = {"vllm": "trainer.rollout.vllm_engine", "sglang": "trainer.rollout.sglang_engine"}[name]
        try:
            mod = __import__(module, fromlist=["build"])
        except ImportError as e:
            from trainer.rollout.vllm_engine import missing_engine_error
            raise missing_engine_error(name, e) from None
        return mod.build(cfg, model, tokenizer, eos_ids, device)
    raise ConfigError(f"rollout.engine: unknown engine {name!r} (fix: use hf, static, vllm or sglang)")
