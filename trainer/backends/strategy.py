"""Which training backend a run uses (`actor.strategy`), checked before anything is loaded.

    from trainer.backends.strategy import check_strategy
    check_strategy(cfg)   # raises ConfigError with one line naming the field and the fix

`fsdp2` is the transformers model sharded with FSDP2 (`trainer/backends/actor.py`). `megatron` is
megatron-core's GPTModel built from the HF config through the `mbridge` bridge
(`trainer/backends/megatron/backend.py`). A megatron run never falls back to FSDP2: without
megatron-core or mbridge installed, for a model type the bridge cannot map, or in a loop the
backend does not run in, the run stops at start. Megatron settings (`actor.megatron.*`) other than
the defaults under `strategy: fsdp2` would be ignored, so they are an error too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trainer.config import MegatronConfig, ModelConfig, TrainerConfig
from trainer.errors import ConfigError

INSTALL_FIX = "pip install 'rlbench[megatron]'"


def megatron_missing() -> str | None:
    """The name of the first missing package the Megatron backend needs, or None."""
    for module, package in (("megatron.core", "megatron-core"), ("mbridge", "mbridge")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return package
    return None


def hf_config(cfg: ModelConfig) -> Any | None:
    """The HF config that `model.path` names, read without loading weights (None: the embedded
    SmolLM2, a Llama, or a path that is not a model folder)."""
    from transformers import AutoConfig

    from trainer.models.specs import SHAPES, tiny_config

    path = cfg.path
    if path.startswith("tiny:"):
        return tiny_config(path.split(":", 1)[1], 256, cfg.override_config)
    if path.startswith("shape:"):
        name = path.split(":", 1)[1]
        return SHAPES[name][0](**SHAPES[name][1]) if name in SHAPES else None
    p = Path(path).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return AutoConfig.from_pretrained(p)
    return None


def model_type(cfg: ModelConfig) -> str:
    """The HF `model_type` that `model.path` names, read without loading weights."""
    if cfg.path.startswith("embedded:"):
        return "llama"  # SmolLM2 (the only embedded model) is a Llama
    conf = hf_config(cfg)
    if conf is None and cfg.path.startswith("shape:"):
        return cfg.path.split(":", 1)[1]
    return conf.model_type if conf is not None else "unknown"


def num_experts(cfg: ModelConfig) -> int:
    """Routed experts per MoE layer of the model the run trains (upcycled included); 0 for a dense model."""
    if cfg.upcycle_num_experts:
        return cfg.upcycle_num_experts
    conf = hf_config(cfg) if not cfg.path.startswith("embedded:") else None
    return max((getattr(conf, k, None) or 0) for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def bridge_model_types() -> list[str]:
    """Model types mbridge maps between HF and megatron-core names."""
    from mbridge import AutoBridge

    return sorted(AutoBridge.list_supported_models())


def check_strategy(cfg: TrainerConfig) -> None:
    """Raise ConfigError (one line: field and fix) when `actor.strategy` cannot be honoured as set."""
    a = cfg.actor
    if a.strategy == "fsdp2":
        changed = {k: v for k, v in a.megatron.model_dump().items() if v != MegatronConfig.model_fields[k].default}
        if changed:
            key, value = next(iter(changed.items()))
            raise ConfigError(f"actor.megatron.{key}={value}: Megatron parallelism is set but actor.strategy=fsdp2 "
                              f"ignores it (fix: set actor.strategy=megatron, or remove actor.megatron.{key})")
        return
    missing = megatron_missing()
    if missing is not None:
        raise ConfigError(f"actor.strategy=megatron: the package '{missing}' is not installed (fix: {INSTALL_FIX}, "
                          f"or set actor.strategy=fsdp2)")
    from trainer.models.vlm import model_is_vlm

    if model_is_vlm(cfg.model.path):  # megatron's GPT is a text model: no vision tower to train or export
        raise ConfigError(f"actor.strategy=megatron: model.path={cfg.model.path} is a vision-language model, and the "
                          f"Megatron backend builds no vision tower (fix: actor.strategy=fsdp2)")
    mtype = model_type(cfg.model)
    supported = bridge_model_types()
    if mtype not in supported:
        raise ConfigError(f"actor.strategy=megatron: model.path={cfg.model.path} is a '{mtype}' model, which the "
                          f"mbridge bridge cannot map (fix: use one of {', '.join(supported)}, or set "
                          f"actor.strategy=fsdp2)")
    from trainer.backends.megatron.backend import check_megatron_supported

    check_megatron_supported(cfg, num_experts(cfg.model))
