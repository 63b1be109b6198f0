"""Two runs, or two sets of seeds, side by side: both verdicts per check, throughput as a ratio, and for
accuracy-like metrics the difference of the means with a Welch 95% interval over seeds; the curves of
each checked metric overlaid on one HTML page.

    rlbench compare runs/a/SUITE/cpu runs/b/SUITE/cpu                  # two run folders (checks.json)
    rlbench compare seedsA/ seedsB/ --suite SUITE --profile mini --arch sm_90 --device H200 --out cmp.html

A side is a run folder (`checks.json` as `rlbench run` / `rlbench check` write it: its seeds, and
the logs it read), a folder of logs (`<mode>.jsonl`, `<mode>_metrics.jsonl` or `<mode>/metrics.jsonl`,
checked here against `--suite` / `--profile`, each as a run of the steps it logged), or a folder
whose sub-folders are such: one seed each.

Speed-like metrics (`perf/`, `timing_s/`, `memory/`) are compared as the ratio of the means B / A.
Everything else (accuracy, reward, KL, loss) as the difference of the means B - A with a Welch
interval: a t interval with Welch-Satterthwaite degrees of freedom (`scipy.stats.ttest_ind`,
`equal_var=False`), chosen over a bootstrap because a side has a handful of seeds, too few for a
bootstrap's resamples to mean much; it needs >= 2 seeds per side, else it says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlbench.checks.results import CheckResult
from rlbench.ingest.load import load_metrics
from rlbench.report.charts import Charts, esc, fmt, metric_chart
from rlbench.report.summary import badge
from rlbench.suites.suite import MODE_NAMES, Suite
from trainer.errors import ConfigError

SPEED_PREFIXES = ("perf/", "timing_s/", "memory/")
_FIELDS = {f.name for f in dataclasses.fields(CheckResult)}


@dataclass
class SeedRun:
    label: str
    frames: dict[str, pd.DataFrame]  # mode -> metrics
    results: list[CheckResult]


@dataclass
class Side:
    name: str
    runs: list[SeedRun] = field(default_factory=list)


@dataclass
class Row:
    check_id: str
    metric: str
    kind: str  # "speed" | "accuracy"
    verdicts: tuple[str, str]  # "pass 2/2" per side
    values: tuple[list[float], list[float]]
    statement: str  # ratio or difference with its interval


# ---------------------------------------------------------------------------- loading
def _log_files(folder: Path) -> dict[str, Path]:
    out = {}
    for mode in MODE_NAMES:
        for cand in (folder / f"{mode}.jsonl", folder / f"{mode}_metrics.jsonl", folder / mode / "metrics.jsonl"):
            if cand.is_file():
                out[mode] = cand
                break
    return out


def _from_checks(folder: Path) -> list[SeedRun]:
    doc = json.loads((folder / "checks.json").read_text())
    logs = (doc.get("provenance") or {}).get("logs") or {}
    by_seed: dict[int, list[CheckResult]] = {}
    for r in doc.get("results", []):
        kw = {k: v for k, v in r.items() if k in _FIELDS}
        if kw.get("ref_band") is not None:
            kw["ref_band"] = tuple(kw["ref_band"])
        by_seed.setdefault(int(r.get("seed", 0)), []).append(CheckResult(**kw))
    runs = []
    for seed, results in sorted(by_seed.items()):
        paths = {m: Path(p) for m, p in logs.items()} if logs else {}
        if not paths:
            for m in MODE_NAMES:
                for cand in (folder / m / f"seed{seed}" / "metrics.jsonl", folder / m / "metrics.jsonl"):
                    if cand.is_file():
                        paths[m] = cand
                        break
        frames = {m: load_metrics(p).frame for m, p in paths.items() if p.is_file()}
        label = folder.name + (f" seed {seed}" if len(by_seed) > 1 else "")
        runs.append(SeedRun(label, frames, results))
    return runs


def _from_logs(folder: Path, logs: dict[str, Path], suite: Suite | None, profile: str | None, arch: str,
               device: str) -> SeedRun:
    from rlbench.checks.evaluate import evaluate

    if suite is None or profile is None:
        raise ConfigError(f"{folder}: holds logs and no checks.json; give --suite and --profile to check them")
    frames = {m: load_metrics(p).frame for m, p in logs.items()}
    # Each log is checked as a run of the steps it has (logs trained with their own total_steps):
    # a mode's checks on that mode's log alone, the checks across modes (ratios) on all of them.
    results = [r for m, f in frames.items() for r in evaluate(suite, profile, {m: f}, arch=arch, device_name=device,
                                                              steps=int(f.index.max())) if r.run == m]
    results += [r for r in evaluate(suite, profile, frames, arch=arch, device_name=device) if "/" in r.run]
    return SeedRun(folder.name, frames, results)


def load_side(path: str | Path, name: str, *, suite: Suite | None = None, profile: str | None = None,
              arch: str = "cpu", device: str = "") -> Side:
    """One side of a comparison (see module docstring); a one-line ConfigError when nothing is there."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{p}: not a folder; give a run folder (with checks.json), a folder of logs, or a "
                          "folder of such folders (one per seed)")
    side = Side(name)
    folders = [p] if (p / "checks.json").is_file() or _log_files(p) else sorted(d for d in p.iterdir() if d.is_dir())
    for folder in folders:
        if (folder / "checks.json").is_file():
            side.runs += _from_checks(folder)
        elif logs := _log_files(folder):
            side.runs.append(_from_logs(folder, logs, suite, profile, arch, device))
    if not side.runs:
        raise ConfigError(f"{p}: no checks.json and no <mode>.jsonl / <mode>_metrics.jsonl / <mode>/metrics.jsonl "
                          "in it or its sub-folders; point at a run folder or a folder of logs")
    return side


# ---------------------------------------------------------------------------- statistics
def welch_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The `level` interval of mean(b) - mean(a) (Welch's t); None with fewer than 2 values a side or no spread."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2 or (np.var(a) == 0 and np.var(b) == 0):
        return None
    ci = stats.ttest_ind(b, a, equal_var=False).confidence_interval(level)
    return float(ci.low), float(ci.high)


def kind_of(metric: str) -> str:
    return "speed" if metric.startswith(SPEED_PREFIXES) else "accuracy"


def _verdicts(results: list[CheckResult | None]) -> str:
    got = [r.verdict for r in results if r is not None]
    if not got:
        return "-"
    c = Counter(got)
    return ", ".join(f"{v.replace('_', ' ')} {n}/{len(got)}" for v, n in c.most_common())


def compare_sides(a: Side, b: Side) -> list[Row]:
    """A row per check evaluated on either side, in the first side's order."""
    ids: dict[str, str] = {}
    for side in (a, b):
        for run in side.runs:
            for r in run.results:
                if r.verdict != "skip":
                    ids.setdefault(r.check_id, r.metric)
    rows = []
    for cid, metric in ids.items():
        per = [[next((r for r in run.results if r.check_id == cid), None) for run in s.runs] for s in (a, b)]
        vals = tuple([float(r.actual) for r in rs if r is not None and r.actual is not None
                      and math.isfinite(float(r.actual))] for rs in per)
        kind = kind_of(metric)
        va, vb = vals
        if not va or not vb:
            stmt = "n/a (no value on " + ("A" if not va else "B") + ")"
        elif kind == "speed":
            ma, mb = float(np.mean(va)), float(np.mean(vb))
            stmt = f"B/A = {mb / ma:.3f}x" if ma else "n/a (A is 0)"
        else:
            d = float(np.mean(vb) - np.mean(va))
            ci = welch_interval(va, vb)
            why = f"{len(va)} and {len(vb)} seeds" if min(len(va), len(vb)) < 2 else "no spread on either side"
            stmt = (f"B-A = {d:+.4g}, 95% Welch interval [{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci
                    else f"B-A = {d:+.4g} (no interval: {why})")
        rows.append(Row(cid, metric, kind, (_verdicts(per[0]), _verdicts(per[1])), (va, vb), stmt))
    return rows + throughput_rows(a, b)


def throughput_rows(a: Side, b: Side) -> list[Row]:
    """Median `perf/throughput` per mode of each run, B/A, for the modes both sides logged it in."""
    rows = []
    for mode in MODE_NAMES:
        vals = tuple([float(pd.to_numeric(r.frames[mode]["perf/throughput"], errors="coerce").median())
                      for r in s.runs if mode in r.frames and "perf/throughput" in r.frames[mode].columns]
                     for s in (a, b))
        if vals[0] and vals[1]:
            ratio = float(np.mean(vals[1]) / np.mean(vals[0]))
            rows.append(Row(f"perf/throughput:median@{mode}", "perf/throughput", "speed", ("not a check", "not a check"),
                            vals, f"B/A = {ratio:.3f}x"))
    return rows


# ---------------------------------------------------------------------------- output
def _mean(v: list[float]) -> str:
    return fmt(float(np.mean(v))) if v else "-"


def text_table(a: Side, b: Side, rows: list[Row]) -> str:
    head = [f"A: {a.name} ({len(a.runs)} run(s): {', '.join(r.label for r in a.runs)})",
            f"B: {b.name} ({len(b.runs)} run(s): {', '.join(r.label for r in b.runs)})"]
    lines = [f"{r.check_id}\n    A {r.verdicts[0]} (mean {_mean(r.values[0])}) | B {r.verdicts[1]} "
             f"(mean {_mean(r.values[1])}) | {r.statement}" for r in rows]
    return "\n".join(head + lines)


def render_compare(out: str | Path, a: Side, b: Side, rows: list[Row], title: str = "rlbench compare") -> Path:
    """The comparison page: the table, then each checked metric's curves of both sides overlaid."""
    from rlbench.report.html import _page, _write

    charts = Charts()
    table = "".join(
        f"<tr><td><code>{esc(r.check_id)}</code></td><td>{_badges(r.verdicts[0])}</td><td>{esc(_mean(r.values[0]))}"
        f"</td><td>{_badges(r.verdicts[1])}</td><td>{esc(_mean(r.values[1]))}</td><td>{esc(r.statement)}</td></tr>"
        for r in rows)
    body = [f"<h1>{esc(title)}</h1>",
            f"<p><b>A</b>: {esc(a.name)}: {esc(', '.join(r.label for r in a.runs))}<br><b>B</b>: {esc(b.name)}: "
            f"{esc(', '.join(r.label for r in b.runs))}</p>",
            "<p class=\"note\">Speed-like metrics: ratio of the means B/A. Others: B-A of the means with a Welch 95% "
            "interval over seeds (t with Welch-Satterthwaite degrees of freedom; needs 2 seeds a side).</p>",
            "<table><thead><tr><th>check</th><th>A verdicts</th><th>A mean</th><th>B verdicts</th><th>B mean</th>"
            f"<th>B vs A</th></tr></thead><tbody>{table}</tbody></table>", "<h2>Curves</h2>"]
    curves: dict[str, pd.DataFrame] = {}
    for tag, side in (("A", a), ("B", b)):
        for run in side.runs:
            for mode, frame in run.frames.items():
                curves[f"{tag}: {run.label} / {mode}"] = frame
    for metric in dict.fromkeys(r.metric for r in rows if r.metric):
        tagged = [dataclasses.replace(res, run=f"{tag}: {run.label}")
                  for tag, side in (("A", a), ("B", b)) for run in side.runs[:1] for res in run.results
                  if res.metric == metric and res.verdict != "skip"]
        body.append(metric_chart([metric], curves, tagged, charts, actual=lambda r: fmt(r.actual)))
    return _write(out, _page(title, "\n".join(body), charts))


def _badges(text: str) -> str:
    """'pass 2/2, fail 1/3' as verdict badges with their counts."""
    if text == "not a check":
        return esc(text)
    parts = [p.strip().rsplit(" ", 1) for p in text.split(",") if p.strip() and p.strip() != "-"]
    return " ".join(f"{badge(word.replace(' ', '_'))} {esc(count)}" for word, count in parts) or "-"


def load_pair(a: str, b: str, **kw: Any) -> tuple[Side, Side]:
    return load_side(a, Path(a).name or str(a), **kw), load_side(b, Path(b).name or str(b), **kw)
