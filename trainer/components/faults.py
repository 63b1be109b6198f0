"""Test-only fault injection: kill the trainer process at a named phase of a named step, or pace the
rollout worker's decode loop.

    RLBENCH_FAULT_AT=line:3 python -m trainer trainer/configs/grpo_tiny_arithmetic.yaml

The process sends itself SIGKILL (no cleanup, no atexit, like `kill -9`) the first time it reaches
`fault_point(phase, step)` with that phase and step. Phases, in the order a step meets them:

    rollout     the step's responses are generated (on the Ray path: the driver dies while the
                workers are still generating)
    update      the policy update is done, the weights not yet synced
    checkpoint  the workers' checkpoint files are written, state.pt not yet (an unfinished folder)
    line        the step's metrics line is written, its checkpoint not yet committed
    commit      the checkpoint is renamed into place, older ones not yet pruned

Unset, it costs one dict lookup. A value naming no phase is an error, so a typo cannot make a
fault test pass without a fault.

    RLBENCH_ROLLOUT_PACE_S=0.01

makes the fully-async rollout worker sleep that long before each decode step of an interruptible
engine, so the rollouter is the slower side whatever the machine's load and a weight sync always
meets a generation running (what a partial-rollout test needs to see). The driver reads it and hands
it to each rollout worker it starts (a Ray cluster that an earlier run in the process started keeps
that run's environment). A value that is not a number >= 0 is an error.
"""

from __future__ import annotations

import os
import signal

from trainer.errors import ConfigError

FAULT_ENV = "RLBENCH_FAULT_AT"
PACE_ENV = "RLBENCH_ROLLOUT_PACE_S"
PHASES = ("rollout", "update", "checkpoint", "line", "commit")


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    phase, _, step = spec.partition(":")
    if phase not in PHASES or not step.isdigit():
        raise ConfigError(f"{FAULT_ENV}={spec!r}: expected <phase>:<step> with a phase in {', '.join(PHASES)} "
                          f"(fix: e.g. {FAULT_ENV}=line:2, or unset it)")
    return phase, int(step)


def fault_point(phase: str, step: int) -> None:
    """SIGKILL this process if `RLBENCH_FAULT_AT` names this phase and step."""
    target = _target()
    if target is not None and target == (phase, step):
        os.kill(os.getpid(), signal.SIGKILL)


def rollout_pace_s() -> float:
    """Seconds to sleep before each decode step of the rollout worker (0 unless `RLBENCH_ROLLOUT_PACE_S` is set)."""
    spec = os.environ.get(PACE_ENV)
    if not spec:
        return 0.0
    try:
        pace = float(spec)
    except ValueError:
        pace = -1.0
    if not pace >= 0:
        raise ConfigError(f"{PACE_ENV}={spec!r}: expected seconds >= 0 (fix: e.g. {PACE_ENV}=0.01, or unset it)")
    return pace
