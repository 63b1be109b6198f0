"""Training backends: the policy and value models as trainable actors.

- `actor.py`        `Actor`: policy forward/backward, PPO update, weights out (FSDP2 or one process)
- `critic.py`       PPO's value model on the same machinery
- `fsdp.py`         FSDP2 wrapping and sharded log-probs
- `compile.py`, `mixed_precision.py`  torch.compile and bf16 settings
- `strategy.py`     `actor.strategy` checked before anything is loaded
- `build.py`        `actor.strategy` -> the policy and critic classes, built in the order each backend needs
- `megatron/`       the Megatron backend

May import: `trainer.errors`, `trainer.config`, `trainer.platform.env`, `trainer.algorithms`, `trainer.components`,
`trainer.ops`, `trainer.models` (not the warm starts). Not the rollout engines, the step, the workers or the loops.
"""
