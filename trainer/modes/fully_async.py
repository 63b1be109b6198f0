"""The fully-async loop: rollout and training on disjoint devices, concurrently, bounded staleness.

    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml trainer.mode=fully_async \\
        async.trigger_parameter_sync_step=2 async.staleness_threshold=0.5

The rollout worker's engine is any of `rollout.engine: hf | static | vllm | sglang`: partial rollout
interrupts and continues each of them (the built-in engines' host decode loop, vLLM's and SGLang's
own abort plus a resubmission of prompt + partial response; trainer/distributed/rollout_worker.py).

Layout (Ray actors, placement groups; verl's fully_async_policy semantics, REFERENCES.md sec. 2):

    RolloutWorker (async.rollout_gpus=1)  --queue of scored groups, tagged with the policy version-->
    driver: take require_batches x ppo_mini_batch_size groups -> advantages -> TrainerGroup.train
            (async.train_gpus FSDP2 workers) -> every trigger_parameter_sync_step updates:
            park/interrupt the rollouter, bucketed broadcast trainer rank 0 -> rollouter, resume

One trainer step is one update on `required = require_batches * ppo_mini_batch_size` groups
(verl's definition); `data.train_batch_size` is not used in this mode. The old log-probs are the
trainer's current weights (recomputed, or the update forward itself when the step is one
mini-batch, which is the same number); tokens sampled by older versions keep their own
`rollout_logprobs`, and `actor.tis_cap` turns on the truncated importance-sampling correction
`min(exp(old - rollout), cap)` for that policy lag.

Metrics (verl's names where verl has them): `timing_s/gen` is the trainer's *wait* for samples;
`perf/throughput` divides by trainer + rollout devices; `fully_async/count/*` (current version,
stale samples / trajectories processed), `fully_async/partial/*` (total_partial_num,
partial_ratio, max_partial_span), `fully_async/trainer/idle_ratio`, `fully_async/rollouter/
idle_ratio`, `fully_async/monitor/queue/mq_queue_size`, and this project's
`fully_async/staleness/*` (version lag of consumed groups, stale groups in the current window and
the bound `staleness_threshold * required * trigger_parameter_sync_step` they must stay under).

Checkpoints: every `trainer.save_freq` steps, at the first weight sync at or after that step (and
after the last step), so the rollout worker's weights equal the trainer's. `step_N/` holds the
driver's `state.pt` (step, policy version, the staleness counters, the rollout worker's prompt
position and sampling generator, every trainer worker's random state) and trainer rank 0's
`actor.pt` (`trainer/distributed/actor_state.py`). A rerun of the same command resumes: the
trainers load the state, the rollout worker gets the checkpointed weights by the normal bucketed
sync and adopts the checkpointed version, so the first samples after a resume are on-policy.
Samples that were queued or in flight at the checkpoint are dropped, not saved (their prompts are
skipped; `fully_async/checkpoint/unsaved_groups` counts them at each save), as in verl's fully-async recipe,
whose rollouter checkpoint is its dataloader state only.

At the end the rollout engine's facts (graph capture seconds, any capture error) go to `engine.json`.
A worker that dies ends the run with `WorkerDiedError` naming the step; the metrics of the
completed steps stay in `metrics.jsonl` and `failure.json` records what happened.
Not yet: more than one rollout worker, a critic.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.checkpoint import checkpoint_root, finish_step
from trainer.config import TrainerConfig
from trainer.errors import ConfigError, RLBenchError
from trainer.faults import fault_point
from trainer.metrics import MetricsWriter
from trainer.progress import Progress


def _groups_needed(cfg: TrainerConfig) -> tuple[int, int]:
    a = cfg.async_
    required = a.require_batches * cfg.actor.ppo_mini_batch_size
    max_required = int(required * (1 + a.staleness_threshold) * a.trigger_parameter_sync_step)
    return required, max_required


def train_fully_async(cfg: TrainerConfig) -> Path:
    import ray

    from trainer.distributed.cluster import (
        WorkerDiedError,
        bundle_options,
        get,
        init_ray,
        placement_group_for,
        uses_gpu,
        write_failure,
    )
    from trainer.distributed.rollout_worker import RolloutWorker, merge_groups
    from trainer.distributed.trainer_group import (
        TrainerGroup,
        add_advantages,
        load_group_checkpoint,
        save_group_checkpoint,
        step_metrics,
    )
    from trainer.distributed.trainer_worker import check_supported
    from trainer.steps import turn_metrics

    check_supported(cfg)
    a = cfg.async_
    if a.rollout_gpus != 1:
        raise ConfigError(f"async.rollout_gpus={a.rollout_gpus}: one rollout worker is supported (fix: set "
                          f"async.rollout_gpus=1)")
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling: not supported in trainer.mode=fully_async yet (fix: set it false)")
    required, max_required = _groups_needed(cfg)
    use_gpu = uses_gpu(cfg)
    out_dir = Path(cfg.trainer.out_dir)
    writer = MetricsWriter(out_dir / "metrics.jsonl")
    (out_dir / "failure.json").unlink(missing_ok=True)
    num_devices = a.rollout_gpus + a.train_gpus
    init_ray(cfg, num_cpus=num_devices + 1)

    step, rollouter, trainers, pg = 0, None, None, None
    progress = None
    try:
        pg = placement_group_for(1, use_gpu, name="rollout-pg")
        rollouter = ray.remote(RolloutWorker).options(**bundle_options(pg, 0, use_gpu, max_concurrency=8),
                                                      name="rollouter").remote(
            cfg.to_dict(), max_required_groups=max_required, groups_per_call=a.rollout_groups_per_call or required)
        trainers = TrainerGroup(cfg, num_workers=a.train_gpus, use_gpu=use_gpu, with_engine=False)
        trainers.check_batch(required)
        pad_token_id = get(rollouter.pad_token_id.remote(), what="rollout worker", context="while loading the model")
        plan = get(rollouter.weight_plan.remote(), what="rollout worker")
        addr, port = get(trainers.workers[0].address.remote(), what="trainer worker 0")
        get([trainers.workers[0].init_sync_group.remote(addr, port, 2),
             rollouter.init_sync_group.remote(addr, port, 2, 1)], what="a worker", context="joining the weight-sync group")
        bucket_mb = 256.0

        def sync_weights(context: str) -> None:  # bucketed broadcast, trainer rank 0 -> rollouter
            get([w.send_weights.remote(plan, bucket_mb) for w in trainers.workers]
                + [rollouter.receive_weights.remote(plan, bucket_mb)], what="a worker", context=context)

        # resume: trainers load the checkpoint, the rollouter gets its weights, version and prompt position
        version, last_val_step, last_save_step, stale_groups_total = 0, 0, 0, 0
        resumed = load_group_checkpoint(trainers, cfg, writer, version_of=lambda st: st["version"])
        start = 0
        if resumed is not None:
            start = int(resumed["step"])
            version, stale_groups_total = int(resumed["version"]), int(resumed["stale_groups_total"])
            last_val_step = last_save_step = start
            sync_weights(f"while resuming from {checkpoint_root(out_dir)} step {start}")
            get(rollouter.load_checkpoint_state.remote(resumed["rollouter"], version), what="rollout worker",
                context="while resuming")
        progress = Progress(total=cfg.trainer.total_steps, initial=start, enabled=cfg.trainer.progress)

        if start == 0 and cfg.trainer.test_freq > 0:
            t0 = time.perf_counter()
            val = get(rollouter.validate.remote(), what="rollout worker", context="in validation before training")
            if val:
                writer.write(0, {**val, "timing_s/testing": time.perf_counter() - t0})
                progress.update_val(val)
        get(rollouter.start.remote(), what="rollout worker")

        window_stale = 0
        window_bound = math.floor(a.staleness_threshold * required * a.trigger_parameter_sync_step + 1e-9)
        n = cfg.rollout.n
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            ctx = f"at trainer step {step} ({step - 1} steps completed; their metrics are in {writer.path})"
            t_step = time.perf_counter()
            metrics: dict[str, float] = {}
            # 1. wait for `required` groups from the queue (verl logs this wait as timing_s/gen)
            groups, qstats = get(rollouter.get_groups.remote(required), what="rollout worker", context=ctx)
            t_wait = time.perf_counter() - t_step
            fault_point("rollout", step)
            metrics.update(qstats)
            batch = merge_groups(groups, pad_token_id)
            metrics.update(turn_metrics(batch))  # multi-turn tool use: num_turns/*, agent/*, timing_s/tool
            # 2. advantages, update
            t0 = time.perf_counter()
            add_advantages(batch, cfg)
            t_adv = time.perf_counter() - t0
            metrics.update(trainers.train(batch, context=ctx))
            metrics.update(rollout_mismatch_metrics(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask))
            # 3. staleness and partial-rollout accounting of the consumed groups
            lags = [version - g["start_version"] for g, _ in groups]
            stale = sum(1 for x in lags if x > 0)
            stale_groups_total += stale
            window_stale += stale
            spans = [e - g["start_version"] for g, _ in groups for e in g["end_version"]]
            num_partial = sum(1 for s in spans if s != 0)
            metrics.update({
                "fully_async/count/current_param_version": float(version),
                "fully_async/count/stale_samples_processed": float(stale_groups_total),
                "fully_async/count/stale_trajectory_processed": float(stale_groups_total * n),
                "fully_async/staleness/max_version_lag": float(max(lags)),
                "fully_async/staleness/mean_version_lag": sum(lags) / len(lags),
                "fully_async/staleness/stale_groups_in_window": float(window_stale),
                "fully_async/staleness/max_stale_groups_per_window": float(window_bound),
                "fully_async/partial/total_partial_num": float(num_partial),
                "fully_async/partial/partial_ratio": num_partial / len(spans),
                "fully_async/partial/max_partial_span": float(max(spans)),
                "fully_async/partial/interrupted_groups": float(sum(1 for g, _ in groups if g["interrupted"])),
            })
            fault_point("update", step)
            pending = None  # a checkpoint is committed after the step's metrics line (trainer/checkpoint.py)
            # 4. weight sync every trigger_parameter_sync_step updates (and after the last one)
            if step % a.trigger_parameter_sync_step == 0 or step == cfg.trainer.total_steps:
                version += 1
                t0 = time.perf_counter()
                get(rollouter.begin_sync.remote(), what="rollout worker", context=ctx)
                sync_weights(ctx)
                metrics["timing_s/update_weights"] = time.perf_counter() - t0
                due = cfg.trainer.test_freq > 0 and (step // cfg.trainer.test_freq > last_val_step // cfg.trainer.test_freq
                                                     or step == cfg.trainer.total_steps)
                if due:
                    t0 = time.perf_counter()
                    val = get(rollouter.validate.remote(), what="rollout worker", context=ctx)
                    metrics.update(val)
                    metrics["timing_s/testing"] = time.perf_counter() - t0
                    progress.update_val(val)
                    last_val_step = step
                f = cfg.trainer.save_freq
                if f > 0 and (step // f > last_save_step // f or step == cfg.trainer.total_steps):
                    t0 = time.perf_counter()  # parked rollouter, weights in sync: a consistent cut
                    ro = get(rollouter.checkpoint_state.remote(), what="rollout worker", context=ctx)
                    pending = save_group_checkpoint(trainers, out_dir, step, {
                        "version": version, "stale_groups_total": stale_groups_total, "rollouter": ro},
                        keep=cfg.trainer.max_checkpoints, context=ctx)
                    metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
                    metrics["fully_async/checkpoint/unsaved_groups"] = float(ro["unsaved_groups"])
                    last_save_step = step
                metrics.update(get(rollouter.end_sync.remote(version), what="rollout worker", context=ctx))
                window_stale = 0
            step_s = time.perf_counter() - t_step
            metrics.update(step_metrics(batch, cfg, step=step, step_s=step_s, num_devices=num_devices))
            metrics.update({"timing_s/gen": t_wait, "timing_s/adv": t_adv, "timing_s/step": step_s,
                            "fully_async/trainer/idle_ratio": t_wait / step_s})
            finish_step(writer, step, metrics, pending)
            progress.step(metrics)
        progress.close()
        get(rollouter.stop.remote(), what="rollout worker", context="while stopping")
        facts = get(rollouter.engine_facts.remote(), what="rollout worker", context="while stopping")
        (out_dir / "engine.json").write_text(json.dumps(facts, indent=2))
    except WorkerDiedError as e:
        if progress is not None:
            progress.close()
        write_failure(out_dir, e, step)
        raise
    finally:
        for handle in ([rollouter] if rollouter is not None else []):
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 -- already dead
                pass
        if trainers is not None:
            trainers.shutdown()
        if pg is not None:
            ray.util.remove_placement_group(pg)
    if not writer.path.exists():
        raise RLBenchError(f"fully-async run wrote no metrics to {writer.path} (fix: check the worker logs)")
    return writer.path
