"""`rlbench selftest`: plant known trainer bugs in a scratch copy and table the checks that catch them.

- `mutations.py` the named one-line bugs (exact-match patches of files inside the trainer package)
- `run.py`       run each mutation and the clean seeds, build the table

May import: `rlbench.run` and every rlbench layer below it, `trainer.errors`, `trainer.platform.env`.
"""
