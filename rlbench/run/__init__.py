"""Running suites: train a profile's runs, check them, report; the pytest plugin over the same steps.

- `runner.py`        `run_profile`, `train_profile`, `check_profile`, machine info
- `pytest_plugin.py` suite files as pytest items (`pytest suites/`; suites/conftest.py imports its hooks)
- `progress.py`      progress lines while a run trains
- `inputs.py`        the CLI's inputs checked before a run (arch, profile, logs)

May import: every rlbench layer below (suites, ingest, checks, report) and `trainer.api` (the trainer's
public entry), `trainer.config`, `trainer.errors`, `trainer.platform.env`, `trainer.components.val_samples`.
"""
