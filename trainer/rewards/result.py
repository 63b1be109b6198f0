"""The value every reward function returns: the training reward, the 0/1 accuracy, the parsed answer.

`score` is what the advantage estimator sees (GRPO groups it per prompt). `acc` is 1.0 when the
extracted answer is judged correct and 0.0 otherwise; validation averages it into
`val-core/<data_source>/acc/mean@N`. They differ wherever a task shapes the reward: DAPO pays
-1 for a wrong answer (acc 0), geo3k pays 0.1 for a well-formed but wrong answer (acc 0).
`pred` is the answer string the scorer extracted (None when it found none), kept for logs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardResult:
    """One scored response. `acc` is always 0.0 or 1.0."""

    score: float
    acc: float
    pred: str | None = None

    def __post_init__(self) -> None:
        assert self.acc in (0.0, 1.0), f"acc must be 0 or 1, got {self.acc}"
