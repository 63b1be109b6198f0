"""What part of a run a log covers, and which statistics that part can support.

    from rlbench.checks.coverage import Coverage
    cov = Coverage.of(frame, steps=200)        # frame: step-indexed metrics of one run
    cov.note()                                 # "log has steps 80-200 of the profile's 0/1-200 (starts late)"
    cov.missing_for("mean_first", None)        # "mean_first needs the run's start; the log starts at step 80, ..."

A run is expected to span step 0 or 1 (validation before training, or the first training step)
to the profile's `steps`. `first`/`mean_first` read the start, `final`/`mean_last` the end, every
other statistic (and `steps_to_reach`'s count) its whole window; a windowed statistic needs the
window's steps, all of them: a window that reaches past the log's last step (`[190, 250]` on a
200-step log, even when the profile has 200 steps) is not evaluated on the part that exists.
`conclusive_on_partial` says which verdicts more steps could not change (a peak >= bound already
reached; a band already left; a non-finite value already seen): those stand on a partial log,
every other verdict there becomes `not_evaluated` (rlbench/checks/metric.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from rlbench.checks.results import CheckResult
from rlbench.suites.suite import Reference

_START_STATS = ("first", "mean_first")
_END_STATS = ("final", "mean_last")


@dataclass(frozen=True)
class Coverage:
    """Which steps a log holds against the steps the run was expected to have (0 or 1 to `steps`)."""

    first: int
    last: int
    steps: int | None  # the profile's steps; None: the end is not known

    @classmethod
    def of(cls, frame: pd.DataFrame, steps: int | None) -> Coverage | None:
        if len(frame.index) == 0:
            return None
        return cls(int(frame.index.min()), int(frame.index.max()), steps)

    def has_start(self, lo: int = 0) -> bool:
        return self.first <= max(lo, 1)

    def has_end(self, hi: int | None = None) -> bool:
        end = self.steps if hi is None else hi  # a window reads every step to its end, even past `steps`
        return end is None or self.last >= end

    def note(self) -> str:
        """'' when the log spans the run, else e.g. "log has steps 80-200 of the profile's 0-200 (starts late)"."""
        late, early = not self.has_start(), not self.has_end()
        if not (late or early):
            return ""
        what = " and ".join(w for w, on in (("starts late", late), ("ends early", early)) if on)
        run = f"0/1-{self.steps}" if self.steps is not None else "run from step 0/1"
        return f"log has steps {self.first}-{self.last} of the profile's {run} ({what})"

    def missing_for(self, stat: str | None, window: tuple[int, int] | None) -> str:
        """'' when the log has the steps `stat` over `window` reads, else what it lacks."""
        lo, hi = window if window is not None else (0, None)
        needs_start = stat not in _END_STATS
        needs_end = stat not in _START_STATS
        lacks = []
        if needs_start and not self.has_start(lo):
            lacks.append(f"starts at step {self.first}, after step {max(lo, 1)}")
        if needs_end and not self.has_end(hi):
            end = self.steps if hi is None else hi
            lacks.append(f"ends at step {self.last}, before step {end}")
        if not lacks:
            return ""
        span = f"steps {lo}-{hi}" if window is not None else "the run's " + (
            "start" if not needs_end else "end" if not needs_start else "steps")
        past = (f"; the window ends past the profile's {self.steps} steps: fix the window"
                if hi is not None and self.steps is not None and hi > self.steps else "")
        return f"{stat or 'every step'} needs {span}; the log {' and '.join(lacks)}{past}"


def conclusive_on_partial(stat: str | None, op: str, passed: bool) -> bool:
    """Whether a verdict on part of the run holds for the whole run (more steps cannot change it)."""
    if op == "band" or stat == "no_nan":
        return not passed  # a step already outside the band / a non-finite value already seen
    if stat in ("peak", "max"):
        return passed if op == ">=" else (not passed if op == "<=" else False)
    if stat == "min":
        return passed if op == "<=" else (not passed if op == ">=" else False)
    return False


def needs_note(cov: Coverage | None, ref: Reference, stat: str | None) -> str:
    """What the log lacks for `stat` of `ref` (its window), '' when nothing."""
    if cov is None:
        return ""
    if stat == "steps_to_reach":  # needs the start to count steps; the end only when never reached
        return cov.missing_for("first", ref.window)
    return cov.missing_for(stat, ref.window)


def with_coverage(results: list[CheckResult], covs: dict[str, Coverage | None]) -> list[CheckResult]:
    """Each result with its run's coverage note; golden verdicts the log cannot support made not_evaluated."""
    out = []
    for r in results:
        cov = covs.get(r.run) if r.run in covs else (next(iter(covs.values())) if len(covs) == 1 else None)
        if cov is None:
            out.append(r)
            continue
        note = cov.note()
        if r.scope == "golden" and r.verdict in ("pass", "fail"):
            stat = r.statistic.split("[")[0].split("(")[0]
            lacks = cov.missing_for(stat if stat != "every step" else None, None)
            if lacks and not conclusive_on_partial(stat, "approx", r.verdict == "pass"):
                r = not_evaluated_result(r, lacks)
        out.append(dataclasses.replace(r, coverage=note) if note else r)
    return out


def not_evaluated_result(r: CheckResult, reason: str) -> CheckResult:
    """`r` made `not_evaluated`: the log lacks the steps its statistic reads."""
    return dataclasses.replace(r, verdict="not_evaluated", actual=None,
                               message=f"{r.check_id}: NOT EVALUATED ({reason})")
