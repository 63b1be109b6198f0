"""Ray cluster, placement groups, and turning a dead worker into a clear one-line error.

    init_ray(cfg)                                             # a local cluster, or the one in RAY_ADDRESS
    place = place_workers(num_workers, use_gpu, per_node=8)   # <= 8 workers per node, node by node
    handle = actor_cls.options(**place.options(i)).remote(...)
    result = get(ref, what="rollout worker")                  # raises WorkerDiedError if the actor died
    place.remove()

On a CPU machine the "devices" are CPU workers: one bundle of one CPU each, so CI exercises the
same actors, groups and messages as a GPU run. `RAY_ADDRESS` (Ray's own variable) joins an
existing cluster for multi-node runs. A local cluster is guarded (`ray_guard.py`): none of its
processes outlive the driver, even after kill -9, and a run clears what a killed earlier one left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import TrainerConfig
from trainer.errors import RLBenchError

# Variables every Ray worker must see: thread counts, and NVLink multicast kept off.
_PASS_ENV = ("OMP_NUM_THREADS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
             "RLBENCH_CACHE", "PYTHONPATH", "HIP_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM")


class WorkerDiedError(RLBenchError):
    """A Ray worker (rollout or trainer) died; the run stops and keeps the metrics written so far."""


def write_failure(out_dir: Path, error: Exception, step: int) -> None:
    """Record why a run ended early (`failure.json` beside metrics.jsonl): the error and the steps that completed."""
    import json

    (out_dir / "failure.json").write_text(json.dumps({"error": str(error), "failed_step": step,
                                                      "completed_steps": max(step - 1, 0)}, indent=2))


def uses_gpu(cfg: TrainerConfig) -> bool:
    if cfg.trainer.device == "cpu":
        return False
    import torch

    return torch.cuda.is_available() if cfg.trainer.device == "auto" else True


def init_ray(cfg: TrainerConfig, num_cpus: int | None = None) -> None:
    """Start a local Ray cluster (or join RAY_ADDRESS) once per process."""
    import ray

    from trainer.distributed.ray_guard import clear_leftovers, guard_local_cluster

    clear_leftovers(cfg.trainer.out_dir)  # processes of a killed earlier run in this out_dir
    if ray.is_initialized():
        guard_local_cluster(cfg.trainer.out_dir, started_here=False)
        return
    env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", str(cfg.trainer.num_threads or 1))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, runtime_env={"env_vars": env},
                                  ignore_reinit_error=True)
    if "RAY_ADDRESS" not in os.environ:
        # a cluster of this process's own, even where another one runs on the machine (a plain ray.init() would join
        # whatever /tmp/ray/ray_current_cluster names: a concurrent run's cluster, or a dead one)
        kwargs.update(address="local", num_cpus=num_cpus or max(os.cpu_count() or 2, 2))
    ray.init(**kwargs)
    if "RAY_ADDRESS" not in os.environ:  # our own cluster: nothing of it may outlive this process
        guard_local_cluster(cfg.trainer.out_dir, started_here=True)


@dataclass
class Placement:
    """Where each worker of a role runs: worker i takes bundle i % per_node of group i // per_node, each group a
    STRICT_PACK placement group (one node) of up to `per_node` bundles. A role of more workers than a node holds
    (32 trainer ranks on 8-GPU nodes) spans nodes in whole node-sized groups, ranks in node order, as verl
    places its resource pools; a single STRICT_PACK group of every worker could never be placed there."""

    groups: list[Any]
    per_node: int
    use_gpu: bool

    def options(self, index: int, **extra: Any) -> dict[str, Any]:
        """`actor_cls.options(...)` keywords that put worker `index` on its bundle (1 GPU + 1 CPU, or 1 CPU)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group, bundle = divmod(index, self.per_node)
        return dict(num_cpus=1, num_gpus=1 if self.use_gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.groups[group],
                                                                         placement_group_bundle_index=bundle),
                    **extra)

    def remove(self) -> None:
        import ray

        for group in self.groups:
            ray.util.remove_placement_group(group)


def place_workers(num_workers: int, use_gpu: bool, *, per_node: int, name: str = "", wait_s: float = 120) -> Placement:
    """Reserve one bundle per worker, at most `per_node` on a node (class docstring); waits up to `wait_s`."""
    import ray
    from ray.util.placement_group import placement_group

    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    sizes = [min(per_node, num_workers - start) for start in range(0, num_workers, per_node)]
    groups = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK", name=f"{name}-{g}")
              for g, n in enumerate(sizes)]
    place = Placement(groups, per_node, use_gpu)
    try:
        ray.get([g.ready() for g in groups], timeout=wait_s)
    except ray.exceptions.GetTimeoutError:
        place.remove()
        kind = "GPU" if use_gpu else "CPU"
        nodes = [int(n["Resources"].get(kind, 0)) for n in ray.nodes() if n.get("Alive")]
        raise RLBenchError(f"Ray cannot place {num_workers} workers as {len(sizes)} group(s) of {max(sizes)} {kind} "
                           f"bundle(s), each group on one node; the cluster's live nodes have {nodes} {kind}s "
                           f"(fix: trainer.n_gpus_per_node = the devices one node gives this role, or fewer "
                           f"async.rollout_gpus/async.train_gpus)") from None
    return place


def get(refs: Any, *, what: str, context: str = "") -> Any:
    """`ray.get(refs)`, with a dead actor turned into `WorkerDiedError` naming `what` and `context`."""
    import ray

    from trainer.rollout.vllm_engine import EngineDiedError

    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:  # the method raised: a user error keeps its own message
        cause = getattr(e, "cause", None)
        if isinstance(cause, EngineDiedError):  # the worker lives, its engine died: say which worker, when
            raise WorkerDiedError(f"{what}'s engine died{(' ' + context) if context else ''}: {cause}") from None
        if isinstance(cause, RLBenchError):
            raise type(cause)(str(cause)) from None
        first = str(cause or e).strip().splitlines()[-1] if str(cause or e).strip() else type(e).__name__
        raise WorkerDiedError(f"{what} failed{(' ' + context) if context else ''}: {first[:300]} "
                              f"(fix: see the worker traceback above)") from e
    except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.WorkerCrashedError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkerDiedError(f"{what} died{(' ' + context) if context else ''}: {first[:200]} "
                              f"(fix: check the worker's log above for the cause, e.g. out of memory)") from None


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()
