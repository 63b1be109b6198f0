"""Charts and timing tables of the parity report (rlbench/report/html.py), as plotly figures and HTML.

    from rlbench.report.charts import downsample, partition_table, throughput_table
    partition_table({"colocated": frame})     # mean seconds per phase per run

- `metric_chart`: a metric's curve per run (step on x) with each evaluated check's reference value
  as a dashed line and its accepted band shaded (only for statistics in the metric's own unit),
  and above it one line per check: verdict, statistic = actual, expected;
- step-time partition: mean seconds per phase per run as stacked bars, one fixed colour per phase
  on every chart (`PHASE_COLOURS`), "other" = mean(`timing_s/step` - sum of the phases); in
  fully-async runs phases overlap, so "other" can be negative: shown as 0 and flagged. The bars are
  drawn only when a timing reference was evaluated; otherwise the table alone says these are this
  machine's timings, compared to nothing;
- throughput table: median and mean of `perf/throughput` (tok/s/GPU, or tok/s on a CPU run),
  `timing_s/step`, tokens/s = `perf/total_num_tokens` / `timing_s/step`, ratio of two runs.

Curves longer than `MAX_POINTS` are downsampled: the steps are cut into MAX_POINTS/2 buckets and
each keeps its minimum and maximum, so spikes stay visible and a 10,000-step run stays small.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from rlbench.checks.results import CheckResult
from rlbench.report.summary import badge, expected_text, status_of

MAX_POINTS = 2000  # per trace, after downsampling
PHASES: tuple[tuple[str, str], ...] = (
    ("timing_s/gen", "generation"),
    ("timing_s/old_log_prob", "old log-prob"),
    ("timing_s/ref", "ref log-prob"),
    ("timing_s/update_actor", "actor update"),
    ("timing_s/update_weights", "weight sync"),
)
STEP_TIME = "timing_s/step"
# Statistics whose value is not in the metric's unit: no reference line on the metric's curve.
_NOT_IN_METRIC_UNIT = ("ratio", "slope", "delta", "steps_to_reach", "no_nan")
TEMPLATE = "plotly_white"
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
# One colour per phase on every chart of every suite (a phase keeps its colour when others are absent).
PHASE_COLOURS = {"generation": "#1f77b4", "old log-prob": "#ff7f0e", "ref log-prob": "#9467bd",
                 "actor update": "#2ca02c", "weight sync": "#d62728", "other": "#bbbbbb"}
# Validation accuracy: drawn on every report, checked or not (the curve a reader looks for first).
VAL_PREFIX = "val-core/"
# Metrics that measure this machine's speed: charted only when a check on them was evaluated.
TIMING_PREFIXES = ("timing_s/", "perf/")


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) >= 1000:
        return f"{x:,.1f}"
    return f"{x:.4g}"


def run_label(name: str) -> str:
    return name or "run"


# ------------------------------------------------------------------ charts


def downsample(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Finite points of a curve, at most `max_points`: per bucket of steps, its min and its max."""
    keep = np.isfinite(values)
    x, y = steps[keep], values[keep]  # [N]
    n = len(y)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    per = math.ceil(n / buckets)
    rows = math.ceil(n / per)
    padded = np.full(rows * per, np.nan)
    padded[:n] = y
    grid = padded.reshape(rows, per)  # [rows, per]; only the last row can hold padding
    base = np.arange(rows) * per
    idx = np.unique(np.concatenate([base + np.nanargmin(grid, axis=1), base + np.nanargmax(grid, axis=1)]))
    return x[idx], y[idx]


class Charts:
    """Collects chart divs and their figure JSON; one counter per page keeps div ids unique."""

    def __init__(self) -> None:
        self.count = 0
        self.scripts: list[str] = []

    def add(self, fig: go.Figure, height: int = 360, margin: dict[str, int] | None = None) -> str:
        self.count += 1
        div_id = f"rlbench-chart-{self.count}"
        fig.update_layout(height=height, margin=margin or {"l": 60, "r": 20, "t": 50, "b": 50})
        spec = fig.to_plotly_json()
        spec["layout"].pop("template", None)  # the page sets the template once
        payload = pio.to_json({"data": spec["data"], "layout": spec["layout"]}, validate=False)
        self.scripts.append(f'draw("{div_id}", {script_safe(payload)});')
        return f'<div id="{div_id}" class="rlbench-chart" style="height:{height}px"></div>'


def script_safe(payload: str) -> str:
    """JSON that cannot close the surrounding <script> element."""
    return payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _in_metric_unit(statistic: str) -> bool:
    return not statistic.startswith(_NOT_IN_METRIC_UNIT)


# One colour per run mode on every chart (a suite that runs only fully_async still draws it in red).
RUN_COLOURS = {"colocated": "#1f77b4", "fully_async": "#d62728"}


def _trace_colour(run: str, i: int) -> str:
    return RUN_COLOURS.get(run) or _PALETTE[(i + len(RUN_COLOURS)) % len(_PALETTE)]


def _chart_caption(results: list[CheckResult], actual: Any) -> str:
    """One line per evaluated check drawn on the chart: verdict, statistic = actual, expected."""
    if not results:
        return '<p class="caption note">No check reads this metric here: its curve is shown for context.</p>'
    lines = "".join(
        f"<li>{badge(r.verdict)} {esc(r.run + ': ' if r.run else '')}<code>{esc(r.statistic)}</code> = "
        f"{esc(actual(r))}, expected {esc(expected_text(r))}</li>" for r in results)
    return f'<ul class="caption">{lines}</ul>'


def metric_chart(metrics: list[str], runs: dict[str, pd.DataFrame], results: list[CheckResult], charts: Charts,
                  *, actual: Any, y_title: str | None = None) -> str:
    """Curves of `metrics` per run (step on x), with each result's reference line and accepted band."""
    fig = go.Figure(layout={"template": TEMPLATE})
    lo, hi = math.inf, -math.inf
    colour = 0
    for name, frame in runs.items():
        for metric in metrics:
            if metric not in frame.columns:
                continue
            x, y = downsample(frame.index.to_numpy(dtype=np.int64),
                              pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype=np.float64))
            if len(y):
                lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
            label = run_label(name) if len(metrics) == 1 else f"{run_label(name)}: {metric}"
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers" if len(y) < 60 else "lines",
                                     name=esc(label),
                                     line={"color": _trace_colour(name if len(metrics) == 1 else "", colour)}))
            colour += 1
    if not fig.data:
        return f'<p class="note">No run logged <code>{esc(", ".join(metrics))}</code>: no chart.</p>'
    refs = [r for r in results if _in_metric_unit(r.statistic) and status_of(r) != "skip"]
    for r in refs:
        if r.ref_value is not None and math.isfinite(r.ref_value):
            lo, hi = min(lo, r.ref_value), max(hi, r.ref_value)
        if r.ref_band is not None:
            lo = min(lo, *(b for b in r.ref_band if math.isfinite(b)), lo)
            hi = max(hi, *(b for b in r.ref_band if math.isfinite(b)), hi)
    pad = 0.05 * (hi - lo) if hi > lo else max(abs(hi), 1.0) * 0.05
    seen: set[tuple[str, float, float]] = set()
    for r in refs:
        if r.ref_band is not None:
            b0 = r.ref_band[0] if math.isfinite(r.ref_band[0]) else lo - pad
            b1 = r.ref_band[1] if math.isfinite(r.ref_band[1]) else hi + pad
            if ("band", b0, b1) not in seen:
                seen.add(("band", b0, b1))
                fig.add_hrect(y0=b0, y1=b1, fillcolor="#2ca02c", opacity=0.12, line_width=0,
                              annotation_text=esc(f"accepted [{fmt(r.ref_band[0])}, {fmt(r.ref_band[1])}]"),
                              annotation_position="bottom right", annotation_font_size=11)
        if r.ref_value is not None and math.isfinite(r.ref_value) and ("ref", r.ref_value, 0.0) not in seen:
            seen.add(("ref", r.ref_value, 0.0))
            fig.add_hline(y=r.ref_value, line_dash="dash", line_color="#444",
                          annotation_text=esc(f"ref {fmt(r.ref_value)} ({r.statistic})"),
                          annotation_position="top left")
    fig.update_layout(title={"text": esc(", ".join(metrics)), "x": 0.01, "xanchor": "left"}, xaxis_title="step",
                      yaxis_title=esc(y_title or metrics[0]), legend={"orientation": "h", "y": -0.25})
    return _chart_caption(results, actual) + charts.add(fig, height=340)


def validation_metrics(runs: dict[str, pd.DataFrame]) -> list[str]:
    """Validation accuracy columns (`val-core/.../acc/...`) of any run, else any `val-core/` column."""
    cols = sorted({str(c) for f in runs.values() for c in f.columns if str(c).startswith(VAL_PREFIX)})
    acc = [c for c in cols if "/acc/" in c]
    return acc or cols


def is_cpu(env: Mapping[str, Any]) -> bool:
    """The runs were made (or are checked as made) on the CPU: arch cpu, or no GPU recorded."""
    if str(env.get("arch") or "") == "cpu" or str(env.get("device_name") or "").lower() == "cpu":
        return True
    n = env.get("num_gpus", env.get("gpu_count"))
    return n is not None and int(n) == 0


def partition_table(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean seconds per phase per run over the steps that logged `timing_s/step` (rows = runs)."""
    out: dict[str, dict[str, float]] = {}
    for name, frame in runs.items():
        if STEP_TIME not in frame.columns:
            continue
        rows = frame[frame[STEP_TIME].notna()]
        phases = {label: rows[key].mean() for key, label in PHASES if key in rows.columns}
        if not phases:
            continue
        summed = rows[[key for key, _ in PHASES if key in rows.columns]].fillna(0.0).sum(axis=1)
        phases["other"] = float((rows[STEP_TIME] - summed).mean())
        phases["step"] = float(rows[STEP_TIME].mean())
        out[run_label(name)] = phases
    return pd.DataFrame.from_dict(out, orient="index")


def partition_section(runs: dict[str, pd.DataFrame], charts: Charts, checked: bool) -> str:
    table = partition_table(runs)
    if table.empty:
        return (f'<p class="note">No run logged <code>{STEP_TIME}</code> with per-phase timings: '
                "no step-time partition.</p>")
    labels = [c for c in table.columns if c != "step"]
    fig = go.Figure(layout={"template": TEMPLATE, "barmode": "stack"})
    for label in labels:
        vals = table[label].clip(lower=0.0).fillna(0.0)
        fig.add_trace(go.Bar(x=[esc(r) for r in table.index], y=vals.to_numpy(), name=esc(label),
                             marker_color=PHASE_COLOURS.get(label, "#8c564b")))
    fig.update_layout(title={"text": "mean step time per phase (s)"}, yaxis_title="seconds")
    head = "".join(f"<th>{esc(c)}</th>" for c in [*labels, "step"])
    body = ""
    for run, row in table.iterrows():
        cells = ""
        for c in [*labels, "step"]:
            v = row[c]
            share = f" ({100 * v / row['step']:.0f}%)" if c != "step" and row["step"] and not math.isnan(v) else ""
            flag = ' class="warn" title="phases overlap: their sum exceeds the step time"' if c == "other" and v < 0 else ""
            cells += f"<td{flag}>{esc(fmt(v))}{esc(share)}</td>"
        body += f"<tr><th>{esc(run)}</th>{cells}</tr>"
    table_html = f'<table class="grid"><tr><th>run</th>{head}</tr>{body}</table>'
    if not checked:  # this machine's timings, compared to nothing: a table, no chart
        return ('<p class="note">No timing reference was evaluated here: these are this machine\'s '
                "timings (its load included), compared to nothing.</p>" + table_html)
    return charts.add(fig, height=320) + table_html


def throughput_table(runs: dict[str, pd.DataFrame], cpu: bool = False) -> pd.DataFrame:
    """Per run: median/mean of perf/throughput, timing_s/step and tokens/s (rows = runs).

    `cpu`: the runs used no GPU, so `perf/throughput` is tokens/s of the process, not per GPU.
    """
    unit = "tok/s, CPU" if cpu else "tok/s/GPU"
    out: dict[str, dict[str, float]] = {}
    for name, frame in runs.items():
        row: dict[str, float] = {}
        for key, label in (("perf/throughput", f"throughput ({unit})"), (STEP_TIME, "step time (s)")):
            s = frame[key].dropna() if key in frame.columns else pd.Series(dtype=float)
            row[f"median {label}"] = float(s.median()) if len(s) else math.nan
            row[f"mean {label}"] = float(s.mean()) if len(s) else math.nan
        if "perf/total_num_tokens" in frame.columns and STEP_TIME in frame.columns:
            tps = (frame["perf/total_num_tokens"] / frame[STEP_TIME]).replace([np.inf, -np.inf], np.nan).dropna()
            row["median tokens/s"] = float(tps.median()) if len(tps) else math.nan
        else:
            row["median tokens/s"] = math.nan
        if "perf/actor_train_tok_per_s" in frame.columns:
            row["median train tok/s"] = float(frame["perf/actor_train_tok_per_s"].median())
        out[run_label(name)] = row
    return pd.DataFrame.from_dict(out, orient="index")


def throughput_section(runs: dict[str, pd.DataFrame], cpu: bool) -> str:
    table = throughput_table(runs, cpu)
    if table.empty or table.isna().all().all():
        return '<p class="note">No throughput or step-time metrics logged.</p>'
    table = table.dropna(axis=1, how="all")
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    body = "".join(
        f"<tr><th>{esc(run)}</th>" + "".join(f"<td>{esc(fmt(v))}</td>" for v in row) + "</tr>"
        for run, row in table.iterrows()
    )
    if len(table) == 2:
        a, b = table.index
        ratio = table.loc[a] / table.loc[b]
        body += f'<tr class="ratio"><th>{esc(a)} / {esc(b)}</th>' + "".join(
            f"<td>{esc(fmt(v))}x</td>" for v in ratio) + "</tr>"
    return f'<table class="grid"><tr><th>run</th>{head}</tr>{body}</table>'
