"""Self-contained HTML parity report: verdicts, curves against references, step time, environment.

    from rlbench.report.html import render_report
    render_report("report.html", title="verl GRPO Qwen3-8B (mini)", runs={"colocated": frame},
                  results=results, env=env, provenance=prov, suite_meta=meta)

One file that opens offline: plotly.js is embedded once in the page head and every chart is a
`<div class="rlbench-chart">` drawn by `Plotly.newPlot` from JSON; the common plotly template is
embedded once too, so a chart costs only its data. The pieces, per suite x profile section:

- headline (rlbench/report/summary.py): how many published references (read off the articles)
  were compared here, how many golden values and sanity checks, and what could not be compared
  and why (references of other profiles, device- or arch-scoped ones, checks not evaluated); the
  badge is green PASS only when a published reference was compared and nothing failed;
- verdict table, verdict column first, fitted to the page width: failures, errors, then passes;
  skips and checks not evaluated folded below it, one line per reason; for an "every step in
  [lo, hi]" check the actual is the range seen (min, max), not the count of steps outside;
- runs: first and last logged step per run, flagged when a run starts late or ends early
  (against `suite_meta["steps"]`);
- validation accuracy (every `val-core/.../acc/...` metric), drawn whether a check reads it or
  not; then the curve of every other metric an evaluated check reads, with its band and a line
  per check (rlbench/report/charts.py); skipped checks get no chart;
- trends, when the run is recorded to a results store: each check's value over the store's last
  runs of the same suite, profile, modes and device, with its band (rlbench/report/trends.py);
- validation samples: each run's answers at its last sampled validation step, with the images
  the model saw (`samples/step_K.jsonl` of `trainer.log_val_generations`, trainer/components/val_samples.py);
- step-time partition and throughput (tok/s/GPU, or tok/s on a CPU run): bars only when a timing
  reference was evaluated, else a table marked as this machine's timings, compared to nothing;
- suite, environment (with the tool sandbox's layers in force, from each run's env.json) and
  provenance tables.

Every string from the inputs is HTML-escaped. `render_session_report` writes one file for a
pytest session with a section per suite x profile, the profiles that could not run here (with
their reason) and pytest's item counts beside the report's own.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from rlbench.checks.results import CheckResult
from rlbench.report.charts import (
    TEMPLATE,
    TIMING_PREFIXES,
    Charts,
    downsample,
    esc,
    fmt,
    is_cpu,
    metric_chart,
    partition_section,
    partition_table,
    run_label,
    script_safe,
    throughput_section,
    throughput_table,
    validation_metrics,
)
from rlbench.report.summary import Tally, badge, counts_text, headline_html, status_of, verdict_rows_html
from rlbench.report.trends import Trends, trends_html

__all__ = ["ReportSection", "UnrunProfile", "actual_text", "downsample", "overall_verdict", "partition_table",
           "render_report", "render_session_report", "runs_table", "throughput_table"]

# Environment keys shown first, in this order; the rest follow sorted.
_ENV_ORDER = ("arch", "device", "gpu_count", "num_gpus", "rocm", "cuda", "torch", "transformers",
              "engines", "aiter", "aiter_flags", "commit", "seeds", "seed", "python", "platform")
_VERDICT_ORDER = ("fail", "error", "pass", "skip")


@dataclass
class ReportSection:
    """One suite x profile: its runs (frames by run name), check results, environment."""

    title: str
    runs: dict[str, pd.DataFrame]
    results: list[CheckResult]
    env: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None
    suite_meta: dict[str, Any] | None = None
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run name -> validation samples
    trends: Trends | None = None  # the results store's earlier runs (rlbench/report/trends.py); None: no store


# ------------------------------------------------------------------ small helpers


def overall_verdict(results: Iterable[CheckResult]) -> str:
    """fail if any check failed, else not_evaluated (or any verdict this module does not know), else
    error, else pass, else skip; "none" without results."""
    verdicts = {r.verdict for r in results}
    if "fail" in verdicts:
        return "fail"
    other = sorted(verdicts - set(_VERDICT_ORDER))
    if other:
        return other[0]
    for v in _VERDICT_ORDER[1:]:
        if v in verdicts:
            return v
    return "none"


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
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


# ------------------------------------------------------------------ sections and page


def actual_text(r: CheckResult, runs: Mapping[str, pd.DataFrame]) -> str:
    """The value a reader compares with `expected`: for an every-step band check, the range seen."""
    if r.statistic == "every step" and r.verdict in ("pass", "fail"):
        frame = runs.get(r.run) if r.run in runs else (next(iter(runs.values())) if len(runs) == 1 else None)
        if frame is not None and r.metric in frame.columns:
            s = pd.to_numeric(frame[r.metric], errors="coerce")
            if r.steps:
                s = s[s.index.isin(r.steps)]
            s = s.dropna()
            if len(s):
                outside = f", {fmt(r.actual)} steps outside" if r.actual else ""
                return f"min {fmt(float(s.min()))}, max {fmt(float(s.max()))}{outside}"
        return f"{fmt(r.actual)} steps outside"
    if r.actual is None and r.verdict in ("fail", "error"):
        return "never reached" if r.statistic.startswith("steps_to_reach") else "undefined"
    return fmt(r.actual)


_VALIDATION_ONLY = ("val-", "timing_s/testing")  # what a validation pass logs (step 0 included)


def runs_table(runs: dict[str, pd.DataFrame], expected_steps: int | None, profile_steps: int | None = None) -> str:
    """Per run: first and last training step, steps logged; a late start, an early end, gaps and a
    run cut short by an override (`expected_steps` < `profile_steps`) are flagged."""
    if not runs:
        return '<p class="note">No run.</p>'
    rows = ""
    for name, frame in runs.items():
        train = [c for c in frame.columns if not str(c).startswith(_VALIDATION_ONLY)]
        tsteps = frame[train].dropna(how="all").index.to_numpy() if train else frame.index.to_numpy()
        if len(tsteps) == 0:
            rows += f'<tr><th>{esc(run_label(name))}</th><td colspan="4" class="warn">no training steps logged</td></tr>'
            continue
        first, last = int(tsteps.min()), int(tsteps.max())
        notes = []
        if first > 1:
            notes.append(f"starts late: first training step {first} (steps 1-{first - 1} missing)")
        if expected_steps is not None and last < expected_steps:
            notes.append(f"ends early: last step {last} of {expected_steps}")
        if len(tsteps) < last - first + 1:
            notes.append(f"gaps: {last - first + 1 - len(tsteps)} steps missing inside")
        if expected_steps is not None and profile_steps is not None and expected_steps < profile_steps:
            notes.append(f"cut to {expected_steps} steps by an override (the profile runs {profile_steps})")
        note = "; ".join(notes) or "complete"
        cls = ' class="warn"' if notes else ""
        total = f"{last} of {expected_steps}" if expected_steps is not None else str(last)
        rows += (f"<tr><th>{esc(run_label(name))}</th><td>{first}</td><td>{esc(total)}</td><td>{len(tsteps)}</td>"
                 f"<td{cls}>{esc(note)}</td></tr>")
    return ('<table class="grid runs"><tr><th>run</th><th>first step</th><th>last step</th><th>steps logged</th>'
            f"<th>coverage</th></tr>{rows}</table>")


def _meta_int(section: ReportSection, key: str) -> int | None:
    v = (section.suite_meta or {}).get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def samples_html(samples: Mapping[str, list[dict[str, Any]]], limit: int = 6) -> str:
    """A table per run of what the model answered at its last sampled validation step, with the images it saw."""
    out = []
    for run, records in samples.items():
        if not records:
            continue
        rows = "".join(
            "<tr><td>" + "".join(f'<img alt="prompt image" src="data:image/png;base64,{esc(b)}">'
                                 for b in r.get("images") or []) + "</td>"
            f"<td><code>{esc(str(r.get('response', '')))}</code></td><td>{esc(str(r.get('ground_truth', '')))}</td>"
            f"<td>{esc(str(r.get('score', '')))}</td></tr>"
            for r in records[:limit])
        out.append(f'<p class="caption">{esc(run)}: step {esc(str(records[0].get("step", "?")))}, '
                   f"first {min(limit, len(records))} of {len(records)} samples</p>"
                   '<table class="grid samples"><tr><th>image</th><th>answer</th><th>ground truth</th>'
                   f"<th>score</th></tr>{rows}</table>")
    return "".join(out)


def _section_html(section: ReportSection, charts: Charts, anchor: str, heading: bool = True) -> str:
    tally = Tally.of(section.results)
    parts = [f'<section id="{anchor}">']
    if heading:  # a session report titles each suite x profile; a single report has the page title
        parts += [f"<h2>{esc(section.title)} {badge(tally.verdict(), overall=True)}</h2>",
                  headline_html(tally, profile=(section.suite_meta or {}).get("profile"))]
    actual = lambda r: actual_text(r, section.runs)
    parts.append("<h3>Verdicts</h3>" + verdict_rows_html(section.results, actual))
    parts.append("<h3>Runs</h3>" + runs_table(section.runs, _meta_int(section, "steps"), _meta_int(section, "profile_steps")))
    evaluated = [r for r in section.results if status_of(r) != "skip"]
    val = validation_metrics(section.runs)
    val_results = [r for r in evaluated if r.metric in val]
    parts.append("<h3>Validation accuracy</h3>")
    if val:
        parts.extend(metric_chart([m], section.runs, [r for r in val_results if r.metric == m], charts,
                                   actual=actual, y_title="accuracy") for m in val)
    else:
        parts.append('<p class="note">No run logged a validation metric (<code>val-core/...</code>): set '
                     "<code>trainer.test_freq</code> and validation data to get this curve.</p>")
    if section.samples:
        parts.append("<h3>Validation samples</h3>" + samples_html(section.samples))
    logged = {str(c) for f in section.runs.values() for c in f.columns}
    metrics: dict[str, list[CheckResult]] = {}
    for r in evaluated:  # a metric no run logged has no curve: its row or fold already says so
        if r.metric and r.metric not in val and r.metric in logged:
            metrics.setdefault(r.metric, []).append(r)
    if metrics:
        parts.append("<h3>Checked metrics</h3>")
        parts.extend(metric_chart([m], section.runs, rs, charts, actual=actual) for m, rs in metrics.items())
    if section.trends is not None:
        parts.append('<h3 class="trends-head">Trends</h3>' + trends_html(section.results, section.trends, charts))
    timing_checked = any(r.metric.startswith(TIMING_PREFIXES) for r in evaluated)
    cpu = is_cpu(section.env)
    parts.append("<h3>Step-time partition</h3>" + partition_section(section.runs, charts, timing_checked))
    parts.append("<h3>Throughput</h3>" + throughput_section(section.runs, cpu))
    if section.suite_meta:
        parts.append("<h3>Suite</h3>" + _kv_table(section.suite_meta, ("suite", "title", "profile", "steps")))
    parts.append("<h3>Environment</h3>" + _kv_table(section.env, _ENV_ORDER))
    if section.provenance is not None:
        parts.append("<h3>Provenance</h3>" + _kv_table(section.provenance))
    parts.append("</section>")
    return "\n".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px auto;padding:0 16px;
     max-width:1200px;color:#1f2328}
h1{margin-bottom:4px;font-size:24px} h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
table.kv th{background:#f6f8fa;font-weight:600}
table.grid tr:first-child th{background:#f6f8fa}
table.verdicts{width:100%;table-layout:fixed}
table.verdicts th.c-verdict{width:7.5em} table.verdicts th.c-check{width:36%} table.verdicts th.c-kind{width:7.5em}
table.verdicts th.c-run{width:6.5em} table.verdicts th.c-actual{width:9em}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff}
.v-pass{background:#1a7f37}.v-fail{background:#cf222e}.v-error{background:#bc4c00}
.v-partial{background:#0969da}.v-not_evaluated{background:#8250df}
.v-skip,.v-none{background:#6e7781}
tr.row-pass td{background:#f0fff4} tr.row-fail td{background:#ffebe9}
tr.row-error td{background:#fff1e5} tr.row-not_evaluated td{background:#fbefff}
td.warn{background:#fff8c5} tr.ratio th,tr.ratio td{font-style:italic}
.msg{font-size:12px;margin-top:4px;color:#57606a}.src{font-size:11px;margin-top:4px;color:#57606a}
.note{color:#57606a} .msg.warn{color:#9a6700}
.headline{border:1px solid #d0d7de;border-radius:6px;padding:8px 16px;background:#f6f8fa;margin:8px 0 16px}
.headline ul{margin:4px 0;padding-left:20px} .headline li{margin:2px 0}
.verdict-line{margin:4px 0;font-size:16px}
details.fold{margin:4px 0;font-size:13px} details.fold summary{cursor:pointer}
details.fold ul{margin:4px 0 8px;columns:2}
.rlbench-chart{width:100%} ul.caption{list-style:none;padding:0;margin:12px 0 0;font-size:13px}
ul.caption li{margin:2px 0} p.caption{margin:12px 0 0;font-size:13px}
.trends{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:8px 16px}
.trend{min-width:0;border:1px solid #d0d7de;border-radius:6px;padding:4px 8px}
p.trend-title{margin:2px 0;font-size:12px;overflow-wrap:anywhere} p.trend-sub{margin:0;font-size:11px;color:#57606a}
"""

_DRAW_JS = """
function draw(id, fig) {
  fig.layout.template = RLBENCH_TEMPLATE;
  Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});
}
"""


def _page(title: str, body: str, charts: Charts) -> str:
    template = json.dumps(pio.templates[TEMPLATE].to_plotly_json(), cls=PlotlyJSONEncoder)
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style>\n"
        f"<script>{get_plotlyjs()}</script>\n"
        f"<script>const RLBENCH_TEMPLATE = {script_safe(template)};{_DRAW_JS}</script>\n"
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
    samples: dict[str, list[dict[str, Any]]] | None = None,
    trends: Trends | None = None,
) -> Path:
    """Write the report of one suite x profile to `out_path` (one HTML file) and return its path.
    `trends`: the results store's earlier runs, for a trend chart per check (rlbench/report/trends.py)."""
    section = ReportSection(title=title, runs=runs, results=results, env=env, provenance=provenance,
                            suite_meta=suite_meta, samples=dict(samples or {}), trends=trends)
    charts = Charts()
    header = f"<h1>{esc(title)}</h1>" + headline_html(Tally.of(results), profile=(suite_meta or {}).get("profile"))
    body = header + _section_html(section, charts, "section-1", heading=False)
    return _write(out_path, _page(title, body, charts))


@dataclass
class UnrunProfile:
    """A suite x profile that could not run here: its title, why, and how many checks it has."""

    title: str
    reason: str
    checks: int


def render_session_report(
    out_path: str | Path, sections: list[ReportSection], *, title: str = "rlbench session report",
    unrun: list[UnrunProfile] | None = None, items: dict[str, int] | None = None,
) -> Path:
    """Write one HTML file covering several suites x profiles (a section each) and return its path.

    `unrun`: profiles that could not run here (listed in the headline with their reason);
    `items`: the session's test-item outcome counts (pytest's), shown beside the report's own.
    """
    charts = Charts()
    unrun = list(unrun or [])
    all_results = [r for s in sections for r in s.results]
    summary_rows = "".join(
        f'<tr><td>{badge(Tally.of(s.results).verdict(), overall=True)}</td><th><a href="#section-{i}">{esc(s.title)}</a></th>'
        f"<td>{esc(counts_text(s.results))}</td></tr>"
        for i, s in enumerate(sections, start=1)
    )
    summary_rows += "".join(
        f'<tr><td>{badge("skip")}</td><th>{esc(u.title)}</th><td>{u.checks} checks not run: {esc(u.reason)}</td></tr>'
        for u in unrun)
    header = (f"<h1>{esc(title)}</h1>"
              + headline_html(Tally.of(all_results), unrun=[(u.title, u.reason, u.checks) for u in unrun],
                              items=items)
              + '<table class="grid verdicts summary"><tr><th class="c-verdict">verdict</th><th>suite / profile</th>'
              f"<th>checks</th></tr>{summary_rows}</table>")
    body = header + "\n".join(_section_html(s, charts, f"section-{i}") for i, s in enumerate(sections, start=1))
    return _write(out_path, _page(title, body, charts))
