"""The colocated loop on Ray: N trainer workers, each with its own rollout engine on the same device.

    python -m trainer trainer/configs/grpo_tiny_arithmetic.yaml trainer.use_ray=true trainer.n_gpus_per_node=2

Used when `trainer.use_ray` is set or `trainer.n_gpus_per_node * trainer.nnodes > 1` (the
single-process loop in `trainer/modes/colocated.py` stays the default for one CPU or GPU). One step:

    driver: next prompts, split evenly over the workers
    workers: generate + score their share (engine awake)         -> timing_s/gen
    driver: advantages on the whole batch (groups never span workers)
    workers: old log-probs + PPO update on their shard (FSDP2; engine asleep) -> timing_s/update_actor
    workers: in-process weight sync, FSDP all-gather -> engine      -> timing_s/update_weights
    validation every test_freq (prompts split over the workers), metrics line
    end: each worker's engine facts (graph capture, errors) -> engine.json beside metrics.jsonl

The engine is `rollout.engine: hf` or `static` (static KV cache + CUDA-graph decode; set
`rollout.engine_kwargs.free_on_sleep: false` to keep its buffers and graphs across the update when
the device has room). `perf/throughput` divides by the N devices. Not yet: checkpoints/resume, dynamic sampling, PPO's
critic and the KL reference in this path (they raise a ConfigError naming the field).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.batch import Batch, concat_batches
from trainer.config import TrainerConfig
from trainer.errors import ConfigError
from trainer.metrics import MetricsWriter
from trainer.progress import Progress


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
    from trainer.data.dataset import PromptDataset
    from trainer.distributed.cluster import WorkerDiedError, init_ray, uses_gpu, write_failure
    from trainer.distributed.trainer_group import TrainerGroup, add_advantages, step_metrics
    from trainer.distributed.trainer_worker import check_supported
    from trainer.models import load_tokenizer
    from trainer.steps import load_split

    check_supported(cfg)
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling: not supported with Ray workers yet (fix: set it false, or run "
                          "single-process with trainer.n_gpus_per_node=1)")
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    out_dir = Path(cfg.trainer.out_dir)
    writer = MetricsWriter(out_dir / "metrics.jsonl")
    writer.truncate_after(-1)
    train_rows, val_rows = load_split(cfg.data)
    tokenizer = load_tokenizer(cfg.model)
    pad = int(tokenizer.pad_token_id)
    train = PromptDataset(train_rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                          batch_size=cfg.data.train_batch_size, seed=cfg.data.seed, shuffle=cfg.data.shuffle,
                          filter_overlong_prompts=cfg.data.filter_overlong_prompts, source=cfg.data.train_files)
    val = None
    if val_rows:
        rows = val_rows[: cfg.data.num_val_samples] if cfg.data.num_val_samples is not None else val_rows
        val = PromptDataset(rows, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                            batch_size=cfg.data.val_batch_size or len(rows), seed=0, shuffle=False,
                            filter_overlong_prompts=True, source=cfg.data.val_files or cfg.data.train_files)
    init_ray(cfg, num_cpus=world + 1)
    group = None
    step = 0
    progress = Progress(total=cfg.trainer.total_steps, initial=0, enabled=cfg.trainer.progress)
    try:
        group = TrainerGroup(cfg, num_workers=world, use_gpu=uses_gpu(cfg), with_engine=True, name="colocated")
        group.check_batch(cfg.data.train_batch_size)
        if cfg.trainer.test_freq > 0:
            t0 = time.perf_counter()
            v = validate_on(group, val, cfg, pad, "in validation before training")
            if v:
                writer.write(0, {**v, "timing_s/testing": time.perf_counter() - t0})
                progress.update_val(v)
        for step in range(1, cfg.trainer.total_steps + 1):
            ctx = f"at step {step} ({step - 1} steps completed; their metrics are in {writer.path})"
            t_step = time.perf_counter()
            metrics: dict[str, float] = {}
            t0 = time.perf_counter()
            parts = _split(train.next_batch(), world)
            batch = _gather(group.call_all_args("generate", [(p, False) for p in parts], context=ctx), pad)
            metrics["timing_s/gen"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            add_advantages(batch, cfg)
            metrics["timing_s/adv"] = time.perf_counter() - t0
            metrics.update(group.train(batch, context=ctx))
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
            step_s = time.perf_counter() - t_step
            metrics["timing_s/step"] = step_s
            metrics["training/epoch"] = train.epoch
            metrics.update(step_metrics(batch, cfg, step=step, step_s=step_s, num_devices=world))
            writer.write(step, metrics)
            progress.step(metrics)
        progress.close()
        facts = group.call_all("engine_facts", context="after training")
        (out_dir / "engine.json").write_text(json.dumps(facts, indent=2))
    except WorkerDiedError as e:
        progress.close()
        write_failure(out_dir, e, step)
        raise
    finally:
        if group is not None:
            group.shutdown()
    return writer.path
