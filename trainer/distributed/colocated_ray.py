"""The colocated loop on Ray: N trainer workers, each with its own rollout engine on the same device.

    python -m trainer trainer/configs/grpo_tiny_arithmetic.yaml trainer.use_ray=true trainer.n_gpus_per_node=2

Used when `trainer.use_ray` is set or `trainer.n_gpus_per_node * trainer.nnodes > 1` (the
single-process loop in `trainer/modes/colocated.py` stays the default for one CPU or GPU). One step:

    driver: next prompts, split evenly over the workers
    workers: generate + score their share (engine awake)         -> timing_s/gen
    workers: critic values on their shard (PPO, `critic.enable`)   -> timing_s/values
    driver: advantages on the whole batch (groups never span workers; GAE with the gathered values)
    workers: old log-probs, critic update (PPO), PPO policy update on their shard (FSDP2; engine
             asleep)                                      -> timing_s/update_critic, timing_s/update_actor
    workers: in-process weight sync, FSDP all-gather -> engine      -> timing_s/update_weights
    validation every test_freq (prompts split over the workers)
    checkpoint every save_freq (written)                            -> timing_s/save_checkpoint
    metrics line, then the checkpoint committed (trainer/components/checkpoint.py: a kill loses no line)
    end: each worker's engine facts (graph capture, errors) -> engine.json beside metrics.jsonl

DAPO dynamic sampling (`algorithm.dynamic_sampling`) repeats the generate call and filters groups
with `trainer.modes.steps.collect_scored_batch`, the single-process loop's logic; the kept groups are
rounded down to whole `actor.ppo_mini_batch_size`s so they shard evenly over the workers.

Checkpoints have the single-process layout (`<out_dir>/checkpoints/step_N/`, `trainer/components/checkpoint.py`):
the driver's `state.pt` (step, the sampler's position, the driver's and every worker's random states,
including each engine's sampling generator) and trainer rank 0's `actor.pt` (full weights, AdamW and
LR schedule, `trainer/distributed/actor_state.py`) and, with the critic, its `critic.pt` (full
weights and AdamW, `trainer/distributed/critic_state.py`). A rerun of the same command (`trainer.resume`,
on by default) loads the newest one, puts the weights into every engine, truncates `metrics.jsonl`
to its step and continues; on CPU the resumed run logs the same numbers as an uninterrupted one.

The engine is `rollout.engine: hf`, `static` (static KV cache + CUDA-graph decode; set
`rollout.engine_kwargs.free_on_sleep: false` to keep its buffers and graphs across the update when
the device has room), `vllm` (each worker's engine in processes of its own) or `sglang`. `perf/throughput` divides by the N devices. PPO's critic (`critic.enable`) is
sharded and updated like the policy (Megatron: a `MegatronCritic` in the actor's TP / DP groups), so its update does not depend on N either; the fully-async path
still refuses it (a ConfigError naming the field).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.components.batch import Batch, concat_batches
from trainer.components.metrics import MetricsWriter
from trainer.components.progress import Progress
from trainer.config import TrainerConfig


def uses_ray(cfg: TrainerConfig) -> bool:
    return cfg.trainer.use_ray or cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    size = -(-len(items) // parts)
    return [items[i * size:(i + 1) * size] for i in range(parts)]


def _gather(batches: list[Batch], pad_token_id: int) -> Batch:
    return concat_batches([b for b in batches if len(b)], pad_token_id=pad_token_id)


def validate_on(group: Any, val_data: Any, cfg: TrainerConfig, pad_token_id: int, context: str) -> dict[str, float]:
    """Validation with every worker's engine on a share of the prompts: `val-core/<ds>/acc/mean@N`."""
    if val_data is None:
        return {}
    acc: dict[str, list[float]] = defaultdict(list)
    rew: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
    for items in val_data:
        parts = _split(items, group.world)
        batches = group.call_all_args("generate", [(p, True) for p in parts], context=context)
        for b in batches:
            for ds, a, s in zip(b.meta["data_source"], b.meta["acc"], b.scores.tolist()):
                acc[ds].append(a)
                rew[ds].append(s)
            lengths += b.response_mask.sum(-1).tolist()
    n = cfg.rollout.val_n
    out = {f"val-core/{ds}/acc/mean@{n}": sum(v) / len(v) for ds, v in acc.items()}
    out.update({f"val-aux/{ds}/reward/mean@{n}": sum(v) / len(v) for ds, v in rew.items()})
    out["val-aux/response_length/mean"] = sum(lengths) / max(len(lengths), 1)
    return out


def train_colocated_ray(cfg: TrainerConfig) -> Path:
    from trainer.agent.prompts import agent_rows
    from trainer.components.checkpoint import finish_step
    from trainer.components.faults import fault_point
    from trainer.data.dataset import PromptDataset
    from trainer.distributed.cluster import WorkerDiedError, get, init_ray, uses_gpu, write_failure
    from trainer.distributed.trainer_group import (
        TrainerGroup,
        add_advantages,
        load_group_checkpoint,
        save_group_checkpoint,
        step_metrics,
    )
    from trainer.distributed.trainer_worker import check_supported
    from trainer.models.loading import load_tokenizer
    from trainer.modes.steps import collect_scored_batch, load_split, turn_metrics

    check_supported(cfg)
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    out_dir = Path(cfg.trainer.out_dir)
    writer = MetricsWriter(out_dir / "metrics.jsonl")
    train_rows, val_rows = agent_rows(cfg.agent, *load_split(cfg.data))  # tool-use prompts when agent.enable
    tokenizer = load_tokenizer(cfg.model)
    pad = int(tokenizer.pad_token_id)
    from trainer.models.vlm import load_vision_processor

    processor = load_vision_processor(cfg.model.path, tokenizer)  # images ride in the items to the workers' engines
    train = PromptDataset(train_rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                          batch_size=cfg.data.train_batch_size, seed=cfg.data.seed, shuffle=cfg.data.shuffle,
                          filter_overlong_prompts=cfg.data.filter_overlong_prompts, source=cfg.data.train_files,
                          processor=processor)
    val = None
    if val_rows:
        rows = val_rows[: cfg.data.num_val_samples] if cfg.data.num_val_samples is not None else val_rows
        val = PromptDataset(rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                            batch_size=cfg.data.val_batch_size or len(rows), seed=0, shuffle=False,
                            filter_overlong_prompts=True, source=cfg.data.val_files or cfg.data.train_files,
                            processor=processor)
    init_ray(cfg, num_cpus=world + 1)
    group = None
    step = 0
    progress = None
    try:
        group = TrainerGroup(cfg, num_workers=world, use_gpu=uses_gpu(cfg), with_engine=True, name="colocated")
        group.check_batch(cfg.data.train_batch_size)
        resumed = load_group_checkpoint(group, cfg, writer)
        start = 0
        if resumed is not None:
            start = int(resumed["step"])
            train.load_state_dict(resumed["data"])
        progress = Progress(total=cfg.trainer.total_steps, initial=start, enabled=cfg.trainer.progress)

        def next_scored(ctx: str) -> Batch:  # one generate call: the step's prompts split over the workers' engines
            parts = _split(train.next_batch(), world)
            refs = [w.generate.remote(p, False) for w, p in zip(group.workers, parts)]
            fault_point("rollout", step)  # test-only: the driver killed while the workers generate
            return _gather(get(refs, what="a trainer worker", context=ctx), pad)

        if start == 0 and cfg.trainer.test_freq > 0:
            t0 = time.perf_counter()
            v = validate_on(group, val, cfg, pad, "in validation before training")
            if v:
                writer.write(0, {**v, "timing_s/testing": time.perf_counter() - t0})
                progress.update_val(v)
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            ctx = f"at step {step} ({step - 1} steps completed; their metrics are in {writer.path})"
            t_step = time.perf_counter()
            metrics: dict[str, float] = {}
            t0 = time.perf_counter()
            batch, gen_stats = collect_scored_batch(partial(next_scored, ctx), cfg, pad_token_id=pad,
                                                    multiple_of=cfg.actor.ppo_mini_batch_size)
            metrics.update(gen_stats)
            metrics.update(turn_metrics(batch))  # multi-turn tool use: num_turns/*, agent/*, timing_s/tool
            metrics["timing_s/gen"] = time.perf_counter() - t0
            if cfg.critic.enable:  # PPO: values on the workers' shards, gathered for GAE on the driver
                metrics.update(group.compute_values(batch, context=ctx))
            t0 = time.perf_counter()
            add_advantages(batch, cfg)
            metrics["timing_s/adv"] = time.perf_counter() - t0
            metrics.update(group.train(batch, context=ctx))
            fault_point("update", step)
            metrics.update(rollout_mismatch_metrics(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask))
            t0 = time.perf_counter()
            group.call_all("update_local_engine", context=ctx)
            metrics["timing_s/update_weights"] = time.perf_counter() - t0
            if cfg.trainer.test_freq > 0 and (step % cfg.trainer.test_freq == 0 or step == cfg.trainer.total_steps):
                t0 = time.perf_counter()
                v = validate_on(group, val, cfg, pad, ctx)
                metrics.update(v)
                metrics["timing_s/testing"] = time.perf_counter() - t0
                progress.update_val(v)
            pending = None  # committed after the step's metrics line (trainer/components/checkpoint.py)
            if cfg.trainer.save_freq > 0 and (step % cfg.trainer.save_freq == 0 or step == cfg.trainer.total_steps):
                t0 = time.perf_counter()
                pending = save_group_checkpoint(group, out_dir, step, {"data": train.state_dict()},
                                      keep=cfg.trainer.max_checkpoints, context=ctx)
                metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
            step_s = time.perf_counter() - t_step
            metrics["timing_s/step"] = step_s
            metrics["training/epoch"] = train.epoch
            metrics.update(step_metrics(batch, cfg, step=step, step_s=step_s, num_devices=world))
            finish_step(writer, step, metrics, pending)
            progress.step(metrics)
        progress.close()
        facts = group.call_all("engine_facts", context="after training")
        (out_dir / "engine.json").write_text(json.dumps(facts, indent=2))
    except WorkerDiedError as e:
        if progress is not None:
            progress.close()
        write_failure(out_dir, e, step)
        raise
    finally:
        if group is not None:
            group.shutdown()
    return writer.path
