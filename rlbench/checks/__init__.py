"""Checks: a run's metrics against a suite's references, golden values and statistics.

- `results.py`   `CheckResult`, the one record every check returns
- `coverage.py`  what part of a run a log covers, and which statistics that part can support
- `evaluate.py`  the checks of a profile (`check_metric`, `compute_stat`, ...)
- `golden.py`    golden-value checks and their recording
- `inputs.py`    the CLI's inputs checked before a run (arch, profile, logs)

May import: `trainer.config`, `trainer.errors`, `trainer.platform.env`, `rlbench.suites`, `rlbench.ingest`.
"""
