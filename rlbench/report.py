"""Self-contained HTML parity report: verdicts, curves against references, step time, environment.

    from rlbench.report import render_report
    render_report("report.html", title="verl GRPO Qwen3-8B (mini)", runs={"colocated": frame},
                  results=results, env=env, provenance=prov, suite_meta=meta)

One file that opens offline: plotly.js is embedded once in the page head and every chart is a
`<div class="rlbench-chart">` drawn by `Plotly.newPlot` from JSON; the common plotly template is
embedded once too, so a chart costs only its data. The pieces, per suite x profile section:

- header with the overall verdict (fail > error > pass > skip) and the counts;
- verdict table (check id, run, metric, statistic, expected, actual, source, why, verdict);
- per checked metric, its curve per run (step on x) with the reference value as a dashed line
  and the accepted band `ref_band` shaded (only for statistics in the metric's own unit: not
  for ratio, slope, delta, steps_to_reach, no_nan);
- step-time partition: mean seconds per phase per run as stacked bars, from `timing_s/gen`,
  `timing_s/old_log_prob`, `timing_s/ref`, `timing_s/update_actor`, `timing_s/update_weights`,
  and "other" = mean(`timing_s/step` - sum of the phases), as in the Miles article's per-step
  partition. In fully-async runs phases overlap (the trainer waits while rollout runs), so the
  sum can exceed the step time: "other" is then negative, shown as 0 and flagged in the table;
- throughput table: median and mean of `perf/throughput` (tok/s/GPU), `timing_s/step`, and
  tokens/s = `perf/total_num_tokens` / `timing_s/step`, with the ratio when there are two runs;
- environment and provenance tables.

Curves longer than `MAX_POINTS` are downsampled for drawing: the steps are cut into
MAX_POINTS/2 buckets and each keeps its minimum and maximum, so spikes stay visible and a
10,000-step run stays a small file. Every string from the inputs is HTML-escaped.
`render_session_report` writes one file for a pytest session with a section per suite x profile.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from rlbench.results import CheckResult

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
# Environment keys shown first, in this order; the rest follow sorted.
_ENV_ORDER = ("arch", "device", "gpu_count", "num_gpus", "rocm", "cuda", "torch", "transformers",
              "engines", "aiter", "aiter_flags", "commit", "seeds", "seed", "python", "platform")
_VERDICT_ORDER = ("fail", "error", "pass", "skip")
_TEMPLATE = "plotly_white"
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


@dataclass
class ReportSection:
    """One suite x profile: its runs (frames by run name), check results, environment."""

    title: str
    runs: dict[str, pd.DataFrame]
    results: list[CheckResult]
    env: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None
    suite_meta: dict[str, Any] | None = None


# ------------------------------------------------------------------ small helpers


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if abs(x) >= 1000:
        return f"{x:,.1f}"
    return f"{x:.4g}"


def overall_verdict(results: Iterable[CheckResult]) -> str:
    """fail if any check failed, else error if any errored, else pass if any passed, else skip."""
    verdicts = {r.verdict for r in results}
    for v in _VERDICT_ORDER:
        if v in verdicts:
            return v
    return "none"


def _counts(results: list[CheckResult]) -> str:
    parts = [f"{sum(r.verdict == v for r in results)} {v}" for v in ("pass", "fail", "error", "skip")]
    return ", ".join(parts)


def _badge(verdict: str) -> str:
    label = {"none": "NO CHECKS"}.get(verdict, verdict.upper())
    return f'<span class="badge v-{_e(verdict)}">{_e(label)}</span>'


def _run_label(name: str) -> str:
    return name or "run"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(_flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            rows.append((name, ", ".join(str(v) for v in value)))
        else:
            rows.append((name, "—" if value is None else str(value)))
    return rows


def _kv_table(d: Mapping[str, Any], order: tuple[str, ...] = ()) -> str:
    rank = {k: i for i, k in enumerate(order)}
    top = sorted(d, key=lambda k: (rank.get(k, len(order)), str(k)))
    rows = _flatten({k: d[k] for k in top})
    if not rows:
        return '<p class="note">none recorded</p>'
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


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


class _Charts:
    """Collects chart divs and their figure JSON; one counter per page keeps div ids unique."""

    def __init__(self) -> None:
        self.count = 0
        self.scripts: list[str] = []

    def add(self, fig: go.Figure, height: int = 360) -> str:
        self.count += 1
        div_id = f"rlbench-chart-{self.count}"
        fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 50, "b": 50})
        spec = fig.to_plotly_json()
        spec["layout"].pop("template", None)  # the page sets the template once
        payload = pio.to_json({"data": spec["data"], "layout": spec["layout"]}, validate=False)
        self.scripts.append(f'draw("{div_id}", {_script_safe(payload)});')
        return f'<div id="{div_id}" class="rlbench-chart" style="height:{height}px"></div>'


def _script_safe(payload: str) -> str:
    """JSON that cannot close the surrounding <script> element."""
    return payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _in_metric_unit(statistic: str) -> bool:
    return not statistic.startswith(_NOT_IN_METRIC_UNIT)


def _metric_chart(metric: str, runs: dict[str, pd.DataFrame], results: list[CheckResult], charts: _Charts) -> str:
    fig = go.Figure(layout={"template": _TEMPLATE})
    lo, hi = math.inf, -math.inf
    for i, (name, frame) in enumerate(runs.items()):
        if metric not in frame.columns:
            continue
        x, y = downsample(frame.index.to_numpy(dtype=np.int64), frame[metric].to_numpy(dtype=np.float64))
        if len(y):
            lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers" if len(y) < 60 else "lines",
                                 name=_e(_run_label(name)), line={"color": _PALETTE[i % len(_PALETTE)]}))
    if not fig.data:
        return f'<p class="note">No run logged <code>{_e(metric)}</code>: no chart.</p>'
    refs = [r for r in results if _in_metric_unit(r.statistic)]
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
                fig.add_hrect(y0=b0, y1=b1, fillcolor="#2ca02c", opacity=0.12, line_width=0)
        if r.ref_value is not None and math.isfinite(r.ref_value) and ("ref", r.ref_value, 0.0) not in seen:
            seen.add(("ref", r.ref_value, 0.0))
            fig.add_hline(y=r.ref_value, line_dash="dash", line_color="#444",
                          annotation_text=_e(f"ref {_fmt(r.ref_value)} ({r.statistic})"),
                          annotation_position="top left")
    fig.update_layout(title={"text": _e(metric)}, xaxis_title="step", yaxis_title=_e(metric),
                      legend={"orientation": "h", "y": -0.2})
    return charts.add(fig)


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
        out[_run_label(name)] = phases
    return pd.DataFrame.from_dict(out, orient="index")


def _partition_section(runs: dict[str, pd.DataFrame], charts: _Charts) -> str:
    table = partition_table(runs)
    if table.empty:
        return (f'<p class="note">No run logged <code>{STEP_TIME}</code> with per-phase timings: '
                "no step-time partition.</p>")
    labels = [c for c in table.columns if c != "step"]
    fig = go.Figure(layout={"template": _TEMPLATE, "barmode": "stack"})
    for i, label in enumerate(labels):
        vals = table[label].clip(lower=0.0).fillna(0.0)
        fig.add_trace(go.Bar(x=[_e(r) for r in table.index], y=vals.to_numpy(), name=_e(label),
                             marker_color=_PALETTE[i % len(_PALETTE)] if label != "other" else "#bbbbbb"))
    fig.update_layout(title={"text": "mean step time per phase (s)"}, yaxis_title="seconds")
    head = "".join(f"<th>{_e(c)}</th>" for c in [*labels, "step"])
    body = ""
    for run, row in table.iterrows():
        cells = ""
        for c in [*labels, "step"]:
            v = row[c]
            share = f" ({100 * v / row['step']:.0f}%)" if c != "step" and row["step"] and not math.isnan(v) else ""
            flag = ' class="warn" title="phases overlap: their sum exceeds the step time"' if c == "other" and v < 0 else ""
            cells += f"<td{flag}>{_e(_fmt(v))}{_e(share)}</td>"
        body += f"<tr><th>{_e(run)}</th>{cells}</tr>"
    return charts.add(fig, height=320) + f'<table class="grid"><tr><th>run</th>{head}</tr>{body}</table>'


def throughput_table(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per run: median/mean of perf/throughput, timing_s/step and tokens/s (rows = runs)."""
    out: dict[str, dict[str, float]] = {}
    for name, frame in runs.items():
        row: dict[str, float] = {}
        for key, label in (("perf/throughput", "throughput (tok/s/GPU)"), (STEP_TIME, "step time (s)")):
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
        out[_run_label(name)] = row
    return pd.DataFrame.from_dict(out, orient="index")


def _throughput_section(runs: dict[str, pd.DataFrame]) -> str:
    table = throughput_table(runs)
    if table.empty or table.isna().all().all():
        return '<p class="note">No throughput or step-time metrics logged.</p>'
    table = table.dropna(axis=1, how="all")
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = "".join(
        f"<tr><th>{_e(run)}</th>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in row) + "</tr>"
        for run, row in table.iterrows()
    )
    if len(table) == 2:
        a, b = table.index
        ratio = table.loc[a] / table.loc[b]
        body += f'<tr class="ratio"><th>{_e(a)} / {_e(b)}</th>' + "".join(
            f"<td>{_e(_fmt(v))}x</td>" for v in ratio) + "</tr>"
    return f'<table class="grid"><tr><th>run</th>{head}</tr>{body}</table>'


# ------------------------------------------------------------------ sections and page


def _verdict_table(results: list[CheckResult]) -> str:
    if not results:
        return '<p class="note">No checks were evaluated.</p>'
    cols = ("check id", "run", "metric", "statistic", "expected", "actual", "source", "why", "verdict")
    head = "".join(f"<th>{c}</th>" for c in cols)
    rows = []
    for r in results:
        msg = f'<div class="msg">{_e(r.message)}</div>' if r.message and r.verdict != "pass" else ""
        cells = (r.check_id, _run_label(r.run) if r.run else "", r.metric, r.statistic, r.expected,
                 _fmt(r.actual), r.source, r.why)
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        rows.append(f'<tr class="row-{_e(r.verdict)}">{tds}<td>{_badge(r.verdict)}{msg}</td></tr>')
    return f'<table class="grid verdicts"><tr>{head}</tr>{"".join(rows)}</table>'


def _section_html(section: ReportSection, charts: _Charts, anchor: str, heading: bool = True) -> str:
    verdict = overall_verdict(section.results)
    parts = [f'<section id="{anchor}">']
    if heading:  # a session report titles each suite x profile; a single report has the page title
        parts += [f"<h2>{_e(section.title)} {_badge(verdict)}</h2>",
                  f'<p class="counts">{_e(_counts(section.results))}</p>']
    if section.suite_meta:
        parts.append("<h3>Suite</h3>" + _kv_table(section.suite_meta, ("name", "title", "source", "profile")))
    parts.append("<h3>Verdicts</h3>" + _verdict_table(section.results))
    metrics: dict[str, list[CheckResult]] = {}
    for r in section.results:
        metrics.setdefault(r.metric, []).append(r)
    if metrics:
        parts.append("<h3>Checked metrics</h3>")
        parts.extend(_metric_chart(m, section.runs, rs, charts) for m, rs in metrics.items())
    parts.append("<h3>Step-time partition</h3>" + _partition_section(section.runs, charts))
    parts.append("<h3>Throughput</h3>" + _throughput_section(section.runs))
    parts.append("<h3>Environment</h3>" + _kv_table(section.env, _ENV_ORDER))
    if section.provenance is not None:
        parts.append("<h3>Provenance</h3>" + _kv_table(section.provenance))
    parts.append("</section>")
    return "\n".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328}
h1{margin-bottom:4px} h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
table.kv th{background:#f6f8fa;font-weight:600}
table.grid tr:first-child th{background:#f6f8fa}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff}
.v-pass{background:#1a7f37}.v-fail{background:#cf222e}.v-error{background:#bc4c00}
.v-skip,.v-none{background:#6e7781}
tr.row-pass td{background:#f0fff4} tr.row-fail td{background:#ffebe9}
tr.row-error td{background:#fff1e5} tr.row-skip td{color:#57606a}
td.warn{background:#fff8c5} tr.ratio th,tr.ratio td{font-style:italic}
.msg{font-size:12px;margin-top:4px;color:#57606a}.note{color:#57606a}.counts{color:#57606a}
.rlbench-chart{width:100%;max-width:1100px}
"""

_DRAW_JS = """
function draw(id, fig) {
  fig.layout.template = RLBENCH_TEMPLATE;
  Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});
}
"""


def _page(title: str, body: str, charts: _Charts) -> str:
    template = json.dumps(pio.templates[_TEMPLATE].to_plotly_json(), cls=PlotlyJSONEncoder)
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style>\n"
        f"<script>{get_plotlyjs()}</script>\n"
        f"<script>const RLBENCH_TEMPLATE = {_script_safe(template)};{_DRAW_JS}</script>\n"
        f"</head><body>\n{body}\n<p class=\"note\">Generated {generated} by rlbench.</p>\n"
        f"<script>\n{chr(10).join(charts.scripts)}\n</script>\n</body></html>\n"
    )


def _write(out_path: str | Path, text: str) -> Path:
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def render_report(
    out_path: str | Path,
    *,
    title: str,
    runs: dict[str, pd.DataFrame],
    results: list[CheckResult],
    env: dict[str, Any],
    provenance: dict[str, Any] | None = None,
    suite_meta: dict[str, Any] | None = None,
) -> Path:
    """Write the report of one suite x profile to `out_path` (one HTML file) and return its path."""
    section = ReportSection(title=title, runs=runs, results=results, env=env,
                            provenance=provenance, suite_meta=suite_meta)
    charts = _Charts()
    verdict = overall_verdict(results)
    header = (f"<h1>{_e(title)}</h1><p>Overall verdict: {_badge(verdict)} "
              f'<span class="counts">{_e(_counts(results))}</span></p>')
    body = header + _section_html(section, charts, "section-1", heading=False)
    return _write(out_path, _page(title, body, charts))


def render_session_report(
    out_path: str | Path, sections: list[ReportSection], *, title: str = "rlbench session report"
) -> Path:
    """Write one HTML file covering several suites x profiles (a section each) and return its path."""
    charts = _Charts()
    all_results = [r for s in sections for r in s.results]
    summary_rows = "".join(
        f'<tr><th><a href="#section-{i}">{_e(s.title)}</a></th><td>{_badge(overall_verdict(s.results))}</td>'
        f"<td>{_e(_counts(s.results))}</td></tr>"
        for i, s in enumerate(sections, start=1)
    )
    header = (f"<h1>{_e(title)}</h1><p>Overall verdict: {_badge(overall_verdict(all_results))} "
              f'<span class="counts">{_e(_counts(all_results))}</span></p>'
              f'<table class="grid"><tr><th>suite / profile</th><th>verdict</th><th>checks</th></tr>'
              f"{summary_rows}</table>")
    body = header + "\n".join(_section_html(s, charts, f"section-{i}") for i, s in enumerate(sections, start=1))
    return _write(out_path, _page(title, body, charts))

