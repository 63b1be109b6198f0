"""The machine a run is on, and start-time checks of a config against it.

- `env.py`       devices, thread counts, versions and environment of this machine (imports `trainer.errors` only;
                 every layer may import it)
- `preflight.py` checks before any model load: paths, devices, the model's limits (imports `trainer.config`
                 and `trainer.models`; only `trainer.api` imports it)
"""
