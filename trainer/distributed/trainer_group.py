"""Driver-side handle on N `TrainerWorker` actors: place them, shard batches, gather metrics.

    group = TrainerGroup(cfg, num_workers=2, use_gpu=True, with_engine=True)   # colocated: engines too
    group.compute_values(batch)       # PPO: the critic's values, before GAE on the driver
    out = group.train(batch)          # advantages must be set; returns metrics + old log-probs

Also holds what both Ray loops share on the driver: advantages for a scored batch, the per-step
data/perf metrics, and checkpoints (`save_group_checkpoint` / `load_group_checkpoint`: the driver's
`state.pt` with every worker's random state, and trainer rank 0's `actor.pt` and, with the critic,
`critic.pt`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.algorithms.advantages import compute_advantages, scores_to_token_rewards
from trainer.components.batch import Batch
from trainer.components.checkpoint import (
    PendingCheckpoint,
    announce_resume,
    load_checkpoint,
    prepare_checkpoint,
    resume_or_start,
)
from trainer.components.metrics import MetricsWriter
from trainer.config import TrainerConfig
from trainer.distributed.cluster import get, place_workers
from trainer.distributed.sharding import check_divisible, shard_batch, unshard_rows
from trainer.errors import ConfigError


def add_advantages(batch: Batch, cfg: TrainerConfig) -> Batch:
    """Token rewards and GRPO/RLOO advantages for a scored batch (group-level, so on the driver); GAE
    uses the whole batch's `values` (set by `TrainerGroup.compute_values`)."""
    batch.token_rewards = scores_to_token_rewards(batch.scores, batch.response_mask)
    batch.advantages, batch.returns = compute_advantages(
        cfg.algorithm.adv_estimator, batch.response_mask, scores=batch.scores, group_index=batch.group_index,
        token_rewards=batch.token_rewards, values=batch.values, norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
        gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam)
    return batch


class TrainerGroup:
    def __init__(self, cfg: TrainerConfig, *, num_workers: int, use_gpu: bool, with_engine: bool,
                 name: str = "trainer"):
        import ray

        from trainer.distributed.trainer_worker import TrainerWorker

        self.cfg, self.world = cfg, num_workers
        self.place = place_workers(num_workers, use_gpu, per_node=cfg.trainer.n_gpus_per_node, name=f"{name}-pg")
        cls = ray.remote(TrainerWorker)
        self.workers = [cls.options(**self.place.options(r), name=f"{name}-{r}").remote(
            cfg.to_dict(), r, num_workers, with_engine=with_engine) for r in range(num_workers)]
        addr, port = get(self.workers[0].address.remote(), what="trainer worker 0", context="at start")
        self.facts = get([w.setup.remote(addr, port) for w in self.workers], what="a trainer worker",
                         context="while loading the model")
        # data-parallel layout: worker r trains on piece dp_rank[r] of each mini-batch (FSDP2: piece r of N;
        # Megatron: the ranks of one tensor-parallel group share a piece, trainer/distributed/worker_actor.py)
        self.dp = int(self.facts[0]["dp_size"])
        self.dp_rank = [int(f["dp_rank"]) for f in self.facts]

    def check_batch(self, num_prompts: int) -> None:
        check_divisible(num_prompts, self.cfg.rollout.n, self.cfg.actor.ppo_mini_batch_size, self.dp)

    def _pieces(self, batch: Batch) -> list[Batch]:
        """Each worker's rows of `batch` (its data-parallel piece of every mini-batch)."""
        mini_rows = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.n
        pieces = shard_batch(batch, world_size=self.dp, mini_batch_rows=mini_rows)
        return [pieces[d] for d in self.dp_rank]

    def _unshard(self, per_worker: list[torch.Tensor]) -> torch.Tensor:
        """Per-worker row tensors back in global order (one worker of each data-parallel rank)."""
        mini_rows = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.n
        firsts = [per_worker[self.dp_rank.index(d)] for d in range(self.dp)]
        return unshard_rows(firsts, world_size=self.dp, mini_batch_rows=mini_rows)

    def compute_values(self, batch: Batch, *, context: str = "") -> dict[str, float]:
        """The critic's values of the whole batch (`batch.values`, [N, R]), each worker on its shard;
        returns `timing_s/values` (the slowest worker)."""
        outs = get([w.compute_values.remote(p) for w, p in zip(self.workers, self._pieces(batch))],
                   what="a trainer worker", context=context)
        batch.values = self._unshard([o["values"] for o in outs])
        return {"timing_s/values": max(o["timing_s/values"] for o in outs)}

    def train(self, batch: Batch, *, context: str = "") -> dict[str, Any]:
        """Shard `batch`, run the critic's (PPO) and the policy's update on every worker; rank 0's metrics
        (summed over the ranks inside the updates, so global), global old log-probs."""
        n = self.cfg.rollout.n
        need_old = self.cfg.actor.tis_cap is not None
        outs = get([w.train.remote(p, n, need_old) for w, p in zip(self.workers, self._pieces(batch))],
                   what="a trainer worker", context=context)
        batch.old_logprobs = self._unshard([o["old_logprobs"] for o in outs])
        metrics = dict(outs[0]["metrics"])
        metrics["timing_s/old_log_prob"] = max(o["timing_s/old_log_prob"] for o in outs)
        metrics["timing_s/update_actor"] = max(o["timing_s/update_actor"] for o in outs)
        for key in ("timing_s/ref", "timing_s/update_critic"):
            if key in outs[0]:
                metrics[key] = max(o[key] for o in outs)
        return metrics

    def call_all(self, method: str, *args: Any, context: str = "") -> list[Any]:
        """The same call on every worker (collectives inside must be entered by all ranks)."""
        return get([getattr(w, method).remote(*args) for w in self.workers], what="a trainer worker", context=context)

    def call_all_args(self, method: str, args: list[tuple], *, context: str = "") -> list[Any]:
        """Worker r runs `method(*args[r])`."""
        return get([getattr(w, method).remote(*a) for w, a in zip(self.workers, args)], what="a trainer worker",
                   context=context)

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        except Exception:  # noqa: BLE001 -- best effort on the way out; the actors are killed next
            pass
        for w in self.workers:
            ray.kill(w)
        self.place.remove()


def step_metrics(batch: Batch, cfg: TrainerConfig, *, step: int, step_s: float, num_devices: int) -> dict[str, float]:
    """Data statistics, accuracy and throughput of one step (verl names)."""
    from trainer.components.metrics import data_metrics

    out = dict(data_metrics(batch, max_response_length=cfg.data.max_response_length))
    if "acc" in batch.meta:
        out["critic/acc/mean"] = float(torch.tensor(batch.meta["acc"]).mean())
    num_tokens = float(batch.attention_mask.sum())
    out.update({"training/global_step": step, "perf/total_num_tokens": num_tokens, "perf/time_per_step": step_s,
                "perf/throughput": num_tokens / (step_s * num_devices)})
    return out


def save_group_checkpoint(group: TrainerGroup, out_dir: Path, step: int, state: dict[str, Any], *, keep: int,
                          context: str) -> PendingCheckpoint:
    """Checkpoint `step`: the driver's `state` plus every worker's (`TrainerWorker.save_state`), written but
    not committed (`trainer.components.checkpoint.finish_step` commits it after the step's metrics line)."""

    def write_files(folder: Path) -> dict[str, Any]:
        return {"world_size": group.world,
                "workers": group.call_all("save_state", str(folder), context=f"{context} while saving")}

    return prepare_checkpoint(out_dir, step, state, keep=keep, write_files=write_files)


def load_group_checkpoint(group: TrainerGroup, cfg: TrainerConfig, writer: MetricsWriter, *, version_of: Any = None
                          ) -> dict[str, Any] | None:
    """Restore the newest checkpoint in out_dir on every worker (when resuming); the driver's state, or
    None for a fresh run. `version_of(state)` is the engines' policy version (default: the step)."""
    ckpt = resume_or_start(cfg.trainer.out_dir, writer.path, resume=cfg.trainer.resume)
    if ckpt is None:
        return None
    state = load_checkpoint(ckpt)
    if state.get("world_size") != group.world:
        raise ConfigError(f"{ckpt}: written by {state.get('world_size')} trainer workers, this run has {group.world} "
                          f"(fix: resume with the same trainer GPU count, or set trainer.resume=false)")
    version = int(state["step"]) if version_of is None else int(version_of(state))
    group.call_all_args("load_state", [(str(ckpt), ws, version) for ws in state["workers"]],
                        context=f"while loading {ckpt}")
    announce_resume(ckpt, int(state["step"]), cfg.trainer.total_steps, writer.path)
    return state
