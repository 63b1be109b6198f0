"""Start-time checks of what a typed config cannot check on its own: paths, devices, the model's limits.

    from trainer.platform.preflight import preflight
    preflight(cfg)   # raises ConfigError (one line naming the field and the fix), before any model load

`trainer.api.train` calls it first, so a run that cannot work fails in a second, not after a model
load or a step:

- `trainer.out_dir`: not an existing file, creatable, writable (a probe file is written and removed);
- `trainer.device` / `trainer.n_gpus_per_node`: `cuda` needs a CUDA device, and one node needs as
  many devices as workers (`async.rollout_gpus + async.train_gpus` in the fully-async mode);
- `trainer.num_threads`: at most the CPU cores this process may use (`os.sched_getaffinity`): more
  threads than cores only slow a step, and torch's thread pool crashes the process (no message) when
  it cannot start tens of thousands of them;
- `model.tokenizer_path`: an existing folder;
- the model's config (read without its weights: tiny and `shape:` models, a HF folder's
  `config.json`, the embedded model's cached config): every `model.override_config` key is a field
  of it, and `data.max_prompt_length + data.max_response_length` fits its `max_position_embeddings`.
A model whose config cannot be read without its weights (a `.gguf` file) skips the model checks;
its loader reports its own errors.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from trainer.config import TrainerConfig
from trainer.errors import ConfigError


def check_out_dir(out_dir: str) -> None:
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"trainer.out_dir={out_dir}: is an existing file, not a folder (fix: point "
                          f"trainer.out_dir at a folder, e.g. runs/my_run)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"trainer.out_dir={out_dir}: cannot be written ({e.strerror or type(e).__name__}"
                          f"{': ' + e.filename if getattr(e, 'filename', None) else ''}) (fix: choose a writable folder, "
                          f"e.g. runs/my_run)") from None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def check_threads(cfg: TrainerConfig) -> None:
    want, have = cfg.trainer.num_threads, usable_cores()
    if want is not None and want > have:
        raise ConfigError(f"trainer.num_threads={want}: more than the {have} CPU cores this process may use "
                          f"(fix: set trainer.num_threads to at most {have}, or remove it for torch's default)")


def check_devices(cfg: TrainerConfig) -> None:
    import torch

    t = cfg.trainer
    if t.device == "cpu":
        return
    has_cuda = torch.cuda.is_available()
    if t.device == "cuda" and not has_cuda:
        raise ConfigError("trainer.device=cuda: this machine has no CUDA device (torch "
                          f"{torch.__version__}) (fix: set trainer.device=cpu or auto)")
    if not has_cuda:
        return
    want = cfg.async_.rollout_gpus + cfg.async_.train_gpus if t.mode == "fully_async" else t.n_gpus_per_node
    have = torch.cuda.device_count()
    if t.nnodes == 1 and want > have and "RAY_ADDRESS" not in os.environ:
        field = "async.rollout_gpus + async.train_gpus" if t.mode == "fully_async" else "trainer.n_gpus_per_node"
        raise ConfigError(f"{field}={want}: this machine has {have} CUDA device(s) (fix: use at most {have}, or "
                          f"join a larger cluster through RAY_ADDRESS)")


def model_config(cfg: TrainerConfig, *, overrides: bool = True) -> Any | None:
    """The model's HF config without loading weights, or None when that needs the weights (GGUF)."""
    from trainer.models import specs as models

    m = cfg.model
    over = dict(m.override_config) if overrides else {}
    path = m.path
    if path.startswith("tiny:"):
        arch = path.split(":", 1)[1]
        from trainer.models import vlm as models_vlm

        if models_vlm.is_tiny_vlm(arch):  # a warm-started tiny VLM keeps the base architecture's config
            return models_vlm.tiny_vlm_config(arch.partition("+sft-")[0], models_vlm.tiny_vlm_tokenizer(), over)
        from trainer.data.tiny_tokenizer import build_tiny_tokenizer

        return models.tiny_config(arch, len(build_tiny_tokenizer()), over)
    if path.startswith("shape:"):
        name = path.split(":", 1)[1]
        if name not in models.SHAPES:
            return None  # the loader names the known shapes
        cls, kw = models.SHAPES[name]
        return cls(**{**kw, **over})
    if path.startswith("embedded:"):
        folder = models.cache_dir() / "models" / path.split(":", 1)[1]
    else:
        folder = Path(path).expanduser()
    if not (folder / "config.json").is_file() or m.gguf_file:
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, json.JSONDecodeError):
        return None  # the loader reports an unreadable folder
    for k, v in over.items():
        setattr(config, k, v)
    return config


def check_model(cfg: TrainerConfig) -> None:
    tok = cfg.model.tokenizer_path
    if tok is not None and not Path(tok).expanduser().is_dir():
        raise ConfigError(f"model.tokenizer_path={tok}: not a folder (fix: point it at a tokenizer folder, or "
                          f"remove it to use model.path's tokenizer)")
    if cfg.model.override_config:
        base = model_config(cfg, overrides=False)
        if base is not None:
            known = set(base.to_dict())
            for key in cfg.model.override_config:
                if key not in known:
                    close = difflib.get_close_matches(key, sorted(known), n=1)
                    hint = f"did you mean '{close[0]}'?" if close else "see the model's config.json for its fields"
                    raise ConfigError(f"model.override_config.{key}: not a field of {type(base).__name__} "
                                      f"({cfg.model.path}) (fix: remove it; {hint})")
    config = model_config(cfg)
    if config is None:
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    need = cfg.data.max_prompt_length + cfg.data.max_response_length
    if isinstance(limit, int) and need > limit:
        raise ConfigError(f"data.max_prompt_length + data.max_response_length = {cfg.data.max_prompt_length} + "
                          f"{cfg.data.max_response_length} = {need} tokens, over the model's max_position_embeddings="
                          f"{limit} ({cfg.model.path}) (fix: lower data.max_response_length or data.max_prompt_length "
                          f"so they sum to <= {limit})")


def preflight(cfg: TrainerConfig) -> None:
    """Every start-time check, cheapest first."""
    check_out_dir(cfg.trainer.out_dir)
    check_threads(cfg)
    check_devices(cfg)
    from trainer.models.vlm import check_multimodal_support

    check_multimodal_support(cfg)  # a vision-language model.path: the paths that take images
    check_model(cfg)
