"""The hf engine's decode cache: transformers' `DynamicCache` with each layer of the model's own kind.

    cache = decode_cache(model)          # before the prefill; rows leave it with batch_select_indices

A plain `DynamicCache()` creates key/value layers lazily, which is right for attention-only models.
Hybrid models (Qwen3.5's Gated-DeltaNet layers) keep a conv and a recurrent state per row instead of
keys and values, so their layers must exist before the first forward: `DynamicCache(config=...)`
builds them from the config's ``layer_types``. transformers' `LinearAttentionLayer` has no
``batch_select_indices`` (the engine drops finished rows with it); the layer used here adds it as
the layer's own beam reorder (an index_select of both states along the batch).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import DynamicCache


def decode_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty cache for one generate call of `model`."""
    cache = DynamicCache()
    ensure_layer_kinds(model, cache)
    return cache


def has_recurrent_layers(model: torch.nn.Module) -> bool:
    """Whether some decoder layer keeps a recurrent state (linear attention) instead of keys and values."""
    return "linear_attention" in (getattr(model.config.get_text_config(), "layer_types", None) or ())


def ensure_layer_kinds(model: torch.nn.Module, cache: Any) -> None:
    """Give an empty lazy `DynamicCache` the model's linear-attention layers (no-op for attention-only
    models and for a cache that already has its layers)."""
    if cache is None or not has_recurrent_layers(model) or cache.layers:
        return
    from transformers.cache_utils import LinearAttentionLayer

    layers = DynamicCache(config=model.config).layers
    for i, layer in enumerate(layers):
        if type(layer) is LinearAttentionLayer:
            layers[i] = _selectable_linear_layer_class()(number_of_states=layer.number_of_states)
    cache.layers, cache.layer_class_to_replicate = layers, None


@functools.cache
def _selectable_linear_layer_class() -> type:
    from transformers.cache_utils import LinearAttentionLayer

    class SelectableLinearAttentionLayer(LinearAttentionLayer):
        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.reorder_cache(indices)

    return SelectableLinearAttentionLayer
