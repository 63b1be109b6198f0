"""Multi-worker execution on Ray: actors and placement, data-parallel sharding, weight sync.

- `cluster.py`        start/join a Ray cluster, placement groups, dead-worker errors
- `sharding.py`       split a global batch over N data-parallel trainer workers
- `trainer_worker.py` `TrainerWorker` actor: FSDP2 policy rank, optional colocated engine
- `trainer_group.py`  driver-side handle on N trainer workers; advantages, step metrics, checkpoints
- `actor_state.py`    the policy's full training state saved from / loaded into N FSDP2 workers
- `critic_state.py`   PPO's value model on N workers: build, values, update, full training state
- `rollout_worker.py` `RolloutWorker` actor: streaming, staleness-bounded generation (fully-async)
- `colocated_ray.py`  the colocated loop over Ray workers (several devices, or trainer.use_ray)

The fully-async loop itself is `trainer/modes/fully_async.py`.

May import: every layer below the workers, the step (`trainer/modes/steps.py`) included; not the
loops in `trainer/modes/` (they import the workers).
"""
