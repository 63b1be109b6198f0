"""Which profile of a suite a log was run with, from the log's shape; and when a log plainly does not match.

    from rlbench.suites.profile_guess import guess_profile, shape_mismatch
    profile, why = guess_profile(suite, frame)          # ("cpu", "8 steps, 32 sequences per step, ...") or (None, why)
    warning = shape_mismatch(suite, "full", frame)      # None, or one line naming what differs

The shape of a profile: its `steps`, the sequences per step (`data.train_batch_size x rollout.n`,
from the resolved trainer config) and the response-length cap (`data.max_response_length`).
The shape of a log: its last step; sequences per step = `perf/total_num_tokens /
(prompt_length/mean + response_length/mean)` (median over steps; verl and the trainer log all
three; not where `num_turns/mean` exceeds 1: a multi-turn step's token count holds the tool observations,
which neither length counts); the longest response (`response_length/max`). A signal the log lacks is not
used. A profile matches when every available signal agrees: last step equal to `steps`, sequences per
step within 5%, no response longer than the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlbench.suites.suite import Suite


@dataclass(frozen=True)
class Shape:
    steps: int | None  # last step
    seqs: float | None  # sequences (prompt x sample) per step
    max_response: float | None  # the response-length cap (profile) or the longest response (log)
    batch: int | None = None  # train_batch_size (profile only)
    n: int | None = None  # rollout.n (profile only)


def profile_shape(suite: Suite, profile: str) -> Shape:
    prof = suite.profile(profile)
    cfg = suite.resolve_trainer_config(profile, prof.modes[0], expand=False)
    data, rollout = cfg.get("data", {}), cfg.get("rollout", {})
    batch, n = data.get("train_batch_size"), rollout.get("n")
    seqs = float(batch * n) if isinstance(batch, int) and isinstance(n, int) else None
    cap = data.get("max_response_length")
    return Shape(prof.steps, seqs, float(cap) if isinstance(cap, (int, float)) else None, batch, n)


def log_shape(frame: pd.DataFrame) -> Shape:
    steps = int(frame.index.max()) if len(frame.index) else None
    seqs = None
    cols = ("perf/total_num_tokens", "prompt_length/mean", "response_length/mean")
    multi_turn = "num_turns/mean" in frame.columns and bool((frame["num_turns/mean"] > 1).any())
    if all(c in frame.columns for c in cols) and not multi_turn:
        per = frame[cols[0]] / (frame[cols[1]] + frame[cols[2]])
        per = per[np.isfinite(per) & (per > 0)]
        seqs = float(per.median()) if len(per) else None
    longest = None
    if "response_length/max" in frame.columns and frame["response_length/max"].notna().any():
        longest = float(frame["response_length/max"].max())
    return Shape(steps, seqs, longest)


def differences(want: Shape, have: Shape) -> list[str]:
    """What of the log's shape `have` contradicts the profile's `want` (empty: it matches)."""
    out = []
    if want.steps is not None and have.steps is not None and have.steps != want.steps:
        out.append(f"{have.steps} steps (the profile runs {want.steps})")
    if want.seqs is not None and have.seqs is not None and abs(have.seqs - want.seqs) > 0.05 * want.seqs:
        out.append(f"{have.seqs:.0f} sequences per step (the profile makes {want.seqs:.0f} = train_batch_size "
                   f"{want.batch} x n {want.n})")
    if want.max_response is not None and have.max_response is not None and have.max_response > want.max_response:
        out.append(f"responses up to {have.max_response:.0f} tokens (the profile caps them at {want.max_response:.0f})")
    return out


def describe(have: Shape) -> str:
    parts = [f"{have.steps} steps" if have.steps is not None else "no steps"]
    if have.seqs is not None:
        parts.append(f"{have.seqs:.0f} sequences per step")
    if have.max_response is not None:
        parts.append(f"longest response {have.max_response:.0f} tokens")
    return ", ".join(parts)


def guess_profile(suite: Suite, frame: pd.DataFrame) -> tuple[str | None, str]:
    """(the one profile whose shape the log matches, what was seen) or (None, why no single one)."""
    have = log_shape(frame)
    matches = [p for p in suite.profile_names() if not differences(profile_shape(suite, p), have)]
    seen = describe(have)
    if len(matches) == 1:
        return matches[0], seen
    if not matches:
        return None, f"the log ({seen}) matches no profile of {suite.id}"
    return None, f"the log ({seen}) matches profiles {', '.join(matches)}"


def shape_mismatch(suite: Suite, profile: str, frame: pd.DataFrame) -> str | None:
    """One line when the log plainly does not have the profile's shape, with the profile it looks like."""
    diff = differences(profile_shape(suite, profile), log_shape(frame))
    if not diff:
        return None
    guess, _ = guess_profile(suite, frame)
    hint = (f"it looks like profile {guess}: pass --profile {guess}" if guess and guess != profile
            else "check --profile and the run's config")
    return (f"the log has {'; '.join(diff)}: it was not run with profile {profile}, so step-indexed and golden "
            f"checks do not compare like with like; {hint}")
