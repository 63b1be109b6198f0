"""The training loops and the step they share.

- `steps.py`       the step's pieces shared by every loop and the Ray workers: load a split, build the
                   policy/rollout, collect a scored batch, turn metrics
- `colocated.py`   the single-process colocated loop (the default)
- `fully_async.py` the fully-async loop: rollout workers and trainer workers on their own devices

`steps.py` may import every layer below the workers (backends, rollout, models and warm starts, data,
components). The loops may also import `trainer.distributed`; `trainer.distributed` imports `steps.py` only.
"""
