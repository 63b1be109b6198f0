"""Rehearsals: any suite's full or mini profile, end to end on CPU at tiny scale, its verdict on mechanics.

`transform.py` makes the config (every change recorded), `run.py` runs and records it, `mechanics.py`
judges it, `double/` is the SGLang stand-in, `faults.py` the planted faults (see each module).
"""
