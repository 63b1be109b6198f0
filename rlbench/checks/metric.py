"""One check of one metric series against a reference: the statistic, the comparison, the result record.

A run is a pandas DataFrame indexed by `step` with one column per metric (NaN where a step
lacks the metric), as produced by `rlbench.ingest.load`. A check takes one statistic of one metric
series, restricted to an inclusive step window `[a, b]` when given, and compares it:

    statistics (steps without a value dropped first; a NaN the log gave: see below)
      peak | max   max_t x_t            min      min_t x_t
      final        x at the last step   first    x at the first step
      mean, median over the window      mean_last(n), mean_first(n): mean of the last/first n values
      delta(n)     mean_last(n) - mean_first(n)
      slope        least-squares trend d x / d step = sum((t - t_bar)(x - x_bar)) / sum((t - t_bar)^2)
      steps_to_reach(threshold)  first step with x_t >= threshold (fails when never reached)
      no_nan       count of non-finite values from the metric's first logged step to the window end
                   (a gap inside a per-step metric counts: use it on metrics logged every step)
    comparisons (tol absolute, or a fraction of |value| with rel_tol: true)
      >=  actual >= value - tol        <=  actual <= value + tol
      approx  |actual - value| <= tol  band  every step of the window within [lo, hi]
    ratio: stat(num run) / stat(den run), compared like the above (e.g. median step time
      colocated / fully_async >= 1.5).

What a check saw: a reference whose metric is not in the log, whose window has no logged value,
or whose statistic needs a part of the run the log lacks is `not_evaluated` with the reason,
never a pass. A step where the log gave the metric as NaN (`frame.attrs["nan_steps"]`,
rlbench/ingest/load.py) is a step whose value is unknown, like a step the log lacks: a
statistic that reads it stands only when no value there could change the verdict (below), else
it is `not_evaluated` with the count of NaN steps (`no_nan` counts them itself and fails).
The run is expected to span step 0 or 1 to the profile's `steps`; `first` and `mean_first`
need its start, `final` and `mean_last` its end, every other statistic its whole
window. On a partial log only a conclusive verdict stands (a peak >= bound already reached, a
band already left, a non-finite value already seen); the rest are `not_evaluated`, and every
result of a partial log carries `coverage` ("log has steps 80-200 of the profile's 0-200
(starts late)") for the table and the report.

`rlbench.checks.evaluate` runs these over a profile's references; `rlbench.checks.golden` uses them for golden values.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlbench.checks.coverage import (
    Coverage,
    conclusive_on_partial,
    needs_note,
    not_evaluated_result,
)
from rlbench.checks.results import CheckResult
from rlbench.ingest.vocab import accuracy_twin
from rlbench.suites.suite import Reference


# ---------------------------------------------------------------------------- statistics
@dataclass
class StatValue:
    """A computed statistic and the steps it was computed over."""

    value: float | None  # None: undefined (e.g. threshold never reached)
    steps: np.ndarray  # [K] steps that entered the statistic
    note: str = ""  # extra context for the message (e.g. "never reached 0.9")


def window_series(frame: pd.DataFrame, metric: str, window: tuple[int, int] | None,
                  dropna: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(steps [K], values [K]) of `metric` within the inclusive window, in step order."""
    steps = frame.index.to_numpy()
    values = pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype=float)
    keep = np.ones(len(steps), dtype=bool)
    if window is not None:
        keep &= (steps >= window[0]) & (steps <= window[1])
    if dropna:
        keep &= ~np.isnan(values)
    return steps[keep], values[keep]


def compute_stat(frame: pd.DataFrame, metric: str, stat: str, *, n: int = 5,
                 window: tuple[int, int] | None = None, threshold: float | None = None) -> StatValue:
    """One statistic of one metric (see module docstring). Raises KeyError if the metric is absent."""
    if stat == "no_nan":
        steps, x = window_series(frame, metric, window, dropna=False)
        finite = np.isfinite(x)
        if not finite.any():
            return StatValue(float(len(x)), steps, "no finite value at all")
        x, steps = x[int(np.argmax(finite)):], steps[int(np.argmax(finite)):]
        bad = ~np.isfinite(x)
        note = f"first non-finite at step {steps[bad][0]}" if bad.any() else ""
        return StatValue(float(bad.sum()), steps, note)
    steps, x = window_series(frame, metric, window)
    if len(x) == 0:
        return StatValue(None, steps, "no logged values")
    if stat in ("peak", "max"):
        return StatValue(float(x.max()), steps, f"at step {steps[int(np.argmax(x))]}")
    if stat == "min":
        return StatValue(float(x.min()), steps, f"at step {steps[int(np.argmin(x))]}")
    if stat == "final":
        return StatValue(float(x[-1]), steps[-1:])
    if stat == "first":
        return StatValue(float(x[0]), steps[:1])
    if stat == "mean":
        return StatValue(float(x.mean()), steps)
    if stat == "median":
        return StatValue(float(np.median(x)), steps)
    if stat == "mean_last":
        return StatValue(float(x[-n:].mean()), steps[-n:])
    if stat == "mean_first":
        return StatValue(float(x[:n].mean()), steps[:n])
    if stat == "delta":
        if len(x) < 2:
            return StatValue(None, steps, "needs at least 2 values")
        return StatValue(float(x[-n:].mean() - x[:n].mean()), steps)
    if stat == "slope":
        if len(x) < 2:
            return StatValue(None, steps, "needs at least 2 values")
        t = steps.astype(float) - steps.mean()
        return StatValue(float((t * (x - x.mean())).sum() / (t * t).sum()), steps)
    if stat == "steps_to_reach":
        assert threshold is not None
        hit = x >= threshold
        if not hit.any():
            return StatValue(None, steps, f"never reached {_f(threshold)} (max {_f(float(x.max()))})")
        i = int(np.argmax(hit))
        return StatValue(float(steps[i]), steps[: i + 1])
    raise ValueError(f"unknown statistic {stat!r}")


def stat_label(stat: str | None, n: int, threshold: float | None) -> str:
    if stat is None:
        return "every step"
    if stat in ("mean_last", "mean_first", "delta"):
        return f"{stat}[{n}]"
    if stat == "steps_to_reach":
        return f"steps_to_reach({_f(threshold)})"
    return stat



# ---------------------------------------------------------------------------- comparisons
def compare(actual: float, op: str, value: float, tol: float, rel: bool) -> tuple[bool, str, str]:
    """(passed, bound text, tolerance text) for >=, <= and approx.

    E.g. op '>=' value 0.956 tol 0.03 -> (actual >= 0.926, ">= 0.926", "0.956 - tol 0.03").
    """
    t = tol * abs(value) if rel else tol
    tol_txt = f"tol {tol:g}" + (" x |value|" if rel else "")
    if op == ">=":
        return actual >= value - t, f">= {_f(value - t)}", (f"{_f(value)} - {tol_txt}" if t else "")
    if op == "<=":
        return actual <= value + t, f"<= {_f(value + t)}", (f"{_f(value)} + {tol_txt}" if t else "")
    if op == "approx":
        return abs(actual - value) <= t, f"{_f(value)} +- {_f(t)}", tol_txt
    raise ValueError(f"unknown comparison {op!r}")


def expectation(bound: str, tol_txt: str, note: str, source: str) -> str:
    """'>= 0.926 (0.956 - tol 0.03; <source>)'."""
    return f"{bound} ({'; '.join(p for p in (tol_txt, note + source) if p)})"


def _f(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e6 or a < 1e-2:
        return f"{x:.3g}"
    return f"{x:.3f}".rstrip("0").rstrip(".") if a >= 1 else f"{x:.3f}"


def _span(steps: np.ndarray) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) else "none"


# ---------------------------------------------------------------------------- NaN the log gave
def nan_steps_read(frame: pd.DataFrame, metric: str, stat: str | None, n: int,
                   window: tuple[int, int] | None) -> np.ndarray:
    """[K] steps in the window where the log gave `metric` as NaN and `stat` would have read a value.

    `first`/`mean_first` read the window's first (n) logged steps, `final`/`mean_last` its last;
    every other statistic (and a band) reads all of them.
    """
    logged = (frame.attrs.get("nan_steps") or {}).get(metric)
    if logged is None or not len(logged):
        return np.empty(0, dtype=np.int64)
    nan = np.asarray(logged, dtype=np.int64)
    if window is not None:
        nan = nan[(nan >= window[0]) & (nan <= window[1])]
    if not len(nan) or stat not in ("first", "mean_first", "final", "mean_last"):
        return nan
    steps, _ = window_series(frame, metric, window)
    k = 1 if stat in ("first", "final") else n
    every = np.union1d(steps, nan)  # the logged steps, a value or NaN
    read = every[:k] if stat in ("first", "mean_first") else every[-k:]
    return nan[np.isin(nan, read)]


def _ranges(steps: np.ndarray, most: int = 4) -> str:
    """[50, 51, 52, 77] -> '50-52, 77'."""
    runs: list[str] = []
    start = prev = None
    for s in map(int, steps):
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = s
    if start is not None:
        runs.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(runs[:most]) + (f" and {len(runs) - most} more" if len(runs) > most else "")


def nan_reason(metric: str, label: str, nan: np.ndarray, window: tuple[int, int] | None, run: str = "") -> str:
    """'actor/ppo_kl was logged as NaN at 10 steps in steps 1-200 (50-59): its max there is unknown ...'."""
    where = f"in steps {window[0]}-{window[1]}" if window is not None else "of the log"
    who = f" in the {run} run" if run else ""
    return (f"{metric} was logged as NaN at {len(nan)} step{'s' if len(nan) != 1 else ''} {where}{who} "
            f"({_ranges(nan)}): its {'value' if label == 'every step' else label} there is unknown (a no_nan "
            "check is what fails a run on NaN)")


# ---------------------------------------------------------------------------- missing values
def missing_metric(frame: pd.DataFrame, metric: str, run: str) -> str:
    names = [str(c) for c in frame.columns]
    reward = next((n for n in names if accuracy_twin(n) == metric), None)
    if reward is not None:
        return (f"metric {metric} not in run '{run or 'run'}'; it has {reward}, the mean validation reward, which "
                "is the accuracy only with 0/1 rewards: if they are, pass --reward-is-accuracy")
    near = difflib.get_close_matches(metric, names, n=3, cutoff=0.5) or names[:5]
    return f"metric {metric} not in run '{run or 'run'}' (nearest: {', '.join(near) or 'no metrics at all'})"


def _no_values(frame: pd.DataFrame, ref: Reference) -> str:
    logged = frame[ref.metric].dropna().index if ref.metric in frame.columns else frame.index[:0]
    where = f"steps {ref.window[0]}-{ref.window[1]}" if ref.window is not None else "the log"
    have = f"logged at steps {_span(logged.to_numpy())}" if len(logged) else "never logged with a value"
    return f"{ref.metric} has no value in {where} ({have})"


# ---------------------------------------------------------------------------- one check
def check_metric(ref: Reference, frame: pd.DataFrame, *, tol: float, run: str = "",
                 check_id: str | None = None, note: str = "", source: str | None = None,
                 scope: str | None = None, coverage: Coverage | None = None) -> CheckResult:
    """One metric reference (kind 'metric') against one run; `coverage`: the steps the run should span."""
    result = _check_metric(ref, frame, tol=tol, run=run, check_id=check_id, note=note, source=source, scope=scope)
    if ref.stat != "no_nan" and ref.metric in frame.columns:  # no_nan counts the NaN itself
        nan = nan_steps_read(frame, ref.metric, ref.stat, ref.n, ref.window)
        if len(nan) and not (result.verdict in ("pass", "fail") and
                             conclusive_on_partial(ref.stat, ref.op or "", result.verdict == "pass")):
            reason = nan_reason(ref.metric, stat_label(ref.stat, ref.n, ref.threshold), nan, ref.window)
            return _with_note(unevaluated(ref, result.check_id, run, reason, result.statistic), coverage)
        if len(nan):  # a verdict no value at those steps could change: it stands, and says so
            word = f": {result.verdict.upper()}"
            said = (f" (logged as NaN at {len(nan)} step{'s' if len(nan) != 1 else ''}, {_ranges(nan)}, which "
                    "could not change it)")
            result = dataclasses.replace(result, message=result.message.removesuffix(word) + said + word)
    if coverage is None or result.verdict not in ("pass", "fail"):
        return _with_note(result, coverage)
    lacks = needs_note(coverage, ref, ref.stat)
    if ref.stat == "steps_to_reach" and not lacks and result.actual is None:
        lacks = coverage.missing_for("final", ref.window)  # never reached: only the whole run says so
    if not lacks and ref.window is None and ref.stat in ("first", "mean_first", "delta", "steps_to_reach"):
        logged = frame[ref.metric].dropna().index
        start = max(coverage.first, 1)
        if len(logged) and int(logged.min()) > start:  # e.g. no validation before training
            lacks = (f"{ref.stat} reads the run's start; {ref.metric} is first logged at step {int(logged.min())}, "
                     f"the run starts at step {coverage.first}")
    if lacks and not conclusive_on_partial(ref.stat, ref.op or "", result.verdict == "pass"):
        result = not_evaluated_result(result, lacks)
    return _with_note(result, coverage)


def _with_note(result: CheckResult, coverage: Coverage | None) -> CheckResult:
    note = coverage.note() if coverage is not None else ""
    return dataclasses.replace(result, coverage=note) if note else result


def _check_metric(ref: Reference, frame: pd.DataFrame, *, tol: float, run: str = "",
                  check_id: str | None = None, note: str = "", source: str | None = None,
                  scope: str | None = None) -> CheckResult:
    assert ref.metric is not None and ref.op is not None
    cid = check_id or ref.check_id()
    src = source or ref.source
    label = stat_label(ref.stat, ref.n, ref.threshold)
    tag = f"[{run}] " if run and cid.endswith(f"@{run}") else ""  # name the run when there are several
    if ref.metric not in frame.columns:
        return unevaluated(ref, cid, run, missing_metric(frame, ref.metric, run), label)
    if ref.op == "band":
        assert ref.lo is not None and ref.hi is not None
        steps, x = window_series(frame, ref.metric, ref.window)
        out = (x < ref.lo) | (x > ref.hi)
        expected = expectation(f"every step in [{_f(ref.lo)}, {_f(ref.hi)}]", "", note, src)
        ok = len(x) > 0 and not out.any()
        detail = (f"{int(out.sum())} of {len(x)} steps outside, first step {steps[out][0]} = {_f(float(x[out][0]))}"
                  if out.any() else f"{len(x)} steps, min {_f(float(x.min()) if len(x) else None)}, "
                                    f"max {_f(float(x.max()) if len(x) else None)}")
        if len(x) == 0:
            return unevaluated(ref, cid, run, _no_values(frame, ref), label)
        verdict = "pass" if ok else "fail"
        msg = (f"{tag}{ref.metric} every step over steps {_span(steps)}: {detail}, expected {expected}: "
               f"{verdict.upper()}")
        return CheckResult(cid, verdict, ref.metric, label, expected, float(out.sum()), src, ref.why,
                           steps.tolist(), msg, scope or ref.scope, run, None, (ref.lo, ref.hi))
    sv = compute_stat(frame, ref.metric, ref.stat or "", n=ref.n, window=ref.window, threshold=ref.threshold)
    assert ref.value is not None
    ok, bound, tol_txt = compare(0.0 if sv.value is None else sv.value, ref.op, ref.value, tol, ref.rel_tol)
    ok = ok and sv.value is not None
    expected = expectation(bound, tol_txt, note, src)
    if sv.value is None and sv.note == "no logged values":
        return unevaluated(ref, cid, run, _no_values(frame, ref), label)
    if sv.value is None and sv.note.startswith("needs"):
        return unevaluated(ref, cid, run, f"{ref.metric} {label}: {sv.note} in the log", label)
    verdict = "pass" if ok else "fail"
    extra = f" ({sv.note})" if sv.note and (not ok or ref.stat in ("peak", "max", "min")) else ""
    msg = (f"{tag}{ref.metric} {label} over steps {_span(sv.steps)} = {_f(sv.value)}{extra}, "
           f"expected {expected}: {verdict.upper()}")
    band = _band(ref.op, ref.value, tol, ref.rel_tol)
    return CheckResult(cid, verdict, ref.metric, label, expected, sv.value, src, ref.why, sv.steps.tolist(),
                       msg, scope or ref.scope, run, ref.value, band)


def check_ratio(ref: Reference, profile_modes: list[str], runs: dict[str, pd.DataFrame], tol: float,
                 note: str, covs: dict[str, Coverage | None] | None = None) -> CheckResult:
    assert ref.metric and ref.num and ref.den and ref.op and ref.value is not None
    cid, pair = ref.check_id(), f"{ref.num}/{ref.den}"
    label = f"ratio({pair}) of {stat_label(ref.stat, ref.n, ref.threshold)}"
    for m in (ref.num, ref.den):
        if m not in profile_modes:
            return skipped(ref, f"this profile does not run mode {m}", ref.scope, cid, pair)
        if m not in runs:
            return errored(ref, cid, pair, f"no run for mode {m} (runs given: {', '.join(runs) or 'none'})", label)
        if ref.metric not in runs[m].columns:
            return unevaluated(ref, cid, pair, missing_metric(runs[m], ref.metric, m), label)
        cov = (covs or {}).get(m)
        lacks = needs_note(cov, ref, ref.stat) if cov is not None else ""
        if lacks:
            return unevaluated(ref, cid, pair, f"{m} run: {lacks}", label)
    for m in (ref.num, ref.den):
        nan = nan_steps_read(runs[m], ref.metric, ref.stat, ref.n, ref.window)
        if len(nan):
            return unevaluated(ref, cid, pair, nan_reason(ref.metric, label, nan, ref.window, m), label)
    a = compute_stat(runs[ref.num], ref.metric, ref.stat or "", n=ref.n, window=ref.window, threshold=ref.threshold)
    b = compute_stat(runs[ref.den], ref.metric, ref.stat or "", n=ref.n, window=ref.window, threshold=ref.threshold)
    if a.value is None or b.value is None:
        return unevaluated(ref, cid, pair, f"{ref.metric} {label}: no value ({ref.num} {_f(a.value)}, "
                                           f"{ref.den} {_f(b.value)}) in the window", label)
    if b.value == 0:
        return errored(ref, cid, pair, f"{ref.metric} {label}: undefined ({ref.num} {_f(a.value)}, "
                                      f"{ref.den} {_f(b.value)})", label)
    r = a.value / b.value
    ok, bound, tol_txt = compare(r, ref.op, ref.value, tol, ref.rel_tol)
    expected = expectation(bound, tol_txt, note, ref.source)
    verdict = "pass" if ok else "fail"
    msg = (f"{ref.metric} {ref.stat} {pair} over steps {_span(a.steps)} / {_span(b.steps)} = {_f(r)} "
           f"({_f(a.value)}/{_f(b.value)}), expected {expected}: {verdict.upper()}")
    return CheckResult(cid, verdict, ref.metric, label, expected, r, ref.source, ref.why,
                       sorted(set(a.steps.tolist()) | set(b.steps.tolist())), msg, ref.scope, pair,
                       ref.value, _band(ref.op, ref.value, tol, ref.rel_tol))


def _band(op: str, value: float, tol: float, rel: bool) -> tuple[float, float] | None:
    t = tol * abs(value) if rel else tol
    return (value - t, value + t) if op == "approx" else None


def skipped(ref: Reference, reason: str, scope: str, cid: str | None = None, run: str = "") -> CheckResult:
    """A `skip` result whose message says why the reference does not apply here."""
    cid = cid or ref.check_id()
    return CheckResult(cid, "skip", ref.metric or "", stat_label(ref.stat, ref.n, ref.threshold), "", None,
                       ref.source, ref.why, [], f"{cid}: SKIP ({reason})", scope, run)


def unevaluated(ref: Reference, cid: str, run: str, reason: str, label: str | None = None) -> CheckResult:
    """A `not_evaluated` result: the log lacks what the check reads (metric, window, start or end)."""
    return CheckResult(cid, "not_evaluated", ref.metric or "", label or stat_label(ref.stat, ref.n, ref.threshold),
                       "", None, ref.source, ref.why, [], f"{cid}: NOT EVALUATED ({reason})", ref.scope, run)


def errored(ref: Reference, cid: str, run: str, reason: str, label: str | None = None) -> CheckResult:
    """An `error` result: the check could not be computed (missing run or metric, undefined statistic)."""
    return CheckResult(cid, "error", ref.metric or "", label or stat_label(ref.stat, ref.n, ref.threshold),
                       "", None, ref.source, ref.why, [], f"{cid}: ERROR ({reason})", ref.scope, run)
