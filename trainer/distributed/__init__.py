"""Multi-worker execution: Ray actors and placement, data-parallel sharding, weight sync.

- `cluster.py`   start/join a Ray cluster, placement groups, worker-death errors
- `sharding.py`  split a global batch over N data-parallel trainer workers
- `weight_sync.py` bucketed broadcast of the trainer's weights to rollout workers
- `workers.py`   the Ray actors: `TrainerWorker` (FSDP2 policy, optional colocated engine)
                 and `RolloutWorker` (engine, streaming generation for the fully-async mode)
"""
