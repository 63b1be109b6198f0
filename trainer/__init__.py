"""trainer: a complete RL post-training trainer (GRPO, DAPO, PPO) usable on its own.

    python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml trainer.total_steps=30
"""

__version__ = "0.1.0"
