"""The Megatron training backend: megatron-core's GPTModel built from the HF config through mbridge.

Where this backend runs is checked at start (`check_megatron_supported`): a run that asks for it
in a loop it does not run in stops with one line naming the field and the fix.
"""

from __future__ import annotations

from trainer.config import TrainerConfig
from trainer.errors import ConfigError


def check_megatron_supported(cfg: TrainerConfig) -> None:
    """Raise ConfigError for `actor.strategy=megatron` settings this backend does not run."""
    raise ConfigError("actor.strategy=megatron: the Megatron backend does not drive the training loops yet "
                      "(fix: set actor.strategy=fsdp2)")
