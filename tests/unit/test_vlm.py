"""Vision-language RL on tiny random-init Qwen2.5-VL / Qwen3-VL / Qwen3.5-MoE: parquet row -> engine inputs -> log-probs -> update."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("PIL", reason="image rows need Pillow (a base dependency: pip install pillow)")

from trainer.backends.actor import Actor  # noqa: E402
from trainer.components.batch import batch_from_rollout  # noqa: E402
from trainer.config import ActorConfig, ModelConfig, load_config  # noqa: E402
from trainer.data.dataset import PromptDataset, load_rows  # noqa: E402
from trainer.data.splits import write_rows  # noqa: E402
from trainer.data.synthetic_geometry import make_geometry_rows  # noqa: E402
from trainer.errors import ConfigError  # noqa: E402
from trainer.models.loading import load_model_and_tokenizer  # noqa: E402
from trainer.models.specs import eos_token_ids  # noqa: E402
from trainer.models.vlm import (  # noqa: E402
    VISION_PREFIX,
    check_multimodal_support,
    freeze_vision_tower,
    load_vision_processor,
)
from trainer.ops.logprobs import response_logprobs  # noqa: E402
from trainer.rollout.base import SamplingParams  # noqa: E402
from trainer.rollout.hf import HFRolloutEngine  # noqa: E402

LOGPROB_ATOL = 1e-5  # fp32, same weights and images: the engine's incremental decode vs one full forward
LOGIT_ATOL = 1e-5  # fp32: the shared forward vs transformers' own, or a cached decode vs a full recompute


@pytest.fixture(scope="module", params=["tiny:qwen2.5-vl", "tiny:qwen3-vl", "tiny:qwen3.5-moe"])
def vlm(request):
    model, tok = load_model_and_tokenizer(ModelConfig(path=request.param), seed=0)
    return model, tok, load_vision_processor(request.param, tok, model)


def _items(vlm, rows):
    _, tok, proc = vlm
    return PromptDataset(rows, tok, max_prompt_length=256, batch_size=len(rows), shuffle=False, processor=proc).items


def _rollout_batch(vlm, items, n=2, max_new_tokens=6, seed=0):
    model, tok, _ = vlm
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos_token_ids(tok, model), seed=seed)
    rollout = engine.generate([it["prompt_ids"] for it in items], SamplingParams(n=n, max_new_tokens=max_new_tokens),
                              multi_modal_inputs=[it["multi_modal_inputs"] for it in items])
    batch = batch_from_rollout(rollout, pad_token_id=tok.pad_token_id)
    batch.meta["multi_modal_inputs"] = [items[g]["multi_modal_inputs"] for g in rollout.group_index]
    return engine, batch


def _mixed_rows():
    """Two levels: prompts of different lengths, so the batch is left-padded."""
    return make_geometry_rows(2, difficulty="easy", seed=0) + make_geometry_rows(2, difficulty="hard", seed=0)


def test_parquet_row_round_trips_to_the_engine_inputs(vlm, tmp_path):
    _, tok, proc = vlm
    rows = make_geometry_rows(3, difficulty="easy", seed=4, split="train")
    items = _items(vlm, load_rows(write_rows(rows, tmp_path / "train.parquet")))
    start, end, pad = tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"])
    for item, row in zip(items, rows):
        ids, mm = item["prompt_ids"], item["multi_modal_inputs"]
        assert mm["image_grid_thw"].tolist() == [[1, 6, 6]]  # 48 px / 8-px patches
        i = ids.index(start)
        assert ids[i + 1:i + 10] == [pad] * 9 and ids[i + 10] == end  # 36 patches / (2 x 2 merge) = 9 tokens
        assert ids.count(pad) == 9
        from trainer.data.multimodal import decode_image

        direct = proc.encode_images([decode_image(row["images"][0]["bytes"], "x")])["pixel_values"]
        assert torch.equal(mm["pixel_values"], direct)  # the parquet bytes give the processor the same pixels
    _, batch = _rollout_batch(vlm, items, n=1)
    assert batch.responses.shape[0] == 3 and batch.response_mask.sum() > 0


def test_engine_logprobs_equal_trainer_recomputation(vlm):
    model, _, _ = vlm
    items = _items(vlm, _mixed_rows())
    assert len({len(it["prompt_ids"]) for it in items}) == 2  # left padding is exercised
    _, batch = _rollout_batch(vlm, items, n=2)
    logp, _ = response_logprobs(model, batch)
    mask = batch.response_mask
    assert mask.sum() >= 8
    assert ((logp - batch.rollout_logprobs) * mask).abs().max() < LOGPROB_ATOL
    # the check sees the image: the same tokens under another prompt's image score differently
    swapped = batch.select(list(range(len(batch))))
    swapped.meta["multi_modal_inputs"] = batch.meta["multi_modal_inputs"][2:] + batch.meta["multi_modal_inputs"][:2]
    other, _ = response_logprobs(model, swapped)
    assert ((other - batch.rollout_logprobs) * mask).abs().max() > 100 * LOGPROB_ATOL


def test_rows_leaving_the_decode_early_keep_their_logprobs(vlm):
    """Rows with smaller budgets leave the batch mid-decode (`cache.batch_select_indices`: Qwen3.5's linear-attention
    layers drop their conv / recurrent state rows too); every kept row still scores as the trainer recomputes it."""
    from trainer.rollout.base import Rollout

    model, tok, _ = vlm
    items = _items(vlm, _mixed_rows())
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    rows, mm = [it["prompt_ids"] for it in items], [it["multi_modal_inputs"] for it in items]
    budgets = [2, 6, 4, 6]
    tokens, logps, finish = engine.decode_rows(rows, budgets, SamplingParams(n=1, max_new_tokens=6), None,
                                               multi_modal_inputs=mm)
    assert [len(t) for t in tokens] == budgets and finish == ["length"] * 4
    rollout = Rollout(prompt_ids=rows, response_ids=tokens, response_logprobs=logps, finish_reasons=finish,
                      group_index=list(range(4)), policy_version=[0] * 4)
    batch = batch_from_rollout(rollout, pad_token_id=tok.pad_token_id)
    batch.meta["multi_modal_inputs"] = mm
    logp, _ = response_logprobs(model, batch)
    assert ((logp - batch.rollout_logprobs) * batch.response_mask).abs().max() < LOGPROB_ATOL


def test_image_tokens_carry_mask_zero(vlm):
    _, tok, _ = vlm
    _, batch = _rollout_batch(vlm, _items(vlm, _mixed_rows()), n=2)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    p = batch.prompt_len
    token_mask = torch.cat([torch.zeros(len(batch), p), batch.response_mask], dim=1)  # [N, P+R] loss weight per token
    is_image = batch.input_ids == image_id
    assert int(is_image[:, :p].sum()) == 9 * len(batch)
    assert token_mask[is_image].abs().sum() == 0
    assert token_mask.sum() == batch.response_mask.sum() > 0  # the loss still has its response tokens


def _actor(model, freeze):
    cfg = ActorConfig(lr=1e-2, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8, freeze_vision_tower=freeze)
    return Actor(model, cfg, temperature=1.0, max_response_length=6, device=torch.device("cpu"))


@pytest.mark.parametrize("path", ["tiny:qwen2.5-vl", "tiny:qwen3-vl", "tiny:qwen3.5-moe"])
@pytest.mark.parametrize("freeze", [True, False])
def test_vision_tower_frozen_or_trained_and_synced_by_config(freeze, path):
    model, tok = load_model_and_tokenizer(ModelConfig(path=path), seed=0)
    vlm = (model, tok, load_vision_processor(path, tok, model))
    if freeze:
        assert freeze_vision_tower(model)
    actor = _actor(model, freeze)
    engine, batch = _rollout_batch(vlm, _items(vlm, _mixed_rows()), n=2)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0))
    batch.old_logprobs = batch.rollout_logprobs
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    actor.update(batch, 2)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    vision = {n for n in before if n.startswith(VISION_PREFIX)}
    assert vision and changed - vision  # the language model trains either way
    synced = {n for n, _ in actor.named_weights()}
    if freeze:
        assert not changed & vision and not synced & vision
    else:
        assert changed & vision and vision <= synced
    engine.update_weights(actor.named_weights())
    for name, p in model.named_parameters():  # the engine holds the trainer's weights, tower included
        assert torch.equal(engine._params[name], p), name


def test_unsupported_paths_are_one_line_errors():
    base = {"model": {"path": "tiny:qwen2.5-vl"}, "data": {"train_files": "synthetic:geometry-easy"}}
    check_multimodal_support(load_config(base))  # the colocated hf loop is supported
    fa = ["trainer.mode=fully_async", "async.partial_rollout=false"]
    for ok in (["rollout.engine=vllm"], ["trainer.use_ray=true"], fa, [*fa, "trainer.n_gpus_per_node=2"]):
        check_multimodal_support(load_config(base, ok))  # fully-async: 1 rollout + 1 trainer device is supported
    for override, field in [("rollout.engine=static", "rollout.engine"), ("trainer.mode=fully_async", "async.partial_rollout"),
                            ("trainer.n_gpus_per_node=2", "trainer.n_gpus_per_node"), ("actor.compile=true", "actor.compile"),
                            ((*fa, "trainer.n_gpus_per_node=3", "async.train_gpus=2"), "async.train_gpus")]:
        overrides = list(override) if isinstance(override, tuple) else [override]
        with pytest.raises(ConfigError, match=f"^{field}=.*not supported with a vision-language model.path") as err:
            check_multimodal_support(load_config(base, overrides))
        assert "\n" not in str(err.value) and "fix: set " + field in str(err.value)
    with pytest.raises(ConfigError, match="trainer.log_val_generations=2: validation samples are written by the single"):
        load_config(base, ["trainer.log_val_generations=2", "trainer.mode=fully_async"])
    text_model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2"), seed=0)
    with pytest.raises(ConfigError, match="actor.freeze_vision_tower: the model has no vision tower"):
        freeze_vision_tower(text_model)


def test_warm_start_names_parse_and_bad_ones_are_one_line_errors():
    from trainer.errors import ModelError
    from trainer.models.vlm import is_tiny_vlm, model_is_vlm
    from trainer.models.warm_start_vlm import parse_name

    assert parse_name("qwen2.5-vl+sft-geometry-easy-40") == ("qwen2.5-vl", "geometry-easy", 40, None)
    assert parse_name("qwen2.5-vl+sft-geometry-count-600-to50") == ("qwen2.5-vl", "geometry-count", 600, 50)
    assert is_tiny_vlm("qwen2.5-vl+sft-geometry-easy-40") and model_is_vlm("tiny:qwen2.5-vl+sft-geometry-hard-5")
    assert not model_is_vlm("tiny:qwen2")
    for bad in ("qwen2.5-vl+sft-geometry-easy", "qwen2.5-vl+sft-arithmetic-easy-10", "qwen2.5-vl+sft-geometry-easy-0",
                "qwen2.5-vl+sft-geometry-count-600-to0", "qwen2.5-vl+sft-geometry-count-600-tox"):
        with pytest.raises(ModelError, match="fix: write tiny:qwen2.5-vl\\+sft-geometry-<level>-<steps>"):
            parse_name(bad)
    with pytest.raises(ModelError, match="warm start is built for tiny:qwen2.5-vl only"):
        load_model_and_tokenizer(ModelConfig(path="tiny:qwen3-vl+sft-geometry-easy-5"), seed=0)


def test_image_forward_equals_transformers_own_forward(vlm, monkeypatch):
    """Without left padding, the shared forward (features into the image slots, M-RoPE from get_rope_index,
    Qwen3-VL's deepstack maps after its first layers) gives the logits of the model's own `forward`."""
    from trainer.models import vlm as models_vlm
    from trainer.models.vlm import multimodal_hidden_states

    model, _, _ = vlm
    items = _items(vlm, make_geometry_rows(3, difficulty="easy", seed=0))
    ids = torch.tensor([it["prompt_ids"] for it in items])
    attn = torch.ones_like(ids)
    mm = [it["multi_modal_inputs"] for it in items]
    with torch.no_grad():
        hidden, _ = multimodal_hidden_states(model, ids, attn, mm, image_cols=ids.shape[1])
        ref = model(input_ids=ids, attention_mask=attn, pixel_values=torch.cat([m["pixel_values"] for m in mm]),
                    image_grid_thw=torch.cat([m["image_grid_thw"] for m in mm]),
                    mm_token_type_ids=(ids == model.config.image_token_id).int()).logits
    assert (model.lm_head(hidden) - ref).abs().max() < LOGIT_ATOL
    if model.config.model_type == "qwen3_vl":  # the check sees the deepstack maps: without them it fails
        visual = models_vlm._visual_features
        monkeypatch.setattr(models_vlm, "_visual_features", lambda *a: (visual(*a)[0], {}))
        with torch.no_grad():
            hidden, _ = multimodal_hidden_states(model, ids, attn, mm, image_cols=ids.shape[1])
        assert (model.lm_head(hidden) - ref).abs().max() > 100 * LOGIT_ATOL


def test_left_padding_leaves_each_row_unchanged(vlm):
    """A left-padded row's logits equal that row's logits alone: attention layers mask the pads, and Qwen3.5's
    Gated-DeltaNet layers zero their inputs (transformers' `create_recurrent_attention_mask`), so the pads add
    nothing to the conv window or the recurrent state. The pads here are an ordinary text token: the pad token's
    embedding row is zero at init, which would hide a missing mask."""
    from trainer.models.vlm import multimodal_hidden_states

    model, tok, _ = vlm
    items = _items(vlm, _mixed_rows())
    p = max(len(it["prompt_ids"]) for it in items)
    filler = tok.convert_tokens_to_ids("a")
    assert filler != tok.pad_token_id and model.get_input_embeddings().weight[filler].abs().sum() > 0
    ids = torch.tensor([[filler] * (p - len(it["prompt_ids"])) + it["prompt_ids"] for it in items])
    attn = (torch.arange(p)[None, :] >= (p - torch.tensor([len(it["prompt_ids"]) for it in items]))[:, None]).long()
    mm = [it["multi_modal_inputs"] for it in items]
    assert attn.sum(1).min() < p  # some rows are padded
    with torch.no_grad():
        padded = model.lm_head(multimodal_hidden_states(model, ids, attn, mm, image_cols=p)[0])
        for i, it in enumerate(items):
            row = torch.tensor([it["prompt_ids"]])
            alone = model.lm_head(multimodal_hidden_states(model, row, torch.ones_like(row), [mm[i]],
                                                           image_cols=row.shape[1])[0])
            assert (padded[i, p - row.shape[1]:] - alone[0]).abs().max() < LOGIT_ATOL


def test_cached_decode_after_image_prefill_equals_full_recompute(vlm):
    """The hf engine's path: prefill left-padded prompts with images into a KV cache, then decode text tokens
    one at a time at the next M-RoPE text position; every step's logits equal one full forward's."""
    from transformers import DynamicCache

    from trainer.models.vlm import multimodal_hidden_states

    model, tok, _ = vlm
    items = _items(vlm, _mixed_rows())
    p = max(len(it["prompt_ids"]) for it in items)
    prompts = torch.tensor([[tok.pad_token_id] * (p - len(it["prompt_ids"])) + it["prompt_ids"] for it in items])
    attn = (torch.arange(p)[None, :] >= (p - torch.tensor([len(it["prompt_ids"]) for it in items]))[:, None]).long()
    mm = [it["multi_modal_inputs"] for it in items]
    new = torch.randint(3, 200, (len(items), 4), generator=torch.Generator().manual_seed(0))
    new[0, 1] = model.config.image_token_id  # a sampled <|image_pad|> is an ordinary token, no image slot
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        hidden, mrope = multimodal_hidden_states(model, prompts, attn, mm, image_cols=p, cache=cache)
        steps, pos = [model.lm_head(hidden[:, -1])], mrope.amax(dim=(0, 2))[:, None] + 1
        for k in range(new.shape[1]):
            attn = torch.cat([attn, torch.ones(len(items), 1, dtype=attn.dtype)], dim=1)
            steps.append(model(input_ids=new[:, k:k + 1], attention_mask=attn, position_ids=pos,
                               past_key_values=cache, use_cache=True).logits[:, -1])
            pos = pos + 1
        full, _ = multimodal_hidden_states(model, torch.cat([prompts, new], dim=1), attn, mm, image_cols=p)
    ref = model.lm_head(full[:, p - 1:])
    assert (torch.stack(steps, dim=1) - ref).abs().max() < LOGIT_ATOL


def test_local_qwen3_5_moe_folder_loads_and_other_families_are_one_line_errors(tmp_path):
    """A saved Qwen3.5-MoE folder (config, weights, tokenizer, preprocessor_config.json) loads through the folder path
    and scores as the model it was saved from; a vision-language family the forward does not cover is a ModelError."""
    import json

    from trainer.errors import ModelError
    from trainer.models.vlm import multimodal_hidden_states

    model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3.5-moe"), seed=0)
    proc = load_vision_processor("tiny:qwen3.5-moe", tok, model)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    proc.image_processor.save_pretrained(tmp_path / "m")
    loaded, loaded_tok = load_model_and_tokenizer(ModelConfig(path=str(tmp_path / "m")), seed=1)
    assert type(loaded).__name__ == "Qwen3_5MoeForConditionalGeneration"
    assert loaded.config.text_config.layer_types == ["linear_attention", "full_attention"]
    loaded_proc = load_vision_processor(str(tmp_path / "m"), loaded_tok, loaded)
    items = _items((model, tok, proc), make_geometry_rows(2, difficulty="easy", seed=0))
    ids = torch.tensor([it["prompt_ids"] for it in items])
    mm = [it["multi_modal_inputs"] for it in items]
    assert _items((loaded, loaded_tok, loaded_proc), make_geometry_rows(2, difficulty="easy", seed=0))[0]["prompt_ids"] \
        == items[0]["prompt_ids"]
    with torch.no_grad():
        ref = multimodal_hidden_states(model, ids, torch.ones_like(ids), mm, image_cols=ids.shape[1])[0]
        out = multimodal_hidden_states(loaded, ids, torch.ones_like(ids), mm, image_cols=ids.shape[1])[0]
    assert torch.equal(out, ref)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_5"}))
    with pytest.raises(ModelError, match="is a 'qwen3_5' vision-language model; the trainer's image forward covers"):
        load_model_and_tokenizer(ModelConfig(path=str(tmp_path / "m")), seed=0)


def test_text_only_prompts_decode_and_score_on_every_tiny_vlm(vlm):
    """A generate call without images (the engine's plain prefill, whose cache must hold Qwen3.5's
    linear-attention states too) gives log-probs the trainer's text path recomputes, n=2 per prompt
    (the group-shared prompt path, which recurrent models skip)."""
    model, tok, _ = vlm
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[], seed=0)
    prompts = [tok.encode("What is 2 + 3?"), tok.encode("Name a prime larger than ten, please.")]
    rollout = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5))
    assert [len(r) for r in rollout.response_ids] == [5] * 4
    batch = batch_from_rollout(rollout, pad_token_id=tok.pad_token_id)
    logp, _ = response_logprobs(model, batch)
    assert ((logp - batch.rollout_logprobs) * batch.response_mask).abs().max() < LOGPROB_ATOL


def test_vision_language_moe_trains_with_router_metrics_and_aux_loss():
    """Qwen3.5-MoE (a VLM whose text model is the MoE): its routers are recorded on image batches, so the
    actor logs `actor/moe/*` and `actor.moe_aux_loss_coeff` moves the routers, as for a text MoE."""
    routers = {}
    for coeff in (0.0, 1.0):
        model, tok = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3.5-moe"), seed=0)
        vlm = (model, tok, load_vision_processor("tiny:qwen3.5-moe", tok, model))
        _, batch = _rollout_batch(vlm, _items(vlm, _mixed_rows()), n=2, max_new_tokens=4)
        batch.advantages = torch.linspace(-1, 1, len(batch))[:, None].expand_as(batch.response_mask).contiguous()
        actor = Actor(model, ActorConfig(lr=1e-2, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4,
                                         moe_aux_loss_coeff=coeff), temperature=1.0, max_response_length=4,
                      device=torch.device("cpu"))
        metrics = actor.update(batch, 1, reuse_forward_as_old=True)
        assert {"actor/moe/load_balancing_loss", "actor/moe/router_entropy", "actor/moe/expert_load/cv"} <= set(metrics)
        assert 0 < metrics["actor/moe/router_entropy"] <= float(torch.log(torch.tensor(4.0))) + 1e-6
        routers[coeff] = {k: v.detach().clone() for k, v in model.named_parameters() if k.endswith("mlp.gate.weight")}
    assert routers[0.0] and any(not torch.allclose(routers[0.0][k], routers[1.0][k], atol=1e-7) for k in routers[0.0])
