"""trainer: a complete RL post-training trainer (GRPO, DAPO, PPO) usable on its own.

    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml trainer.total_steps=30

The root holds the public entry (`api.py`, `__main__.py`), the typed config (`config.py`) and the
errors (`errors.py`); everything else is a package, one layer each. The layers, lowest first (a
module imports its own layer and those below; tests/unit/test_import_layers.py checks it):
errors, platform.env, algorithms + rewards, config, rollout.base, agent, data, components, models
(families), ops, backends, rollout (engines), models (warm starts), models.loading, modes.steps,
distributed, modes (loops), platform.preflight, bench, api.
"""

__version__ = "0.1.0"
