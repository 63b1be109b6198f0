"""Vision-language policies (Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5-MoE): build, load, freeze, one shared forward.

`model.path` forms (through `trainer.models.loading.load_model_and_tokenizer`):
- ``tiny:qwen2.5-vl+sft-geometry-<level>-<steps>``: that model after a brief supervised warm start on
  the synthetic figures (`trainer/models/warm_start_vlm.py`), built once and cached;
- ``tiny:qwen2.5-vl``: a random-init `Qwen2_5_VLForConditionalGeneration` (1 vision block of
  width 32 with 8-px patches, 2-layer text model of width 64), the project's byte-level tokenizer
  plus the Qwen2-VL special tokens ``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``,
  ``<|video_pad|>``, and a `Qwen2VLImageProcessorPil` sized for the synthetic figures
  (48 x 48 px -> a 6 x 6 patch grid -> 9 image tokens after the 2 x 2 merge). No hub, no download;
- ``tiny:qwen3-vl``: a random-init `Qwen3VLForConditionalGeneration` built the same way (same
  tokenizer and image processor; 2 vision blocks of width 32 whose outputs both feed deepstack
  mergers, 3-layer text model of width 64 with interleaved M-RoPE);
- ``tiny:qwen3.5-moe``: a random-init `Qwen3_5MoeForConditionalGeneration` (the architecture of
  Qwen3.5-35B-A3B; same tokenizer and image processor; 1 vision block of width 32; text model of
  width 64 with one Gated-DeltaNet linear-attention layer then one gated full-attention layer, each
  with an MoE MLP of 4 experts top-2 plus a shared expert). transformers' torch fallbacks of the
  gated delta rule and the causal conv1d run (no hub kernels);
- a local HF folder whose config has a ``vision_config`` (e.g. a Qwen2.5-VL-3B-Instruct checkout):
  `AutoModelForImageTextToText` plus the folder's `preprocessor_config.json`.

`load_vision_processor` gives the `trainer.data.multimodal.VisionProcessor` of a model (None
for a text-only one). Loading another vision-language family (e.g. dense Qwen3.5, ``qwen3_5``)
is a `ModelError` naming its model type.

The forward (`multimodal_hidden_states`), shared by the hf rollout engine's prefill and the
trainer's log-prob recomputation so both follow one convention:

    embeds = embed_tokens(input_ids)                                   # [B, T, H]
    image  = (input_ids == image_token_id) & (column < image_cols) & attention_mask
    feats, deepstack = visual(pixel_values, image_grid_thw)           # merged patch features, rows in order
    embeds[image] = feats
    position_ids = get_rope_index(input_ids, image, image_grid_thw, attention_mask)   # [3, B, T] M-RoPE
    hidden = language_model(inputs_embeds=embeds, position_ids=position_ids, attention_mask=...,
                            **deepstack)   # Qwen3-VL only: visual_pos_masks=image, deepstack_visual_embeds

Qwen3-VL's tower also returns one feature map per deepstack merger; its text model adds map ``k``
at the image positions after decoder layer ``k`` (`_visual_features` is the only place the
families differ; Qwen3.5-MoE's tower has no deepstack mergers, so it takes the Qwen2.5-VL branch).
Decode steps carry no image slots, so they take no deepstack features.

Qwen3.5's linear-attention layers keep a conv and a recurrent state per row instead of keys and
values: the hf engine's cache gets those layers before the prefill
(`trainer/rollout/decode_cache.py`). Left padding is exact there too: transformers zeroes the pad positions' inputs
(`create_recurrent_attention_mask`), so they add nothing to the conv window or the state.

``image_cols`` is the prompt width: an ``<|image_pad|>`` token a policy samples in its response is
an ordinary text token (its embedding row), never a slot for image features, in both the engine
and the trainer. Text positions after the image continue from the largest M-RoPE position + 1,
so a decode step's position is one integer per row (the text model expands it to 3 axes).

`actor.freeze_vision_tower` (verl's option): `freeze_vision_tower` sets ``requires_grad=False`` on
``model.visual``; the trainer then leaves its weights out of the optimizer and of the weight sync
(the engine's copy stays equal, as both start from the same weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigError, ModelError
from trainer.rollout.decode_cache import ensure_layer_kinds

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TINY_VLMS = ("qwen2.5-vl", "qwen3-vl", "qwen3.5-moe")
FORWARD_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5_moe")  # the families `multimodal_hidden_states` covers
_TINY_CLASSES = {"qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration", "qwen3-vl": "Qwen3VLForConditionalGeneration",
                 "qwen3.5-moe": "Qwen3_5MoeForConditionalGeneration"}
VISION_PREFIX = "model.visual."
_TINY_IMAGE = dict(patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64)


def is_tiny_vlm(name: str) -> bool:
    """``qwen2.5-vl``, ``qwen3-vl``, ``qwen3.5-moe``, or a warm-started ``qwen2.5-vl+sft-<task>-<steps>`` (`trainer/models/warm_start_vlm.py`)."""
    return name.partition("+sft-")[0] in TINY_VLMS


def is_vlm(model: torch.nn.Module) -> bool:
    """A Qwen2-VL-family model: a vision tower and an M-RoPE index on its inner `model`."""
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "visual") and hasattr(inner, "get_rope_index")


def tiny_vlm_tokenizer() -> Any:
    from trainer.data.tiny_tokenizer import IM_START, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IM_START, *VISION_TOKENS]})
    return tok


def tiny_vlm_config(arch: str, tokenizer: Any, overrides: dict[str, Any] | None = None) -> Any:
    if arch not in TINY_VLMS:
        raise ModelError(f"model.path: unknown tiny vision-language model 'tiny:{arch}' (fix: use tiny:qwen2.5-vl, "
                         "tiny:qwen3-vl or tiny:qwen3.5-moe)")
    ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
                   tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))))
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=True,
                bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=_TINY_IMAGE["patch_size"],
                  spatial_merge_size=_TINY_IMAGE["merge_size"], temporal_patch_size=_TINY_IMAGE["temporal_patch_size"],
                  out_hidden_size=64, fullatt_block_indexes=[0], window_size=16)
    if arch == "qwen3-vl":  # head_dim 16: mrope_section covers its 8 rotary pairs; both vision blocks feed deepstack
        from transformers import Qwen3VLConfig as config_class

        for key in ("rope_scaling", "bos_token_id", "eos_token_id"):
            text.pop(key)
        text.update(num_hidden_layers=3, head_dim=16, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        vision = {k: v for k, v in vision.items() if k not in ("fullatt_block_indexes", "window_size")}
        vision.update(depth=2, num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    elif arch == "qwen3.5-moe":  # 1 Gated-DeltaNet + 1 full-attention layer, 4 experts top-2 plus the shared expert
        from transformers import Qwen3_5MoeConfig as config_class

        for key in ("rope_scaling", "bos_token_id", "eos_token_id", "intermediate_size"):
            text.pop(key)
        text.update(layer_types=["linear_attention", "full_attention"], head_dim=64, linear_conv_kernel_dim=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 3, 3], "mrope_interleaved": True})  # 64 * 0.25 = 8 pairs
        vision = {k: v for k, v in vision.items() if k not in ("fullatt_block_indexes", "window_size")}
        vision.update(num_position_embeddings=64)
    else:
        from transformers import Qwen2_5_VLConfig as config_class
    overrides = dict(overrides or {})
    text.update(overrides.pop("text_config", {}))
    vision.update(overrides.pop("vision_config", {}))
    return config_class(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids, **overrides)


def build_tiny_vlm(arch: str, *, dtype: torch.dtype, attn_implementation: str, seed: int, with_model: bool,
                   overrides: dict[str, Any] | None = None) -> tuple[torch.nn.Module | None, Any]:
    tokenizer = tiny_vlm_tokenizer()
    config = tiny_vlm_config(arch, tokenizer, overrides)
    model = None
    if with_model:
        torch.manual_seed(seed)
        import transformers

        model_class = getattr(transformers, _TINY_CLASSES[arch])
        model = model_class._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model, tokenizer


def config_is_vlm(folder: Path) -> bool:
    import json

    try:
        return "vision_config" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False


def load_pretrained_vlm(folder: Path, *, dtype: torch.dtype, attn_implementation: str, dummy: bool, seed: int
                        ) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(folder)
    if not hasattr(config, "vision_config") or config.model_type not in FORWARD_MODEL_TYPES:
        raise ModelError(f"model.path: {folder} is a '{config.model_type}' vision-language model; the trainer's "
                         f"image forward covers {', '.join(FORWARD_MODEL_TYPES)} (fix: use a Qwen2-VL / Qwen2.5-VL / "
                         "Qwen3-VL / Qwen3.5-MoE model)")
    if dummy:
        torch.manual_seed(seed)
        return AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)


def load_vision_processor(model_path: str, tokenizer: Any, model: torch.nn.Module | None = None) -> Any:
    """The `VisionProcessor` of a vision-language `model.path`; None for a text-only model."""
    from trainer.data.multimodal import VisionProcessor

    if model_path.startswith("tiny:") and is_tiny_vlm(model_path.split(":", 1)[1]):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        image_processor = Qwen2VLImageProcessorPil(**_TINY_IMAGE)
    else:
        folder = Path(model_path).expanduser()
        if not folder.is_dir() or not config_is_vlm(folder):
            return None
        from transformers import AutoImageProcessor

        try:
            image_processor = AutoImageProcessor.from_pretrained(folder)
        except (OSError, ValueError) as e:
            raise ModelError(f"model.path: {folder}: no image processor ({str(e).splitlines()[0]}) (fix: the folder "
                             "needs the model's preprocessor_config.json)") from None
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    if image_id is None or image_id == tokenizer.unk_token_id:
        raise ModelError(f"model.path: {model_path}: the tokenizer has no <|image_pad|> token (fix: use the "
                         "vision-language model's own tokenizer)")
    merge = int(getattr(image_processor, "merge_size", 2))
    return VisionProcessor(image_processor=image_processor, image_token_id=int(image_id), merge_size=merge)


def freeze_vision_tower(model: torch.nn.Module) -> list[str]:
    """`requires_grad=False` on the vision tower; returns the frozen parameter names."""
    if not is_vlm(model):
        raise ConfigError("actor.freeze_vision_tower: the model has no vision tower (fix: set "
                          "actor.freeze_vision_tower=false or use a vision-language model.path)")
    model.model.visual.requires_grad_(False)
    return [n for n, _ in model.named_parameters() if n.startswith(VISION_PREFIX)]


def stack_multimodal_inputs(rows: list[dict[str, torch.Tensor] | None], device: torch.device
                            ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`(pixel_values [sum patches, D], image_grid_thw [num_images, 3])` of a batch's rows, in row order."""
    rows = [r for r in rows if r is not None and r["image_grid_thw"].numel()]
    if not rows:
        return None, None
    return (torch.cat([r["pixel_values"] for r in rows]).to(device),
            torch.cat([r["image_grid_thw"] for r in rows]).to(device))


def _visual_features(inner: torch.nn.Module, pixel_values: torch.Tensor, grid: torch.Tensor, image: torch.Tensor,
                     dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, Any]]:
    """`(merged features [I, H], extra text-model kwargs)`: the one place the model families differ.

    Qwen2-VL / Qwen2.5-VL / Qwen3.5-MoE: no extras. Qwen3-VL: ``visual_pos_masks`` (the image slots `image`,
    [B, T]) and ``deepstack_visual_embeds`` (one [I, H] map per deepstack merger, rows in the
    order of the slots), which its text model adds to the hidden states after the first layers.
    """
    out = inner.get_image_features(pixel_values, grid)
    feats = torch.cat(out.pooler_output).to(dtype)
    deepstack = getattr(out, "deepstack_features", None)
    if deepstack is None:
        return feats, {}
    return feats, {"visual_pos_masks": image,
                   "deepstack_visual_embeds": [torch.cat(maps).to(dtype) for maps in deepstack]}




def multimodal_hidden_states(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             mm_rows: list[dict[str, torch.Tensor] | None], *, image_cols: int, cache: Any = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(last hidden states [B, T, H], M-RoPE position_ids [3, B, T])` of a batch with images (module docstring)."""
    inner = model.model
    ensure_layer_kinds(model, cache)
    pixel_values, grid = stack_multimodal_inputs(mm_rows, input_ids.device)
    embeds = model.get_input_embeddings()(input_ids)  # [B, T, H]
    cols = torch.arange(input_ids.shape[1], device=input_ids.device)
    image = (input_ids == model.config.image_token_id) & (cols < image_cols)[None, :] & attention_mask.bool()  # [B, T]
    num_slots = int(image.sum())
    extra: dict[str, Any] = {}
    if pixel_values is not None:
        feats, extra = _visual_features(inner, pixel_values, grid, image, embeds.dtype)  # [I, H]
        if feats.shape[0] != num_slots:
            raise ValueError(f"{num_slots} image tokens in the prompts but {feats.shape[0]} image features")
        embeds = embeds.masked_scatter(image[..., None], feats)
    elif num_slots:
        raise ValueError(f"{num_slots} image tokens in the prompts but no pixel_values")
    position_ids, _ = inner.get_rope_index(input_ids, image.int(), grid, attention_mask=attention_mask)  # [3, B, T]
    out = inner.language_model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=cache, use_cache=cache is not None, **extra)
    return out.last_hidden_state, position_ids


def model_is_vlm(model_path: str) -> bool:
    """Whether `model.path` names a vision-language model (decided without loading it)."""
    if model_path.startswith("tiny:"):
        return is_tiny_vlm(model_path.split(":", 1)[1])
    folder = Path(model_path).expanduser()
    return folder.is_dir() and config_is_vlm(folder)


def check_multimodal_support(cfg: Any) -> None:
    """ConfigError naming the first setting a vision-language run does not support yet.

    Supported: the colocated loop (in one process, or on Ray with one trainer worker) and the
    fully-async loop (one trainer worker, rollout workers on their own devices, no partial
    rollout: `continue_generation` takes no images); the built-in hf engine, vLLM and SGLang (not
    run: trainer/rollout/sglang_engine.py); the FSDP2
    actor without compile; GRPO-style critic-free algorithms; single-turn prompts.
    """
    if not model_is_vlm(cfg.model.path):
        return
    t = cfg.trainer
    partial = t.mode == "fully_async" and cfg.async_.partial_rollout
    if t.mode == "fully_async":  # one trainer worker; the rollout workers have devices of their own
        devices = ("async.train_gpus", cfg.async_.train_gpus, cfg.async_.train_gpus * t.nnodes == 1, "1 and trainer.nnodes=1")
    else:
        devices = ("trainer.n_gpus_per_node", t.n_gpus_per_node, t.n_gpus_per_node * t.nnodes == 1,
                   "1 and trainer.nnodes=1")
    unsupported = [  # (field, its value, supported when, the fix)
        devices,
        ("async.partial_rollout", cfg.async_.partial_rollout, not partial, "false"),
        ("rollout.engine", cfg.rollout.engine, cfg.rollout.engine in ("hf", "vllm", "sglang"), "hf"),
        ("actor.strategy", cfg.actor.strategy, cfg.actor.strategy == "fsdp2", "fsdp2"),
        ("actor.compile", cfg.actor.compile, not cfg.actor.compile, "false"),
        ("critic.enable", cfg.critic.enable, not cfg.critic.enable, "false"),
        ("agent.enable", cfg.agent.enable, not cfg.agent.enable, "false"),
    ]
    for field, value, ok, fix in unsupported:
        if not ok:
            raise ConfigError(f"{field}={value}: not supported with a vision-language model.path ({cfg.model.path}) "
                              f"yet (fix: set {field}={fix})")
