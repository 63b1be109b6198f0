"""Gates from trusted history: a reference with `history` compares this run's statistic with the same
check's values in the last N trusted runs of the results store (rlbench/store/sqlite.py, or an MLflow
experiment: rlbench/store/mlflow_store.py, its FINISHED runs tagged rlbench.trusted=1).

    references:
      - metric: perf/throughput
        stat: median
        op: ">="                       # higher is better: only a drop fails
        history: {rule: median_rel, last: 10, band: 0.05}
        profiles: [cpu]
        source: "rlbench: this runner's own trusted history"
        why: a 5% throughput drop against the runner's nightly median is a regression
      - metric: val-core/synthetic/arithmetic/acc/mean@1
        stat: mean_last
        n: 3
        op: approx
        history: {rule: mean_floor, last: 20, rel: 0.02, floor: 0.02}

    pytest suites/ --arch cpu --rlbench-store results.sqlite      # reads the history, appends this run

Rules (rlbench/suites/suite.py `History`), chosen per metric kind:
- `median_rel` for throughput, step time and peak memory: the reference is the median of the last
  `last` trusted runs on the same device (`match: device`, or `runner` for the same host too), and
  the band is `band` x |median|. A median, because timings on shared runners have outliers (a run
  that met a busy neighbour) that would drag a mean; relative, because speed scales with the board
  (prime-rl gates throughput, MFU and step time at 15%).
- `mean_floor` for accuracy and KL (Miles' metric-history gate): the reference is the mean of the
  last <= 20 trusted runs of the same arch (numerics are per arch, not per board), the band
  two-sided max(`rel` x |mean|, `floor`): the floor keeps a near-zero metric (a KL) from getting
  a band of zero.
`op` says which side fails: `>=` a value under the band, `<=` one over it, `approx` either.
Too few trusted runs (`min_runs`, default min(last, 5)), or no store set: `not_evaluated` with the
reason, never a pass; the statistic is still computed and stored, so trusted runs build the history.
The run being checked is not part of its own history (it is appended after its checks).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rlbench.checks.coverage import Coverage, needs_note
from rlbench.checks.metric import _f, check_metric, compute_stat, missing_metric, stat_label
from rlbench.checks.results import CheckResult
from rlbench.store.connect import open_store
from rlbench.store.target import StoreLocation
from rlbench.suites.suite import History, Reference


@dataclass(frozen=True)
class HistorySource:
    """Where history comes from, and what this run is matched on."""

    store: StoreLocation | None  # a SQLite file or an MLflow experiment; None: no results store set
    suite: str
    profile: str
    arch: str
    device: str
    host: str = ""


@dataclass(frozen=True)
class Baseline:
    value: float  # the reference: median or mean of the history
    band: float  # half-width, in the metric's units
    n: int  # runs it was computed from
    what: str  # "the median of the last 10 trusted runs"
    band_text: str  # "band 5%" or "band max(0.02 x |mean|, 0.02) = 0.02"


def baseline(h: History, values: list[float]) -> Baseline:
    """The reference and band of rule `h` over `values` (newest first, at most h.last)."""
    n = len(values)
    if h.rule == "median_rel":
        assert h.band is not None
        ref = float(statistics.median(values))
        return Baseline(ref, h.band * abs(ref), n, f"the median of the last {n} trusted runs",
                        f"band {h.band * 100:g}%")
    assert h.rel is not None and h.floor is not None
    ref = float(statistics.fmean(values))
    band = max(h.rel * abs(ref), h.floor)
    return Baseline(ref, band, n, f"the mean of the last {n} trusted runs",
                    f"band max({h.rel:g} x |mean|, {h.floor:g}) = {_f(band)}")


def _match(h: History, src: HistorySource) -> dict[str, str]:
    on = h.match_on()
    if on == "arch":
        return {"arch": src.arch}
    if on == "runner":
        return {"device": src.device, "host": src.host}
    return {"device": src.device}


def _where(h: History, src: HistorySource) -> str:
    m = _match(h, src)
    return ", ".join(f"{k} {v or '(none)'}" for k, v in m.items())


def history_values(h: History, src: HistorySource, check_id: str) -> list[float]:
    """The check's values in the trusted runs that match this run, newest first."""
    if src.store is None or (isinstance(src.store, Path) and not src.store.is_file()):
        return []
    with open_store(src.store) as store:
        rows = store.trusted_values(src.suite, src.profile, check_id, match=_match(h, src), last=h.last)
    return [v for _, v in rows]


def check_history(ref: Reference, frame: pd.DataFrame, src: HistorySource | None, *, run: str = "",
                  check_id: str | None = None, coverage: Coverage | None = None) -> CheckResult:
    """One history reference against one run (see module docstring)."""
    h = ref.history
    assert h is not None and ref.metric is not None and ref.op is not None
    cid = check_id or ref.check_id()
    label = stat_label(ref.stat, ref.n, ref.threshold)
    tag = f"[{run}] " if run and cid.endswith(f"@{run}") else ""
    if ref.metric not in frame.columns:
        return _not_evaluated(ref, cid, run, label, None, missing_metric(frame, ref.metric, run))
    sv = compute_stat(frame, ref.metric, ref.stat or "", n=ref.n, window=ref.window, threshold=ref.threshold)
    if coverage is not None and needs_note(coverage, ref, ref.stat):
        sv = dataclasses.replace(sv, value=None)  # a partial log's statistic is no history value
    if src is None or src.store is None:
        return _not_evaluated(ref, cid, run, label, sv.value, "no results store is set (--store, --rlbench-store "
                              "or RLBENCH_STORE): a history reference compares with the store's trusted runs")
    values = history_values(h, src, cid)
    if len(values) < h.needed():
        return _not_evaluated(ref, cid, run, label, sv.value,
                              f"{len(values)} trusted run(s) of {src.suite} [{src.profile}] with this check on "
                              f"{_where(h, src)} in {src.store}; the gate needs {h.needed()} (min_runs)")
    base = baseline(h, values)
    # The comparison, coverage and window rules of a constant reference, with the history's value and band.
    fixed = ref.model_copy(update={"history": None, "value": base.value, "tol": base.band, "rel_tol": False})
    res = check_metric(fixed, frame, tol=base.band, run=run, check_id=cid, coverage=coverage)
    if res.verdict not in ("pass", "fail") or res.actual is None:
        return res
    diff = res.actual - base.value
    rel = diff / abs(base.value) if base.value else float("inf")
    side = "under" if diff < 0 else "over"
    # speed and memory scale with the board: relative; accuracy and KL: in the metric's own units
    how = (f"{abs(rel) * 100:.1f}% {side}" if h.rule == "median_rel" and base.value
           else f"{_f(abs(diff))} {side}")
    msg = (f"{tag}{ref.metric} {label} {_thousands(res.actual)}, {how} {base.what} ({_thousands(base.value)}; "
           f"{base.band_text}, {_where(h, src)}): {res.verdict.upper()}")
    expected = {">=": f">= {_f(base.value - base.band)}", "<=": f"<= {_f(base.value + base.band)}",
                "approx": f"{_f(base.value)} +- {_f(base.band)}"}[ref.op]
    return dataclasses.replace(res, message=msg, expected=f"{expected} ({base.what}; {base.band_text})",
                               ref_value=base.value, ref_band=(base.value - base.band, base.value + base.band))


def _thousands(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else _f(x)


def _not_evaluated(ref: Reference, cid: str, run: str, label: str, value: float | None, reason: str) -> CheckResult:
    """Not evaluated, with the statistic kept (`actual`) so that a trusted run still adds to the history."""
    return CheckResult(cid, "not_evaluated", ref.metric or "", label, "", value, ref.source, ref.why, [],
                       f"{cid}: NOT EVALUATED ({reason})", ref.scope, run)
