"""GPU benchmarks of the trainer: `python -m trainer.bench --help`.

May import: every trainer layer below the entry points (`trainer.api`, `trainer.__main__`).
"""
