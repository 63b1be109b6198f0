"""Trend charts of the run report: each check's value over the results store's history.

    from rlbench.report.trends import load_trends
    trends = load_trends("results.sqlite", suite="s", profile="cpu", mode="colocated", device="cpu")
    render_report(..., trends=trends)         # rlbench/report/html.py draws one small chart per check

When a run is recorded to a results store (SQLite or MLflow, rlbench/store/), its report shows, per
check, the check's value in the store's last `LAST` runs of the same suite, profile, modes and
device (`recent_runs`, read before this run is appended), then this run: trusted runs as filled
blue dots, untrusted ones as open grey circles, this run as a red diamond, and the check's
accepted band (each run's own, which moves with a history gate's baseline) shaded green where
the check has one (not for an "every step in [lo, hi]" check, whose value counts the steps
outside). Without a store the report has no trend section.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from rlbench.checks.results import CheckResult
from rlbench.report.charts import TEMPLATE, Charts, esc, fmt
from rlbench.report.summary import status_of
from rlbench.store.connect import open_store
from rlbench.store.sqlite import StoredRun, StoreError
from rlbench.store.target import StoreLocation

LAST = 20  # earlier runs drawn per chart
TRUSTED, UNTRUSTED, CURRENT, BAND = "#1f77b4", "#8c959f", "#cf222e", "#2ca02c"


@dataclass
class Trends:
    """The earlier runs a report's trend charts draw (newest first), and where they came from."""

    runs: list[StoredRun]
    where: str  # "suite [profile] colocated on cpu in results.sqlite"
    error: str = ""  # the store could not be read: why (the report is written all the same)


def load_trends(store: StoreLocation, *, suite: str, profile: str, mode: str, device: str,
                last: int = LAST) -> Trends:
    """The last `last` runs of suite x profile x modes x device in `store` (none when the file does not exist
    yet); a store that cannot be read gives no runs and its error, so the report is still written."""
    where = f"{suite} [{profile}] {mode} on {device or '(no device)'} in {store}"
    if isinstance(store, Path) and not store.is_file():
        return Trends([], where)
    try:
        with open_store(store) as s:
            return Trends(s.recent_runs(suite, profile, mode, device, last=last), where)
    except StoreError as e:
        return Trends([], where, error=str(e))


def _num(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _label(run: StoredRun) -> str:
    rid = str(run.id)
    return f"#{rid}" if rid.isdigit() else rid[:7]  # a SQLite row id, or an MLflow run id's head


def steps_outside(r: CheckResult) -> bool:
    """An "every step in [lo, hi]" check: its value counts the steps outside, so its band is not on the value's axis."""
    return r.statistic == "every step"


def trend_points(check_id: str, runs: Sequence[StoredRun], current: CheckResult) -> dict[str, list]:
    """Oldest first, this run last: label, value, band lo/hi, trusted (None for this run), verdict."""
    pts: dict[str, list] = {"label": [], "value": [], "lo": [], "hi": [], "trusted": [], "verdict": []}
    band = not steps_outside(current)
    for run in reversed(runs):
        c = run.checks.get(check_id)
        if c is None:
            continue
        for k, v in (("label", _label(run)), ("value", _num(c.value)), ("lo", _num(c.lo) if band else None),
                     ("hi", _num(c.hi) if band else None), ("trusted", run.record.trusted), ("verdict", c.verdict)):
            pts[k].append(v)
    lo, hi = current.ref_band if current.ref_band is not None and band else (None, None)
    for k, v in (("label", "this run"), ("value", _num(current.actual)), ("lo", _num(lo)), ("hi", _num(hi)),
                 ("trusted", None), ("verdict", current.verdict)):
        pts[k].append(v)
    return pts


def trend_chart(check_id: str, pts: dict[str, list], charts: Charts) -> str:
    """One small chart: the band, the earlier runs (trusted / untrusted), this run."""
    fig = go.Figure(layout={"template": TEMPLATE})
    x = pts["label"]
    if any(v is not None for v in pts["lo"]) and any(v is not None for v in pts["hi"]):
        fig.add_trace(go.Scatter(x=x, y=pts["lo"], mode="lines", name="band lo", line={"color": BAND, "width": 1},
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=pts["hi"], mode="lines", name="band hi", line={"color": BAND, "width": 1},
                                 fill="tonexty", fillcolor="rgba(44,160,44,0.15)", hoverinfo="skip"))
    else:  # a one-sided band: its edge as a dashed line
        for side in ("lo", "hi"):
            if any(v is not None for v in pts[side]):
                fig.add_trace(go.Scatter(x=x, y=pts[side], mode="lines", name=f"band {side}", hoverinfo="skip",
                                         line={"color": BAND, "width": 1.5, "dash": "dash"}))
    fig.add_trace(go.Scatter(x=x, y=pts["value"], mode="lines", name="value", line={"color": "#d0d7de", "width": 1},
                             hoverinfo="skip"))
    for name, want, marker in (("trusted", True, {"color": TRUSTED, "size": 7, "symbol": "circle"}),
                               ("untrusted", False, {"color": UNTRUSTED, "size": 7, "symbol": "circle-open",
                                                     "line": {"width": 1.5}}),
                               ("this run", None, {"color": CURRENT, "size": 12, "symbol": "diamond"})):
        idx = [i for i, t in enumerate(pts["trusted"]) if t is want]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=[x[i] for i in idx], y=[pts["value"][i] for i in idx], mode="markers", name=name, marker=marker,
            text=[f"{x[i]} ({name}): {fmt(pts['value'][i])}, {pts['verdict'][i]}" for i in idx],
            hoverinfo="text"))
    fig.update_layout(showlegend=False, xaxis={"type": "category", "tickfont": {"size": 10}, "automargin": True},
                      yaxis={"tickfont": {"size": 10}, "automargin": True}, hovermode="closest")
    return charts.add(fig, height=210, margin={"l": 50, "r": 10, "t": 10, "b": 40})


def trends_html(results: Sequence[CheckResult], trends: Trends, charts: Charts) -> str:
    """The trend section: a grid of small charts, one per evaluated check with a value here or before."""
    cells = []
    for r in results:
        if status_of(r) == "skip":
            continue
        pts = trend_points(r.check_id, trends.runs, r)
        if all(v is None for v in pts["value"]):
            continue
        earlier = len(pts["value"]) - 1
        band = ""
        if steps_outside(r) and r.ref_band is not None:
            band = f" (steps outside [{fmt(r.ref_band[0])}, {fmt(r.ref_band[1])}])"
        elif r.ref_band is not None:
            band = f"; band [{fmt(r.ref_band[0])}, {fmt(r.ref_band[1])}]"
        cells.append(f'<div class="trend"><p class="trend-title"><code>{esc(r.check_id)}</code></p>'
                     f'<p class="trend-sub">{earlier} earlier run(s); this run {esc(fmt(pts["value"][-1]))} '
                     f"{esc(r.verdict)}{esc(band)}</p>" + trend_chart(r.check_id, pts, charts) + "</div>")
    head = (f'<p class="note">Each check over the last {len(trends.runs)} run(s) of {esc(trends.where)}, oldest '
            f'first: <span style="color:{TRUSTED}">&#9679; trusted</span>, <span style="color:{UNTRUSTED}">'
            f'&#9675; untrusted</span>, <span style="color:{CURRENT}">&#9670; this run</span>, '
            f'<span style="color:{BAND}">green: the accepted band</span>.</p>')
    if trends.error:
        return f'<p class="msg warn">No trends: the results store could not be read ({esc(trends.error)}).</p>'
    if not trends.runs:
        return f'<p class="note">No earlier run of {esc(trends.where)}: the trends start with this run.</p>'
    if not cells:
        return head
    return head + '<div class="trends">' + "".join(cells) + "</div>"
