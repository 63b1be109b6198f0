"""`TrainerWorker`: one data-parallel rank of the policy, as a Ray actor (one GPU or one CPU each).

N workers form the trainer's default process group (gloo on CPU, NCCL/RCCL on GPU) and shard the
policy with FSDP2 when N > 1 (`trainer/backends/fsdp.py`), or, with `actor.strategy: megatron`,
build a `MegatronActor` over megatron-core's TP / EP / DP groups of that process group
(`trainer/distributed/worker_actor.py`). The driver sends each worker the piece of the global batch
of its data-parallel rank (`trainer/distributed/sharding.py`); every worker runs the same
`Actor.update` as the single-process loop, with counts all-reduced, so the update does not depend on N.

In the colocated mode each worker also holds a rollout engine (a full, unsharded copy of the
weights in the rollout dtype): it samples its share of the prompts, and after the update gets the
new weights in-process (`update_local_engine`, an FSDP all-gather on every rank). On GPU the engine
is put to sleep while the update runs (`engine.sleep()` / `wake_up()`). The engine is `hf`, `static`,
`vllm` (its engine processes are children of the worker, so vLLM's own torch.distributed world
stays apart from the trainer's data-parallel group) or `sglang` (`RAY_ENGINES`); the static
engine's fused Q/K/V and gate/up matrices are the storage of the module's projection weights, so
the in-place copy refreshes them too.

With `critic.enable` (colocated mode) each worker also holds a shard of PPO's value model
(`compute_values`, then the critic's update before the policy's in `train`;
`trainer/distributed/critic_state.py`).

Checkpoints (`save_state` / `load_state`): every rank takes part in gathering the policy's (and the
critic's) full state, rank 0 writes it (`trainer/distributed/actor_state.py`); each rank returns its
own random states (torch, and the colocated engine's sampling generator) for the driver's `state.pt`.

In the fully-async mode rank 0 also joins a weight-sync group with the rollout workers and
broadcasts the weights in buckets (`send_weights`; `trainer/rollout/weight_sync.py`).
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import torch

from trainer.components.batch import Batch
from trainer.config import TrainerConfig
from trainer.distributed.critic_state import (
    CRITIC_FILE,
    critic_update,
    critic_values,
    load_critic_state,
    save_critic_state,
)
from trainer.distributed.worker_actor import build_worker_models
from trainer.errors import ConfigError

# Engines a Ray worker can hold. All of them interrupt and continue a generation (fully-async
# `async.partial_rollout`): hf and static in their host decode loop, vllm and sglang through the
# engine's own abort and a resubmission of prompt + partial response.
RAY_ENGINES = ("hf", "static", "vllm", "sglang")


def check_supported(cfg: TrainerConfig) -> None:
    """Features the multi-worker path does not run fail up front, in one line naming the field."""
    if cfg.critic.enable and cfg.trainer.mode == "fully_async":
        raise ConfigError("critic.enable: the fully-async path trains no value model (fix: use trainer.mode=colocated "
                          "for PPO with a critic)")
    if cfg.rollout.engine not in RAY_ENGINES:
        raise ConfigError(f"rollout.engine={cfg.rollout.engine}: not an engine the Ray path can build "
                          f"(fix: set rollout.engine to one of {', '.join(RAY_ENGINES)})")
    tp = cfg.rollout.tensor_parallel_size
    if tp > 1:  # each Ray worker is placed on one device: a replica spanning several is not built
        more = "async.rollout_gpus" if cfg.trainer.mode == "fully_async" else "trainer.n_gpus_per_node"
        raise ConfigError(f"rollout.tensor_parallel_size={tp}: on the Ray paths each rollout replica holds one "
                          f"device, tensor parallelism inside a replica is not built (fix: set "
                          f"rollout.tensor_parallel_size=1 and add replicas with {more})")


class TrainerWorker:
    def __init__(self, cfg_dict: dict[str, Any], rank: int, world_size: int, *, with_engine: bool):
        self.cfg = cfg = TrainerConfig.model_validate(cfg_dict)
        self.rank, self.world_size = rank, world_size
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.device = torch.device("cuda", 0) if (cfg.trainer.device != "cpu" and torch.cuda.is_available()) \
            else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.with_engine = with_engine
        self.sync_group = None
        self._store = self._sync_store = None  # rank 0's rendezvous stores (`address`, `sync_address`)

    def address(self) -> tuple[str, int]:
        """(node ip, port) of the data-parallel group's rendezvous store, which rank 0 opens here and holds."""
        from trainer.backends.fsdp import rendezvous_store
        from trainer.distributed.cluster import node_ip

        self._store = rendezvous_store(self.world_size)
        return node_ip(), self._store.port

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the data-parallel group, load and shard the model, build the engine. Returns facts."""
        from trainer.backends.fsdp import default_backend, init_data_parallel
        from trainer.models.loading import load_model_and_tokenizer
        from trainer.models.specs import eos_token_ids
        from trainer.rollout.registry import build_engine

        cfg = self.cfg
        t0 = time.perf_counter()
        if self.world_size > 1:
            init_data_parallel(self.rank, self.world_size, master_addr, master_port,
                               backend=default_backend(self.device), store=self._store)
        torch.manual_seed(cfg.trainer.seed)
        model, self.tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.trainer.seed)
        self.eos_ids = eos_token_ids(self.tokenizer, model)
        if cfg.actor.freeze_vision_tower:  # before the engine's copy and the optimizer, as in trainer.modes.steps
            from trainer.models.vlm import freeze_vision_tower

            freeze_vision_tower(model)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.engine = None
        if self.with_engine:
            self.engine = build_engine(cfg, copy.deepcopy(model), self.tokenizer, self.eos_ids, self.device)
            self.engine.generator.manual_seed(cfg.trainer.seed + 1000 * self.rank)  # ranks sample differently
            if cfg.agent.enable:  # multi-turn tool use: each worker's loop, its own sandbox; rank 0 records it
                from trainer.agent.loop import AgentRolloutEngine

                self.engine = AgentRolloutEngine(self.engine, self.tokenizer, cfg.agent,
                                                 out_dir=cfg.trainer.out_dir if self.rank == 0 else None)
        # the frozen reference policy for the KL loss: a copy of the initial weights, laid out like the policy below
        ref = copy.deepcopy(model) if cfg.actor.use_kl_loss else None
        # the policy (FSDP2 over all workers, or megatron-core's TP / EP / DP groups) and PPO's value model
        self.actor, self.critic = build_worker_models(model, cfg, self.world_size, self.device)
        self.ref = self.actor.reference_policy(ref) if ref is not None else None
        dp_rank, dp_size = self.actor.data_parallel()
        return {"rank": self.rank, "device": str(self.device), "load_s": time.perf_counter() - t0,
                "pid": os.getpid(), "dp_rank": dp_rank, "dp_size": dp_size}

    # ------------------------------------------------------------------ colocated rollout
    def generate(self, items: list[dict[str, Any]], validation: bool = False) -> Batch:
        """Sample (and score) this worker's share of the prompts with its colocated engine."""
        from trainer.modes.steps import generate, sampling_params, score

        params = sampling_params(self.cfg, self.eos_ids, validation=validation)
        batch = generate(self.engine, items, params, pad_token_id=self.tokenizer.pad_token_id,
                         max_response_length=self.cfg.data.max_response_length)
        batch.scores, acc = score(batch, self.tokenizer, self.cfg)
        batch.meta["acc"] = acc.tolist()
        return batch

    def engine_facts(self) -> dict[str, Any]:
        """The colocated engine's facts (`trainer.rollout.base.engine_facts`); {} without an engine."""
        from trainer.rollout.base import engine_facts

        return engine_facts(self.engine) if self.engine is not None else {}

    def update_local_engine(self) -> float:
        """In-process weight sync to the colocated engine (collective over the trainer ranks)."""
        t0 = time.perf_counter()
        self.engine.update_weights(self.actor.named_weights())
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ training
    def compute_values(self, piece: Batch) -> dict[str, Any]:
        """The critic's values `[rows, R]` of this worker's piece (the engine sleeps until `train` ends)."""
        if self.engine is not None:
            self.engine.sleep()
        return critic_values(self.critic, piece)

    def train(self, piece: Batch, n: int, need_old: bool) -> dict[str, Any]:
        """Old log-probs (when needed), the critic's update (PPO) and the policy update on this worker's
        piece of the batch.

        Returns the metrics, the old log-probs the update used ([rows, R]) and the timings."""
        out: dict[str, Any] = {}
        if self.engine is not None:
            self.engine.sleep()
        t0 = time.perf_counter()
        reuse = False
        if self.cfg.rollout.log_prob_source == "rollout":
            piece.old_logprobs = piece.rollout_logprobs.clone()
        elif need_old or not self.actor.is_on_policy(piece, n):
            piece.old_logprobs = self.actor.compute_logprobs(piece)
        else:
            reuse = True
        t_ref = time.perf_counter()
        if self.ref is not None:
            piece.ref_logprobs = self.actor.compute_logprobs(piece, model=self.ref)
            out["timing_s/ref"] = time.perf_counter() - t_ref
        critic_metrics: dict[str, float] = {}
        if self.critic is not None:  # the critic's update before the policy's, as in the single-process loop
            c = critic_update(self.critic, piece, n)
            critic_metrics = c["metrics"]
            out["timing_s/update_critic"] = c["timing_s/update_critic"]
        t1 = time.perf_counter()
        metrics = self.actor.update(piece, n, reuse_forward_as_old=reuse)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if self.engine is not None:
            self.engine.wake_up()
        out["metrics"] = {**critic_metrics, **metrics}
        out["old_logprobs"] = piece.old_logprobs
        out["timing_s/old_log_prob"] = t_ref - t0
        out["timing_s/update_actor"] = t2 - t1
        return out

    # ------------------------------------------------------------------ checkpoint
    def save_state(self, folder: str) -> dict[str, Any]:
        """Write the policy's state into `folder` (rank 0); return this rank's random states."""
        from trainer.components.checkpoint import rng_state
        from trainer.distributed.actor_state import ACTOR_FILE, save_actor_state

        save_actor_state(self.actor, Path(folder) / ACTOR_FILE, self.rank)
        if self.critic is not None:
            save_critic_state(self.critic, Path(folder) / CRITIC_FILE, self.rank)
        gen = self.engine.generator.get_state() if self.engine is not None else None
        return {"rng": rng_state(), "engine_generator": gen}

    def load_state(self, folder: str, worker_state: dict[str, Any], version: int) -> None:
        """Restore the policy and this rank's random states; the colocated engine gets the weights."""
        from trainer.components.checkpoint import set_rng_state
        from trainer.distributed.actor_state import ACTOR_FILE, load_actor_state

        load_actor_state(self.actor, Path(folder) / ACTOR_FILE, self.rank)
        if self.critic is not None:
            load_critic_state(self.critic, Path(folder) / CRITIC_FILE, self.rank)
        set_rng_state(worker_state["rng"])
        if self.engine is not None:
            if worker_state.get("engine_generator") is not None:
                self.engine.generator.set_state(worker_state["engine_generator"])
            self.update_local_engine()
            self.engine.version = version

    # ------------------------------------------------------------------ weight sync to rollout workers
    def sync_address(self, world_size: int) -> tuple[str, int]:
        """(node ip, port) of the weight-sync group's store, which rank 0 opens here and holds."""
        from trainer.backends.fsdp import rendezvous_store
        from trainer.distributed.cluster import node_ip

        self._sync_store = rendezvous_store(world_size)
        return node_ip(), self._sync_store.port

    def init_sync_group(self, master_addr: str, master_port: int, world_size: int) -> None:
        from trainer.rollout.weight_sync import SyncGroup

        if self.rank == 0:
            self.sync_group = SyncGroup(0, world_size, master_addr, master_port, device=self.device,
                                        store=self._sync_store)

    def send_weights(self, plan: list, bucket_mb: float) -> dict[str, float]:
        from trainer.rollout.weight_sync import send

        t0 = time.perf_counter()
        sent = send(self.sync_group, plan, self.actor.named_weights(), bucket_mb=bucket_mb)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return {"bytes": float(sent), "seconds": time.perf_counter() - t0}

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
