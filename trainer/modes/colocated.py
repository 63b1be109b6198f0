"""The colocated loop: rollout and training take turns on the same devices.

One step, top to bottom (verl's `RayPPOTrainer.fit`, without the controller indirection):

    prompts -> generate (n per prompt) -> reward by data_source (+ DAPO dynamic sampling, overlong)
            -> old log-probs (recomputed by the trainer, or the rollout's, by config)
            -> reference log-probs (when the KL loss is on) -> values (PPO)
            -> advantages (GRPO / Dr.GRPO / RLOO / GAE)
            -> critic update (PPO) -> actor update (PPO epochs x mini-batches x micro-batches)
            -> weight sync to the rollout engine -> validation every test_freq
            -> checkpoint every save_freq (written) -> metrics line -> checkpoint committed

Run it: `python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml`.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainer.algorithms.advantages import compute_advantages, scores_to_token_rewards
from trainer.algorithms.mismatch import rollout_mismatch_metrics
from trainer.components.checkpoint import (
    announce_resume,
    finish_step,
    load_checkpoint,
    prepare_checkpoint,
    resume_or_start,
)
from trainer.components.faults import fault_point
from trainer.components.invariants import StepWitness
from trainer.components.metrics import MetricsWriter, Timer, data_metrics
from trainer.components.progress import Progress
from trainer.modes.steps import Components, generate_scored_batch, validate
from trainer.rollout.base import weight_sync_metrics


def _state(c: Components) -> dict:
    state = {"actor": c.actor.state_dict(), "data": c.train_data.state_dict(),
             "engine_generator": c.engine.generator.get_state() if hasattr(c.engine, "generator") else None}
    if c.critic is not None:
        state["critic"] = c.critic.state_dict()
    return state


def _resume(c: Components, writer: MetricsWriter) -> int:
    """Load the newest checkpoint in out_dir (if resuming) and return the step it finished."""
    ckpt = resume_or_start(c.cfg.trainer.out_dir, writer.path, resume=c.cfg.trainer.resume)
    if ckpt is None:
        return 0
    state = load_checkpoint(ckpt)
    c.actor.load_state_dict(state["actor"])
    c.train_data.load_state_dict(state["data"])
    if c.critic is not None:
        c.critic.load_state_dict(state["critic"])
    if state.get("engine_generator") is not None:
        c.engine.generator.set_state(state["engine_generator"])
    c.engine.update_weights(c.actor.named_weights())
    c.engine.version = state["step"]
    announce_resume(ckpt, int(state["step"]), c.cfg.trainer.total_steps, writer.path)
    return int(state["step"])


def train_colocated(c: Components) -> Path:
    """The single-process colocated loop (several devices go through `trainer/distributed/colocated_ray.py`)."""
    cfg = c.cfg
    out_dir = Path(cfg.trainer.out_dir)
    writer = MetricsWriter(out_dir / "metrics.jsonl")
    start = _resume(c, writer)
    n = cfg.rollout.n
    progress = Progress(total=cfg.trainer.total_steps, initial=start, enabled=cfg.trainer.progress)
    witness = StepWitness(cfg, c.tokenizer, c.eos_ids, c.train_data, c.val_data)  # trainer/components/invariants.py

    if start == 0 and cfg.trainer.test_freq > 0:
        t0 = time.perf_counter()
        val = validate(c, step=0)
        if val:
            writer.write(0, {**val, "timing_s/testing": time.perf_counter() - t0})
            progress.update_val(val)

    for step in range(start + 1, cfg.trainer.total_steps + 1):
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer("step"):
            # 1. rollout + reward (DAPO dynamic sampling regenerates inside)
            witness.begin_step()
            with timer("gen"):
                batch, gen_stats = generate_scored_batch(c, witness.draw(c.train_data.next_batch))
            fault_point("rollout", step)
            metrics.update(gen_stats)
            metrics.update(witness.metrics(batch))
            batch.token_rewards = scores_to_token_rewards(batch.scores, batch.response_mask)

            # 2. old log-probs: the trainer's recomputation (default), the rollout's, or -- when the
            #    update is exactly on-policy -- the update forward itself (no extra pass)
            reuse_forward = False
            with timer("old_log_prob"):
                if cfg.rollout.log_prob_source == "rollout":
                    batch.old_logprobs = batch.rollout_logprobs.clone()
                elif c.actor.is_on_policy(batch, n) and cfg.actor.tis_cap is None:
                    reuse_forward = True
                else:
                    batch.old_logprobs = c.actor.compute_logprobs(batch)

            # 3. reference log-probs for the KL loss
            if c.ref is not None:
                with timer("ref"):
                    batch.ref_logprobs = c.actor.compute_logprobs(batch, model=c.ref)

            # 4. values (PPO) and advantages
            if c.critic is not None:
                with timer("values"):
                    batch.values = c.critic.compute_values(batch)
            with timer("adv"):
                batch.advantages, batch.returns = compute_advantages(
                    cfg.algorithm.adv_estimator, batch.response_mask, scores=batch.scores,
                    group_index=batch.group_index, token_rewards=batch.token_rewards, values=batch.values,
                    norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo, gamma=cfg.algorithm.gamma,
                    lam=cfg.algorithm.lam)

            # 5. updates
            if c.critic is not None:
                with timer("update_critic"):
                    metrics.update(c.critic.update(batch, n))
            with timer("update_actor"):
                metrics.update(c.actor.update(batch, n, reuse_forward_as_old=reuse_forward))
            fault_point("update", step)
            metrics.update(rollout_mismatch_metrics(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask))

            # 6. weight sync: the engine samples the next step with the new weights
            with timer("update_weights"):
                c.engine.update_weights(c.actor.named_weights())
            metrics.update(weight_sync_metrics(c.engine, c.actor.named_weights()))

            # 7. validation and checkpoint
            if cfg.trainer.test_freq > 0 and (step % cfg.trainer.test_freq == 0 or step == cfg.trainer.total_steps):
                with timer("testing"):
                    val = validate(c, step=step)
                metrics.update(val)
                progress.update_val(val)
            pending = None  # committed after the step's metrics line (trainer/components/checkpoint.py)
            if cfg.trainer.save_freq > 0 and (step % cfg.trainer.save_freq == 0 or step == cfg.trainer.total_steps):
                with timer("save_checkpoint"):
                    pending = prepare_checkpoint(out_dir, step, _state(c), keep=cfg.trainer.max_checkpoints)

        metrics.update(data_metrics(batch, max_response_length=cfg.data.max_response_length))
        metrics.update(timer.metrics())
        num_tokens = float(batch.attention_mask.sum())
        step_s = timer.times["step"]
        metrics.update({
            "training/global_step": step, "training/epoch": c.train_data.epoch,
            "perf/total_num_tokens": num_tokens, "perf/time_per_step": step_s,
            "perf/throughput": num_tokens / (step_s * _num_devices(cfg)),
        })
        finish_step(writer, step, metrics, pending)
        progress.step(metrics)
    progress.close()
    return writer.path


def _num_devices(cfg) -> int:
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
