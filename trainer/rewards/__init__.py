"""Rule-based rewards selected by a row's data_source; see `trainer.rewards.registry` for the table.

    from trainer.rewards import compute_score
    compute_score("openai/gsm8k", "... #### 72", "72")   # RewardResult(score=1.0, acc=1.0, pred='72')

May import: `trainer.errors` only.
"""

from __future__ import annotations

from trainer.rewards.registry import compute_score, get_scorer, known_data_sources, register
from trainer.rewards.result import RewardResult

__all__ = ["RewardResult", "compute_score", "get_scorer", "known_data_sources", "register"]
