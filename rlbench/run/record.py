"""Append an evaluated suite x profile to the results store (rlbench/store/): one store run per seed,
with every check result (value, band, verdict, message) and every logged metric of every step.

    from rlbench.run.record import record_outcome
    ids = record_outcome(target, outcome)          # after rlbench.run.runner.evaluate_runs
    ids = record_outcome(target, outcome, extra={0: memory_results})   # pytest's memory items

Called by `rlbench run`, `rlbench check` (rlbench/cli.py) and after each profile of `pytest suites/`
(rlbench/run/pytest_plugin.py), only when a store is set (rlbench/store/target.py).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from rlbench.checks.results import CheckResult
from rlbench.run.runner import Outcome
from rlbench.store.connect import open_store
from rlbench.store.sqlite import CheckRow, RunRecord
from rlbench.store.target import MlflowLocation, StoreTarget


def check_row(r: CheckResult) -> CheckRow:
    lo, hi = r.ref_band if r.ref_band is not None else (None, None)
    return CheckRow(check_id=r.check_id, verdict=r.verdict, value=r.actual, lo=lo, hi=hi, ref_value=r.ref_value,
                    mode=r.run, metric=r.metric, message=r.message)


def metric_rows(runs: dict[str, pd.DataFrame]) -> Iterator[tuple[str, int, str, float | None]]:
    """(mode, step, key, value) of every finite-or-NaN numeric cell of each mode's frame."""
    for mode, frame in runs.items():
        num = frame.apply(pd.to_numeric, errors="coerce")
        steps = num.index.to_numpy()
        for key in num.columns:
            vals = num[key].to_numpy(dtype=float)
            keep = ~np.isnan(vals)
            for s, v in zip(steps[keep], vals[keep]):
                yield mode, int(s), str(key), float(v)


def run_record(outcome: Outcome, seed: int, env: dict[str, Any], prov: dict[str, Any],
               results: list[CheckResult], target: StoreTarget, modes: list[str]) -> RunRecord:
    from rlbench.report.html import overall_verdict

    git = env.get("git") or {}
    return RunRecord(
        suite=outcome.suite.id, profile=outcome.profile, mode="+".join(modes), arch=outcome.arch,
        device=outcome.device,
        source=target.source, verdict=overall_verdict(results), seed=seed, host=str(env.get("hostname") or ""),
        versions={k: v for k, v in (env.get("versions") or {}).items() if v},
        git_commit=prov.get("commit") or git.get("commit"),
        dirty=prov.get("dirty") if prov.get("dirty") is not None else git.get("dirty"),
        started=prov.get("date"),
        finished=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        trusted=target.trusted, folder=str(outcome.folder), command=str(prov.get("command") or ""))


def record_outcome(target: StoreTarget | None, outcome: Outcome,
                   extra: dict[int, list[CheckResult]] | None = None) -> list[int | str]:
    """Append each seed of `outcome` (its sections) to `target`'s store; the new run ids ([] without a store).
    An MLflow store also keeps the report (rlbench/store/mlflow_store.py)."""
    if target is None:
        return []
    seeds = list(dict.fromkeys(outcome.seed_of)) or [0]
    ids: list[int | str] = []
    keep = {"report": outcome.report} if isinstance(target.path, MlflowLocation) else {}
    with open_store(target.path) as store:
        for seed, section in zip(seeds, outcome.sections):
            results = [r for r, s in zip(outcome.results, outcome.seed_of) if s == seed]
            results += (extra or {}).get(seed, [])
            prov = dict(section.provenance or {})
            rec = run_record(outcome, seed, section.env, prov, results, target, list(section.runs))
            ids.append(store.append(rec, (check_row(r) for r in results), metric_rows(section.runs), **keep))
    return ids
