"""Evaluate a suite's references against metrics frames: which references apply here (scopes), each
checked by `rlbench.checks.metric`, ratios across runs, golden references by `rlbench.checks.golden`.

Scopes decide whether a reference applies here; when it does not the verdict is `skip` with
the reason: profile mismatch; device-scoped references hold only on their board (token match
of `device` in the device name, e.g. MI300X in "AMD Instinct MI300X"); numerics-scoped ones
hold on their arches (default: the published arch for `full`, any arch for mini/cpu) and on
other arches only with `cross_arch_tol`, which replaces `tol`; a reference with `engines` holds
only on runs whose rollout engine it lists (`engines`: mode -> rollout.engine of that run; e.g.
a weight-sync check that reads the engine's parameters, which vLLM keeps in its own process),
and a run on another engine is skipped with the reference's `engines.why`.
 All work is vectorized per series: no Python loop over steps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from rlbench.checks.coverage import Coverage, with_coverage
from rlbench.checks.golden import check_golden
from rlbench.checks.history import HistorySource, check_history
from rlbench.checks.metric import check_metric, check_ratio, errored, skipped
from rlbench.checks.results import CheckResult
from rlbench.suites.suite import Reference, Suite


# ---------------------------------------------------------------------------- scopes
def device_matches(device: str, device_name: str) -> bool:
    """Token match: 'MI300X' matches 'AMD Instinct MI300X' but not 'AMD Instinct MI300A'."""
    tokens = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    return device.upper() in tokens


def skip_reason(suite: Suite, ref: Reference, profile: str, arch: str,
                device_name: str) -> tuple[str | None, float]:
    """(reason to skip or None, tolerance to use here)."""
    if profile not in ref.profiles:
        return f"applies to profile {'/'.join(ref.profiles)} (this run: {profile})", ref.tol
    if ref.kind == "golden":
        return None, ref.tol
    if ref.scope == "device":
        assert ref.device is not None
        if not device_matches(ref.device, device_name):
            return f"device-scoped to {ref.device}; this run is on {device_name or 'unknown device'}", ref.tol
        return None, ref.tol
    arches = ref.arch or ([suite.published_on.arch] if profile == "full" else ["any"])
    if "any" in arches or arch in arches:
        return None, ref.tol
    if ref.cross_arch_tol is not None:
        return None, ref.cross_arch_tol
    return (f"numerics reference for {'/'.join(arches)} without cross_arch_tol; this run is on {arch}",
            ref.tol)


def evaluate(suite: Suite, profile: str, runs: dict[str, pd.DataFrame], *, arch: str,
             device_name: str, golden_dir: str | Path | None = None, steps: int | None = None,
             engines: dict[str, str] | None = None,
             history: HistorySource | None = None) -> list[CheckResult]:
    """Every reference of `suite` against `runs` (mode name -> metrics frame) of one profile.

    `engines`: the rollout engine each mode's run used (mode -> rollout.engine); default: the
    profile's own (`profile_engines`), right for logs trained without engine overrides.

    `steps`: how many steps the runs were meant to have (default: the profile's `steps`); a run
    trained to fewer on purpose (the first N steps of a profile) passes N, and only its checks
    that need steps past N are then `not_evaluated`.

    `history`: the results store and this run's suite, profile and machine, for references with
    `history` (rlbench/checks/history.py); None: those are not evaluated (no store).
    """
    prof = suite.profile(profile)
    runs = {m: (f if f.index.is_monotonic_increasing else f.sort_index()) for m, f in runs.items()}
    covs = {m: Coverage.of(f, prof.steps if steps is None else steps) for m, f in runs.items()}
    if engines is None:
        engines = profile_engines(suite, profile)
    results: list[CheckResult] = []
    for ref in suite.references:
        reason, tol = skip_reason(suite, ref, profile, arch, device_name)
        if ref.kind == "golden":
            if reason:
                results.append(skipped(ref, reason, "golden"))
            else:
                results.extend(with_coverage(check_golden(suite, ref, profile, runs, arch=arch,
                                                          golden_dir=golden_dir), covs))
            continue
        if reason:
            results.append(skipped(ref, reason, ref.scope))
            continue
        cross = f"cross-arch tol for {arch}; " if tol != ref.tol else ""
        if ref.kind == "ratio":
            results.append(check_ratio(ref, prof.modes, runs, tol, cross, covs))
            continue
        modes = ref.modes or prof.modes
        for mode in modes:
            cid = ref.check_id(mode if (ref.modes or len(modes) > 1) else None)
            if mode not in prof.modes:
                results.append(skipped(ref, f"profile {profile} does not run mode {mode}", ref.scope, cid, mode))
            elif ref.engines is not None and engines.get(mode) not in ref.engines.only:
                results.append(skipped(ref, f"computed with rollout.engine {'/'.join(ref.engines.only)} only; "
                                            f"this run's engine is {engines.get(mode) or 'unknown'}: "
                                            f"{ref.engines.why}", ref.scope, cid, mode))
            elif mode not in runs:
                results.append(errored(ref, cid, mode, f"no run for mode {mode} (runs given: "
                                                      f"{', '.join(runs) or 'none'})"))
            elif ref.history is not None:
                results.append(check_history(ref, runs[mode], history, run=mode, check_id=cid, coverage=covs[mode]))
            else:
                results.append(check_metric(ref, runs[mode], tol=tol, run=mode, check_id=cid, note=cross,
                                            coverage=covs[mode]))
    return results


def profile_engines(suite: Suite, profile: str, sets: list[str] | None = None) -> dict[str, str]:
    """mode -> rollout.engine of the profile's runs (the trainer's default `hf` when unset), after `sets`."""
    from trainer.config import apply_overrides

    out = {}
    for mode in suite.profile(profile).modes:
        cfg = apply_overrides(suite.resolve_trainer_config(profile, mode, expand=False), list(sets or []))
        out[mode] = str((cfg.get("rollout") or {}).get("engine") or "hf")
    return out


