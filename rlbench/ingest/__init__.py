"""Logs in: metrics from verl / miles / rlbench logs (jsonl or console text) as one step-indexed frame.

- `load.py`         `load_metrics`: detect the format, parse, normalise names
- `console_logs.py` console-text formats
- `log_lines.py`    line-level parsing shared by the formats
- `vocab.py`        metric names across frameworks (verl, miles, rlbench)

May import: `trainer.errors`, `rlbench.suites`.
"""
