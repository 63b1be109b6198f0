"""Result of evaluating one check: the shared currency of checks, reports, the CLI and pytest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["pass", "fail", "skip", "error", "not_evaluated"]
# Most severe first. `not_evaluated`: the reference applies here but the log lacks what it reads
# (the metric, the steps of its window, the start or the end of the run); never a pass.
VERDICT_ORDER: tuple[str, ...] = ("fail", "not_evaluated", "error", "pass", "skip")
# Verdicts that make a check command exit non-zero.
BAD_VERDICTS: tuple[str, ...] = ("fail", "error", "not_evaluated")


@dataclass
class CheckResult:
    """One check against one run (or a pair of runs for ratio checks).

    `message` is a single line a user can act on: metric, statistic, expected (with source),
    actual, and the steps involved.
    """

    check_id: str  # stable id used for pytest item names, e.g. "val-core/openai/gsm8k/acc/mean@1:peak>=0.93"
    verdict: Verdict
    metric: str
    statistic: str  # e.g. "peak", "final", "mean_last[20]", "median[0:64]", "ratio(colocated/fully_async)"
    expected: str  # human-readable expectation, e.g. ">= 0.93 (tol 0.03)"
    actual: float | None
    source: str  # where the expectation comes from (article + section, or golden file)
    why: str  # why this tolerance
    steps: list[int] = field(default_factory=list)  # the steps the statistic was computed over
    message: str = ""
    scope: str = "numerics"  # "numerics" (per arch) or "device" (per board) or "golden"
    run: str = ""  # which run the check read: a mode ("colocated", "fully_async") or "" for the only run
    ref_value: float | None = None  # the reference value, for drawing on the metric's chart
    ref_band: tuple[float, float] | None = None  # accepted [low, high] interval, for drawing a band
    # What part of the run the log covered when it is not the whole run, e.g. "log has steps
    # 80-200 of the profile's 0-200 (starts late)"; "" when the log covers the run.
    coverage: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
