"""Weights for the vLLM and SGLang engines in the HF checkpoint layout they load.

    to_ckpt = CheckpointLayout(hf_model)                 # at engine build: the model's conversions
    engine_pairs = to_ckpt(actor.named_weights())        # (checkpoint name, tensor), lazily

Both training backends yield weights under transformers' in-memory names (`Actor.named_weights`:
the HF model's `named_parameters()`). transformers 5 loads some checkpoints through conversions,
so those names are not always the checkpoint's: an MoE's per-expert tensors
(`mlp.experts.<e>.gate_proj/up_proj/down_proj.weight`, Mixtral's
`block_sparse_moe.experts.<e>.w1/w3/w2.weight` and `block_sparse_moe.gate.weight`) live fused as
`mlp.experts.gate_up_proj [E, 2I, H]` / `mlp.experts.down_proj [E, H, I]` under `mlp.*`, and the
Qwen2.5-VL family keeps its text model under `model.language_model.*`. The engines load
checkpoints (vLLM's `reload_weights(is_checkpoint_format=True)`, SGLang's model loaders), and
vLLM 0.32's Mixtral has no module `mlp` at all ("There is no module or parameter named
'layers.0.mlp' in MixtralModel" for the in-memory names), so every tensor goes through
transformers' own reverse conversion, the one `save_pretrained` applies
(`transformers.core_model_loading.revert_weight_conversion`), one tensor at a time.

No weights are kept: the conversions are taken from the model at build time (its
`_weight_conversions` from `from_pretrained`, else transformers' mapping for its class, without
prefix changes, as `revert_weight_conversion` does for a model built in memory), and a dry run on
meta tensors of every parameter checks them and records which names change (the others pass
through untouched).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from trainer.errors import ConfigError

# Prefixes wrappers add to parameter names (torch.compile, DDP, FSDP1, activation checkpointing);
# the engines' loaders expect the bare HF checkpoint names.
_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def hf_weight_name(name: str) -> str:
    """The HF checkpoint name of a trainer parameter: wrapper prefixes removed anywhere in the path."""
    parts = [p for p in name.split(".") if p not in {w.rstrip(".") for w in _WRAPPER_PREFIXES}]
    return ".".join(parts)


def _conversions(model: torch.nn.Module) -> list[Any] | None:
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is not None:
        return conversions
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    found = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    return found or None


class CheckpointLayout:
    """In-memory HF names -> checkpoint names and tensors (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        from transformers.core_model_loading import revert_weight_conversion

        self._revert = revert_weight_conversion
        self._shim = SimpleNamespace(_weight_conversions=_conversions(model), config=model.config)
        self.converted: dict[str, list[str]] = {}  # in-memory name -> its checkpoint names, where they differ
        for name, p in model.named_parameters():
            name = hf_weight_name(name)
            try:
                out = self._convert(name, torch.empty(p.shape, dtype=p.dtype, device="meta"))
            except Exception as e:  # a conversion this model's class does not reverse tensor by tensor
                raise ConfigError(f"model.path: transformers cannot turn the weight {name} back into its checkpoint "
                                  f"layout ({type(e).__name__}: {e}) (fix: rollout.engine=hf)") from e
            if list(out) != [name]:
                self.converted[name] = list(out)

    def _convert(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._shim._weight_conversions is None:
            return {name: tensor}
        return self._revert(self._shim, {name: tensor})

    def __call__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in named_tensors:
            if name in self.converted:
                yield from self._convert(name, t).items()
            else:
                yield name, t
