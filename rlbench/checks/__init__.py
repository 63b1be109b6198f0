"""Checks: a run's metrics against a suite's references, golden values and statistics.

- `results.py`   `CheckResult`, the one record every check returns
- `coverage.py`  what part of a run a log covers, and which statistics that part can support
- `metric.py`    one check of one metric series: statistics, comparisons, result records
- `evaluate.py`  the checks of a profile: scopes, each reference through `metric.py`, golden ones through `golden.py`
- `golden.py`    golden-value checks and their recording

May import: `trainer.config`, `trainer.errors`, `rlbench.suites`, `rlbench.ingest`.
"""
