"""`CheckpointLayout`: the trainer's in-memory weights turned into exactly what `save_pretrained` writes.

The vLLM and SGLang engines load checkpoints, so what their weight sync sends must be the checkpoint's
names and tensors: per-expert MoE weights, Mixtral's `block_sparse_moe`, the Qwen2.5-VL family's text
model under `model.*` and its tower under `visual.*`. Checked on the tiny random-init models, all
weights and a frozen vision tower's partial sync; the identity (the in-memory names sent as they
are) fails the same check on every model whose layout differs.
"""

from __future__ import annotations

import pytest
import torch

from trainer.backends.megatron.backend import hf_checkpoint_tensors
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.rollout.checkpoint_layout import CheckpointLayout

CONVERTED = {"llama": False, "qwen3_moe": True, "mixtral": True, "qwen2.5-vl": True, "qwen3.5-moe": True}


def _saved(model) -> dict[str, torch.Tensor]:
    out = hf_checkpoint_tensors(model)
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)  # a tied head is no parameter, so no sync sends it
    return out


@pytest.mark.parametrize("arch", sorted(CONVERTED))
def test_layout_equals_the_saved_checkpoint(arch: str):
    model, _ = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}"), seed=0)
    layout = CheckpointLayout(model)
    saved = _saved(model)
    sent = dict(layout((n, p.detach()) for n, p in model.named_parameters()))
    assert set(sent) == set(saved)
    for name, t in sent.items():
        assert torch.equal(t, saved[name]), name
    assert bool(layout.converted) == CONVERTED[arch]
    as_is = {n for n, _ in model.named_parameters()}
    assert (as_is != set(saved)) == CONVERTED[arch]  # the check fails without the layout where it matters


def test_a_partial_sync_converts_only_what_is_sent():
    from trainer.models.vlm import VISION_PREFIX

    model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2.5-vl"), seed=0)
    text = [(n, p.detach()) for n, p in model.named_parameters() if not n.startswith(VISION_PREFIX)]
    sent = dict(CheckpointLayout(model)(text))
    saved = _saved(model)
    assert sent and not any(n.startswith("visual.") for n in sent)  # the frozen tower stays out
    assert all(torch.equal(t, saved[n]) for n, t in sent.items())
