"""Helpers for driving rollout engines in tests."""

from __future__ import annotations

from collections.abc import Callable


def stop_after(k: int) -> Callable[[], bool]:
    """A `should_stop` that answers False k times, then True (an interrupt after k decode steps)."""
    calls = {"n": 0}

    def fn() -> bool:
        calls["n"] += 1
        return calls["n"] > k
    return fn
