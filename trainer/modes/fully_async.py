"""The fully-async loop: rollout and training on disjoint devices, concurrently, bounded staleness.

    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml trainer.mode=fully_async \\
        async.trigger_parameter_sync_step=2 async.staleness_threshold=0.5

The rollout worker's engine is any of `rollout.engine: hf | static | vllm | sglang`: partial rollout
interrupts and continues each of them (the built-in engines' host decode loop, vLLM's and SGLang's
own abort plus a resubmission of prompt + partial response; trainer/distributed/rollout_worker.py).

Layout (Ray actors, placement groups; verl's fully_async_policy semantics, REFERENCES.md sec. 2):

    RolloutWorker 0 .. M-1 (async.rollout_gpus = M; one engine replica each, its own prompt shard)
        |  each: a queue of scored groups, tagged with the policy version and the time queued
        v
    driver: take the oldest require_batches x ppo_mini_batch_size groups over all M queues
            -> advantages -> TrainerGroup.train (async.train_gpus = K FSDP2 workers)
            -> every trigger_parameter_sync_step updates: park/interrupt every replica,
               one bucketed broadcast trainer rank 0 -> replicas (ranks 1..M of the sync group),
               compare the replicas' weight digests (M > 1), resume

The staleness cap `max_required` is split over the replicas (the shares sum to it), so the bound
on stale groups per window is the run's, not a replica's. Each replica's prompts per generate
call default to `ceil(required / M)` (`async.rollout_groups_per_call`).

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
idle_ratio`, `fully_async/monitor/queue/mq_queue_size` (summed over the replicas), per replica
`fully_async/count/replica_<i>/{consumed_groups,total_generated_samples}` and (M > 1)
`fully_async/rollouter/replicas_out_of_sync` (replicas whose weight digest differs from replica
0's after the sync; 0 when the broadcast reached all), `fully_async/partial/invalid_token_versions`
(tokens whose policy version is outside the group's start..end or goes backwards; 0), and this
project's
`fully_async/staleness/*` (version lag of consumed groups, stale groups in the current window and
the bound `staleness_threshold * required * trigger_parameter_sync_step` they must stay under).

Checkpoints: every `trainer.save_freq` steps, at the first weight sync at or after that step (and
after the last step), so the rollout worker's weights equal the trainer's. `step_N/` holds the
driver's `state.pt` (step, policy version, the staleness counters, the rollout worker's prompt
position and sampling generator, every trainer worker's random state) (one entry per replica) and trainer rank 0's
`actor.pt` (`trainer/distributed/actor_state.py`); a resume needs the same `async.rollout_gpus`. A rerun of the same command resumes: the
trainers load the state, the rollout worker gets the checkpointed weights by the normal bucketed
sync and adopts the checkpointed version, so the first samples after a resume are on-policy.
Samples that were queued or in flight at the checkpoint are dropped, not saved (their prompts are
skipped; `fully_async/checkpoint/unsaved_groups` counts them at each save), as in verl's fully-async recipe,
whose rollouter checkpoint is its dataloader state only.

At the end the rollout engine's facts (graph capture seconds, any capture error) go to `engine.json`
(a list, one per replica, when M > 1).
A worker that dies, or whose engine dies (a vLLM engine-core process killed: "rollout worker's
engine died at trainer step N ..."), ends the run with `WorkerDiedError` naming the step; the
metrics of the completed steps stay in `metrics.jsonl`, `failure.json` records what happened, and
`rlbench check` renders the report from them (tests/engines/test_vllm_engine_dies_in_a_run.py).
Not yet: a critic; tensor parallelism inside a replica (each rollout worker holds one device).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.components.checkpoint import checkpoint_root, finish_step
from trainer.components.faults import fault_point, rollout_pace_s
from trainer.components.metrics import MetricsWriter
from trainer.components.progress import Progress
from trainer.config import TrainerConfig
from trainer.errors import ConfigError, RLBenchError


def _groups_needed(cfg: TrainerConfig) -> tuple[int, int]:
    a = cfg.async_
    required = a.require_batches * cfg.actor.ppo_mini_batch_size
    max_required = int(required * (1 + a.staleness_threshold) * a.trigger_parameter_sync_step)
    return required, max_required


def replica_shares(max_required: int, num_replicas: int) -> list[int]:
    """Each replica's share of the staleness cap: as equal as integers allow, summing to `max_required`."""
    if max_required < num_replicas:
        raise ConfigError(f"async.rollout_gpus={num_replicas}: the staleness cap allows {max_required} groups per "
                          f"weight version, fewer than one per rollout replica (fix: lower async.rollout_gpus, or "
                          f"raise async.staleness_threshold / async.trigger_parameter_sync_step / "
                          f"actor.ppo_mini_batch_size)")
    base, extra = divmod(max_required, num_replicas)
    return [base + (1 if i < extra else 0) for i in range(num_replicas)]


def token_version_errors(groups: list[tuple[dict, object]]) -> int:
    """Tokens whose policy version lies outside their group's start..end version or decreases along
    the response (each token must keep the version of the weights that sampled it)."""
    bad = 0
    for g, _ in groups:
        for versions, end in zip(g["token_versions"], g["end_version"]):
            prev = g["start_version"]
            for v in versions:
                bad += int(v < prev or v > end)
                prev = max(prev, v)
    return bad


def take_groups(rollouters: list, k: int, context: str, *, poll_s: float = 0.5) -> tuple[list, dict[str, float]]:
    """The `k` oldest queued groups over all replicas (by the time each was queued), and the queue stats.

    One replica: its blocking FIFO `get_groups`. Several: wait on every replica's `queued_times`
    (each answers as soon as its queue grows, or after `poll_s`) until `k` are queued in all, then
    take from each replica the prefix of its queue that falls among the `k` oldest."""
    import ray

    from trainer.distributed.cluster import get

    what = [f"rollout worker {i}" if len(rollouters) > 1 else "rollout worker" for i in range(len(rollouters))]
    if len(rollouters) == 1:
        picks = [k]
    else:
        times: list[list[float]] = [[] for _ in rollouters]
        refs = {i: r.queued_times.remote(0, poll_s) for i, r in enumerate(rollouters)}
        while True:
            ready, _ = ray.wait(list(refs.values()), num_returns=1)
            for i in [i for i, ref in refs.items() if ref in ready]:
                times[i] = get(refs.pop(i), what=what[i], context=context)
            if sum(len(t) for t in times) >= k:
                oldest = sorted((t, i) for i, ts in enumerate(times) for t in ts)[:k]
                picks = [sum(1 for _, i in oldest if i == j) for j in range(len(rollouters))]
                break
            for i in range(len(rollouters)):
                if i not in refs:
                    refs[i] = rollouters[i].queued_times.remote(len(times[i]), poll_s)
    outs = [get(r.get_groups.remote(c), what=what[i], context=context) for i, (r, c) in enumerate(zip(rollouters, picks))]
    groups = [g for out, _ in outs for g in out]
    stats: dict[str, float] = {}
    for key in outs[0][1]:
        stats[key] = float(sum(s[key] for _, s in outs))
    for i, (c, (_, s)) in enumerate(zip(picks, outs)):
        stats[f"fully_async/count/replica_{i}/consumed_groups"] = float(c)
        stats[f"fully_async/count/replica_{i}/total_generated_samples"] = s["fully_async/count/total_generated_samples"]
    return groups, stats


def train_fully_async(cfg: TrainerConfig) -> Path:
    import ray

    from trainer.components.invariants import async_witness_metrics
    from trainer.distributed.cluster import (
        WorkerDiedError,
        get,
        init_ray,
        place_workers,
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
    from trainer.modes.steps import turn_metrics

    check_supported(cfg)
    a = cfg.async_
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling: not supported in trainer.mode=fully_async yet (fix: set it false)")
    required, max_required = _groups_needed(cfg)
    M = a.rollout_gpus
    shares = replica_shares(max_required, M)
    per_call = min(a.rollout_groups_per_call or -(-required // M), min(shares))  # the default fits the smallest share
    if a.rollout_groups_per_call is not None and a.rollout_groups_per_call > min(shares):
        raise ConfigError(f"async.rollout_groups_per_call={a.rollout_groups_per_call}: more prompts per call than a "
                          f"rollout replica may start per weight version ({min(shares)} of the staleness cap "
                          f"{max_required} over {M} replicas), so it could never sample (fix: set it to at most "
                          f"{min(shares)}, or leave it unset)")
    use_gpu = uses_gpu(cfg)
    out_dir = Path(cfg.trainer.out_dir)
    writer = MetricsWriter(out_dir / "metrics.jsonl")
    (out_dir / "failure.json").unlink(missing_ok=True)
    num_devices = a.rollout_gpus + a.train_gpus
    init_ray(cfg, num_cpus=num_devices + 1)

    step, rollouters, trainers, place = 0, [], None, None
    progress = None
    what = "rollout worker" if M == 1 else "a rollout worker"

    def on_all(method: str, *args, context: str = "") -> list:  # the same call on every replica, in parallel
        refs = [getattr(r, method).remote(*args) for r in rollouters]
        return [get(ref, what="rollout worker" if M == 1 else f"rollout worker {i}", context=context)
                for i, ref in enumerate(refs)]

    try:
        place = place_workers(M, use_gpu, per_node=cfg.trainer.n_gpus_per_node, name="rollout-pg")
        rollouters = [ray.remote(RolloutWorker).options(**place.options(i, max_concurrency=8),
                                                        name="rollouter" if i == 0 else f"rollouter-{i}").remote(
            cfg.to_dict(), max_required_groups=shares[i], groups_per_call=per_call, replica=i, num_replicas=M,
            pace_s=rollout_pace_s())  # read here: a Ray cluster started by an earlier run keeps its environment
            for i in range(M)]
        rollouter = rollouters[0]  # validation, and the engine facts of a single replica
        trainers = TrainerGroup(cfg, num_workers=a.train_gpus, use_gpu=use_gpu, with_engine=False)
        trainers.check_batch(required)
        pad_token_id = on_all("pad_token_id", context="while loading the model")[0]
        plans = on_all("weight_plan")
        plan = plans[0]
        if any(p != plan for p in plans):
            raise RLBenchError(f"rollout replicas expect different weights ({len(plans)} plans differ) "
                               f"(fix: every replica must run the same rollout.engine and model)")
        addr, port = get(trainers.workers[0].sync_address.remote(1 + M), what="trainer worker 0")
        get([trainers.workers[0].init_sync_group.remote(addr, port, 1 + M)]
            + [r.init_sync_group.remote(addr, port, 1 + M, 1 + i) for i, r in enumerate(rollouters)],
            what="a worker", context="joining the weight-sync group")
        bucket_mb = 256.0

        def sync_weights(context: str) -> None:  # one bucketed broadcast, trainer rank 0 -> every replica
            sends = [w.send_weights.remote(plan, bucket_mb) for w in trainers.workers]
            receives = [r.receive_weights.remote(plan, bucket_mb) for r in rollouters]
            for i, ref in enumerate(receives):  # the receivers first: a replica's engine dying here is named
                get(ref, what="rollout worker" if M == 1 else f"rollout worker {i}", context=context)
            get(sends, what="a trainer worker", context=context)

        # resume: trainers load the checkpoint, the rollouter gets its weights, version and prompt position
        version, last_val_step, last_save_step, stale_groups_total = 0, 0, 0, 0
        resumed = load_group_checkpoint(trainers, cfg, writer, version_of=lambda st: st["version"])
        start = 0
        if resumed is not None:
            start = int(resumed["step"])
            version, stale_groups_total = int(resumed["version"]), int(resumed["stale_groups_total"])
            last_val_step = last_save_step = start
            states = resumed["rollouters"] if "rollouters" in resumed else [resumed["rollouter"]]
            if len(states) != M:
                raise ConfigError(f"{checkpoint_root(out_dir)}: written by {len(states)} rollout workers, this run has "
                                  f"{M} (fix: resume with async.rollout_gpus={len(states)}, or set trainer.resume=false)")
            sync_weights(f"while resuming from {checkpoint_root(out_dir)} step {start}")
            get([r.load_checkpoint_state.remote(st, version) for r, st in zip(rollouters, states)], what=what,
                context="while resuming")
        progress = Progress(total=cfg.trainer.total_steps, initial=start, enabled=cfg.trainer.progress)

        if start == 0 and cfg.trainer.test_freq > 0:
            t0 = time.perf_counter()
            val = get(rollouter.validate.remote(), what="rollout worker", context="in validation before training")
            if val:
                writer.write(0, {**val, "timing_s/testing": time.perf_counter() - t0})
                progress.update_val(val)
        on_all("start")

        window_stale = 0
        window_bound = math.floor(a.staleness_threshold * required * a.trigger_parameter_sync_step + 1e-9)
        n = cfg.rollout.n
        for step in range(start + 1, cfg.trainer.total_steps + 1):
            ctx = f"at trainer step {step} ({step - 1} steps completed; their metrics are in {writer.path})"
            t_step = time.perf_counter()
            metrics: dict[str, float] = {}
            # 1. wait for `required` groups from the queue (verl logs this wait as timing_s/gen)
            groups, qstats = take_groups(rollouters, required, ctx)
            t_wait = time.perf_counter() - t_step
            fault_point("rollout", step)
            metrics.update(qstats)
            batch = merge_groups(groups, pad_token_id)
            metrics.update(async_witness_metrics(batch))  # trainer/components/invariants.py
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
                "fully_async/partial/invalid_token_versions": float(token_version_errors(groups)),
            })
            fault_point("update", step)
            pending = None  # a checkpoint is committed after the step's metrics line (trainer/components/checkpoint.py)
            # 4. weight sync every trigger_parameter_sync_step updates (and after the last one)
            if step % a.trigger_parameter_sync_step == 0 or step == cfg.trainer.total_steps:
                version += 1
                t0 = time.perf_counter()
                on_all("begin_sync", context=ctx)
                sync_weights(ctx)
                metrics["timing_s/update_weights"] = time.perf_counter() - t0
                if M > 1:  # did the broadcast reach every replica? (their weight digests agree)
                    digests = on_all("weight_fingerprint", context=ctx)
                    metrics["fully_async/rollouter/replicas_out_of_sync"] = float(sum(d != digests[0] for d in digests))
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
                    ros = on_all("checkpoint_state", context=ctx)
                    state = {"version": version, "stale_groups_total": stale_groups_total}
                    state.update({"rollouter": ros[0]} if M == 1 else {"rollouters": ros})
                    pending = save_group_checkpoint(trainers, out_dir, step, state,
                                                    keep=cfg.trainer.max_checkpoints, context=ctx)
                    metrics["timing_s/save_checkpoint"] = time.perf_counter() - t0
                    metrics["fully_async/checkpoint/unsaved_groups"] = float(sum(ro["unsaved_groups"] for ro in ros))
                    last_save_step = step
                ends = on_all("end_sync", version, context=ctx)
                for key in ends[0]:  # summed over the replicas; the idle ratio is their mean
                    total = sum(e[key] for e in ends)
                    metrics[key] = total / M if key == "fully_async/rollouter/idle_ratio" else total
                window_stale = 0
            step_s = time.perf_counter() - t_step
            metrics.update(step_metrics(batch, cfg, step=step, step_s=step_s, num_devices=num_devices))
            metrics.update({"timing_s/gen": t_wait, "timing_s/adv": t_adv, "timing_s/step": step_s,
                            "fully_async/trainer/idle_ratio": t_wait / step_s})
            finish_step(writer, step, metrics, pending)
            progress.step(metrics)
        progress.close()
        on_all("stop", context="while stopping")
        facts = on_all("engine_facts", context="while stopping")
        (out_dir / "engine.json").write_text(json.dumps(facts[0] if M == 1 else facts, indent=2))
    except WorkerDiedError as e:
        if progress is not None:
            progress.close()
        write_failure(out_dir, e, step)
        raise
    finally:
        for handle in rollouters:
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 -- already dead
                pass
        if trainers is not None:
            trainers.shutdown()
        if place is not None:
            place.remove()
    if not writer.path.exists():
        raise RLBenchError(f"fully-async run wrote no metrics to {writer.path} (fix: check the worker logs)")
    return writer.path
