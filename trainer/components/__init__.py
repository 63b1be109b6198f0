"""The pieces the training loops are made of, one concept each.

- `batch.py`       `Batch`: a scored rollout's tensors, built from a `Rollout`
- `metrics.py`     `MetricsWriter`: metrics.jsonl, one line per step, crash-consistent
- `checkpoint.py`  checkpoints of the driver's state and their atomic commit (`finish_step`)
- `val_samples.py` the validation samples written beside the metrics
- `progress.py`    the console progress bar
- `faults.py`      `fault_point`: named places a test can kill a run at

May import: `trainer.errors`, `trainer.config`, `trainer.data`, `trainer.rollout.base`. Never a
backend, a model family, an engine or a loop.
"""
