"""The pieces of one RL step that both execution modes share: build, generate, score, validate.

The loops in `trainer/modes/` call these in order; each returns plain tensors or dicts, so a
step reads top to bottom in the loop itself.
"""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.algorithms.dapo import dynamic_sampling_keep, overlong_reward_penalty
from trainer.backends.actor import Actor
from trainer.backends.build import build_actor_and_critic
from trainer.backends.critic import Critic
from trainer.components.batch import Batch, batch_from_rollout, concat_batches
from trainer.components.val_samples import sample_records, write_samples
from trainer.config import DataConfig, TrainerConfig
from trainer.data.dataset import PromptDataset, load_rows
from trainer.data.synthetic import SPEC_PREFIX, ensure_synthetic, load_synthetic
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.models.vlm import check_multimodal_support, freeze_vision_tower, load_vision_processor
from trainer.rewards import compute_score
from trainer.rollout.base import RolloutEngine, SamplingParams
from trainer.rollout.registry import build_engine


@dataclass
class Components:
    cfg: TrainerConfig
    tokenizer: Any
    actor: Actor
    engine: RolloutEngine
    ref: torch.nn.Module | None
    critic: Critic | None
    train_data: PromptDataset
    val_data: PromptDataset | None
    device: torch.device
    eos_ids: list[int]


def load_split(data: DataConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and validation rows: from files, or a synthetic task's disjoint splits."""
    if data.train_files.startswith(SPEC_PREFIX):
        train, val = ensure_synthetic(data.train_files)
    else:
        train, val = load_rows(data.train_files), []
    if data.val_files:
        val = load_synthetic(data.val_files) if data.val_files.startswith(SPEC_PREFIX) else load_rows(data.val_files)
    return train, val


def pick_device(cfg: TrainerConfig) -> torch.device:
    if cfg.trainer.device == "cpu" or (cfg.trainer.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return torch.device("cuda", local_rank)


def build_components(cfg: TrainerConfig, *, with_engine: bool = True) -> Components:
    """Load the model, data, rollout engine, reference and critic a run needs."""
    device = pick_device(cfg)
    check_multimodal_support(cfg)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(cfg.trainer.seed)
    train_rows, val_rows = load_split(cfg.data)
    if cfg.agent.enable:  # tool-use prompts: the call format in a system message, the agent's reward
        from trainer.agent.prompts import agent_rows

        train_rows, val_rows = agent_rows(cfg.agent, train_rows, val_rows)
    # Load data before the model: a bad dataset path fails in a second, not after a model load.
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.trainer.seed)
    processor = load_vision_processor(cfg.model.path, tokenizer, model)  # None for a text-only model
    if cfg.actor.freeze_vision_tower:
        freeze_vision_tower(model)
    train = PromptDataset(train_rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                          batch_size=cfg.data.train_batch_size, seed=cfg.data.seed, shuffle=cfg.data.shuffle,
                          filter_overlong_prompts=cfg.data.filter_overlong_prompts, source=cfg.data.train_files,
                          processor=processor)
    val = None
    if val_rows:
        if cfg.data.num_val_samples is not None:
            val_rows = val_rows[: cfg.data.num_val_samples]
        val = PromptDataset(val_rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                            batch_size=cfg.data.val_batch_size or len(val_rows), seed=0, shuffle=False,
                            filter_overlong_prompts=True, source=cfg.data.val_files or cfg.data.train_files,
                            processor=processor)
    eos = eos_token_ids(tokenizer, model)
    ref = copy.deepcopy(model) if cfg.actor.use_kl_loss else None  # the initial weights; laid out below
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(device)  # the engine below samples from this model
    # the policy and PPO's critic, by the backend actor.strategy names (trainer/backends/build.py)
    actor, critic = build_actor_and_critic(model, cfg, cfg.actor, device=device, shard=False)
    if ref is not None:  # the KL loss's reference policy, in the policy's layout
        ref = actor.reference_policy(ref)
    engine = build_engine(cfg, model, tokenizer, eos, device) if with_engine else None
    if engine is not None and cfg.agent.enable:  # multi-turn tool use around the configured engine
        from trainer.agent.loop import AgentRolloutEngine

        engine = AgentRolloutEngine(engine, tokenizer, cfg.agent, out_dir=cfg.trainer.out_dir)
    return Components(cfg, tokenizer, actor, engine, ref, critic, train, val, device, eos)


def sampling_params(cfg: TrainerConfig, eos_ids: list[int], *, validation: bool = False) -> SamplingParams:
    r = cfg.rollout
    if validation:
        return SamplingParams(n=r.val_n, temperature=r.val_temperature, greedy=r.val_greedy,
                              max_new_tokens=cfg.data.max_response_length, stop_token_ids=eos_ids)
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=cfg.data.max_response_length, stop_token_ids=eos_ids)


def generate(engine: RolloutEngine, items: list[dict[str, Any]], params: SamplingParams, *, pad_token_id: int,
             max_response_length: int) -> Batch:
    """Sample `params.n` responses per prompt item and pad them into a Batch (meta carries the rows).

    Multi-turn rollouts (the agent engine) also put each response's turn counts in meta
    (`num_turns`, `tool_calls`, `tool_errors`) and `num_turns` into its extra_info (the ReTool reward).
    Prompts with images pass their `multi_modal_inputs` to the engine and into meta (the trainer's
    forward reads them there); `images` (the decoded figures) go to meta for validation samples,
    and to engines that process images themselves (`engine.takes_images`: vLLM).
    """
    prompts = [it["prompt_ids"] for it in items]
    if any("multi_modal_inputs" in it for it in items):
        mm = [it.get("multi_modal_inputs") for it in items]
        images = {"images": [it.get("images") for it in items]} if getattr(engine, "takes_images", False) else {}
        rollout = engine.generate(prompts, params, multi_modal_inputs=mm, **images)
    else:
        rollout = engine.generate(prompts, params)
    batch = batch_from_rollout(rollout, pad_token_id=pad_token_id, max_response_length=max_response_length)
    batch.meta = {k: [items[g][k] for g in rollout.group_index] for k in ("data_source", "ground_truth", "extra_info")}
    if any("multi_modal_inputs" in it for it in items):
        for key in ("multi_modal_inputs", "images"):
            batch.meta[key] = [items[g].get(key) for g in rollout.group_index]
    batch.meta["finish_reason"] = rollout.finish_reasons
    if rollout.turn_stats:
        from trainer.agent.trajectory import TURN_KEYS

        for key in TURN_KEYS:
            batch.meta[key] = [st.get(key, 0) for st in rollout.turn_stats]
        batch.meta["extra_info"] = [{**(extra or {}), "num_turns": st["num_turns"]}
                                    for extra, st in zip(batch.meta["extra_info"], rollout.turn_stats)]
    return batch


def score(batch: Batch, tokenizer: Any, cfg: TrainerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule rewards by data_source: `(scores [N], acc [N])`, DAPO overlong shaping applied to scores."""
    texts = tokenizer.batch_decode(batch.responses.masked_fill(batch.response_mask == 0, tokenizer.pad_token_id),
                                   skip_special_tokens=True)
    results = [compute_score(ds, text, gt, extra) for ds, text, gt, extra in
               zip(batch.meta["data_source"], texts, batch.meta["ground_truth"], batch.meta["extra_info"])]
    scores = torch.tensor([r.score for r in results], dtype=torch.float32)
    acc = torch.tensor([r.acc for r in results], dtype=torch.float32)
    ob = cfg.algorithm.overlong_buffer
    if ob.enable:
        scores = scores + overlong_reward_penalty(batch.response_mask.sum(-1), max_response_length=cfg.data.max_response_length,
                                                  overlong_buffer_len=ob.len, penalty_factor=ob.penalty_factor)
    batch.meta["text"] = texts
    return scores, acc


def generate_scored_batch(c: Components, items_fn: Any) -> tuple[Batch, dict[str, float]]:
    """Generate and score one step's batch with the process's own engine (DAPO dynamic sampling through
    `collect_scored_batch`)."""
    params = sampling_params(c.cfg, c.eos_ids)

    def next_scored() -> Batch:
        batch = generate(c.engine, items_fn(), params, pad_token_id=c.tokenizer.pad_token_id,
                         max_response_length=c.cfg.data.max_response_length)
        batch.scores, _ = score(batch, c.tokenizer, c.cfg)
        return batch

    batch, stats = collect_scored_batch(next_scored, c.cfg, pad_token_id=c.tokenizer.pad_token_id)
    stats.update(turn_metrics(batch))
    return batch, stats


def collect_scored_batch(next_scored: Callable[[], Batch], cfg: TrainerConfig, *, pad_token_id: int,
                         multiple_of: int = 1) -> tuple[Batch, dict[str, float]]:
    """One step's scored batch from `next_scored()` (one generate call over `data.train_batch_size`
    prompts, scores set). With DAPO dynamic sampling (`algorithm.dynamic_sampling`), drop groups whose
    scores are all equal and call again (up to `max_num_gen_batches` calls) until `train_batch_size`
    groups remain; keep the first `train_batch_size`.

    `multiple_of`: the number of kept groups is rounded down to a multiple of it (the Ray path needs
    whole mini-batches to shard over its workers). Departure from verl: when the cap is reached with
    fewer groups than asked, verl raises; this trains on the groups it has, or -- when none (or fewer
    than `multiple_of`) survive -- on the last call's batch unfiltered (its equal-score groups get
    zero advantage). `train/num_gen_batches` and `train/kept_groups` say which happened.
    """
    want = cfg.data.train_batch_size
    if not cfg.algorithm.dynamic_sampling:
        return next_scored(), {}
    kept: list[Batch] = []
    num_groups, num_gen = 0, 0
    while True:
        batch = next_scored()
        num_gen += 1
        keep = dynamic_sampling_keep(batch.scores, batch.group_index)  # [N] bool
        if keep.any():
            kept.append(batch.select(keep.nonzero().squeeze(-1)))
            num_groups += int(torch.unique(batch.group_index[keep]).numel())
        if num_groups >= want or num_gen >= cfg.algorithm.max_num_gen_batches:
            break
    take = min(num_groups, want)
    take -= take % multiple_of
    if take > 0:
        merged = concat_batches(kept, pad_token_id=pad_token_id)
        groups = _groups_in_order(merged.group_index)[:take]
        batch = merged.select(torch.isin(merged.group_index, groups).nonzero().squeeze(-1))
    num_kept = int(torch.unique(batch.group_index).numel())
    return batch, {"train/num_gen_batches": float(num_gen), "train/kept_groups": float(num_kept)}


def _groups_in_order(group_index: torch.Tensor) -> torch.Tensor:
    """Distinct group ids `[G]` in order of first appearance."""
    seen: dict[int, None] = dict.fromkeys(group_index.tolist())
    return torch.tensor(list(seen), dtype=group_index.dtype)


def turn_metrics(batch: Batch, prefix: str = "") -> dict[str, float]:
    """`num_turns/mean|max|min`, `agent/tool_calls/mean`, `agent/tool_call_ratio`, `agent/tool_errors/mean`,
    `agent/tool_errors/total`, `agent/tool_error_ratio` (errored calls / calls, 0 with no call),
    `agent/tool_seconds/mean`, `agent/tool_overlap_ratio` (share of tool run time hidden behind other
    samples' decoding) and `timing_s/tool` (generation's wall time blocked on
    tools) of a multi-turn batch ({} otherwise)."""
    if "num_turns" not in batch.meta:
        return {}
    turns = torch.tensor(batch.meta["num_turns"], dtype=torch.float32)  # [N]
    calls = torch.tensor(batch.meta["tool_calls"], dtype=torch.float32)  # [N]
    errors = torch.tensor(batch.meta["tool_errors"], dtype=torch.float32)  # [N]
    return {f"{prefix}num_turns/mean": float(turns.mean()), f"{prefix}num_turns/max": float(turns.max()),
            f"{prefix}num_turns/min": float(turns.min()), f"{prefix}agent/tool_calls/mean": float(calls.mean()),
            f"{prefix}agent/tool_call_ratio": float((calls > 0).float().mean()),
            f"{prefix}agent/tool_errors/mean": float(errors.mean()), f"{prefix}agent/tool_errors/total": float(errors.sum()),
            f"{prefix}agent/tool_error_ratio": float(errors.sum()) / max(1.0, float(calls.sum())),
            f"{prefix}agent/tool_seconds/mean": float(sum(batch.meta.get("tool_s", [0.0])) / max(1, float(calls.sum()))),
            f"{prefix}agent/tool_overlap_ratio": min(1.0, float(sum(batch.meta.get("tool_overlap_s", [0.0])))
                                                     / max(1e-9, float(sum(batch.meta.get("tool_s", [0.0]))))),
            f"{prefix}timing_s/tool": float(sum(batch.meta.get("tool_wall_s", [0.0])))}


@torch.no_grad()
def validate(c: Components, step: int | None = None) -> dict[str, float]:
    """Greedy (by default) generation on the validation set: `val-core/<data_source>/acc/mean@N`.
    With `trainer.log_val_generations` > 0 and a `step`, the first responses go to
    `<out_dir>/samples/step_<step>.jsonl` (`trainer/components/val_samples.py`)."""
    if c.val_data is None:
        return {}
    cfg = c.cfg
    params = sampling_params(cfg, c.eos_ids, validation=True)
    acc_by_ds: dict[str, list[float]] = defaultdict(list)
    score_by_ds: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
    turns: list[float] = []
    samples: list[dict[str, Any]] = []
    for items in c.val_data:
        batch = generate(c.engine, items, params, pad_token_id=c.tokenizer.pad_token_id,
                         max_response_length=cfg.data.max_response_length)
        scores, acc = score(batch, c.tokenizer, cfg)
        if step is not None and len(samples) < cfg.trainer.log_val_generations:
            samples += sample_records(batch, c.tokenizer, scores, acc, step=step,
                                      num=cfg.trainer.log_val_generations - len(samples))
        for ds, a, s in zip(batch.meta["data_source"], acc.tolist(), scores.tolist()):
            acc_by_ds[ds].append(a)
            score_by_ds[ds].append(s)
        lengths += batch.response_mask.sum(-1).tolist()
        turns += [float(t) for t in batch.meta.get("num_turns", [])]
    if samples:
        write_samples(cfg.trainer.out_dir, step, samples)
    n = params.n
    out = {f"val-core/{ds}/acc/mean@{n}": sum(v) / len(v) for ds, v in acc_by_ds.items()}
    out.update({f"val-aux/{ds}/reward/mean@{n}": sum(v) / len(v) for ds, v in score_by_ds.items()})
    out["val-aux/response_length/mean"] = sum(lengths) / max(len(lengths), 1)
    if turns:
        out["val-aux/num_turns/mean"] = sum(turns) / len(turns)
    return out
