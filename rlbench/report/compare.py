"""Two runs, or two sets of seeds, side by side: both verdicts per check, throughput as a ratio, and for
accuracy-like metrics the difference of the means with a Welch 95% interval over seeds; the curves of
each checked metric overlaid on one HTML page.

    rlbench compare runs/a/SUITE/cpu runs/b/SUITE/cpu                  # two run folders (checks.json)
    rlbench compare seedsA/ seedsB/ --suite SUITE --profile mini --arch sm_90 --device H200 --out cmp.html
    rlbench compare mi300x/ h20/ --suite SUITE --profile full --arch gfx942 --device MI300X \
        --arch-b sm_90 --device-b H20          # two boards: each side checked against its own references

A side is a run folder (`checks.json` as `rlbench run` / `rlbench check` write it: its seeds, and
the logs it read), a folder of logs (`<mode>.jsonl`, `<mode>_metrics.jsonl` or `<mode>/metrics.jsonl`,
checked here against `--suite` / `--profile`, each as a run of the steps it logged), or a folder
whose sub-folders are such: one seed each. A side may also be an MLflow run the results store wrote,
`mlflow:TRACKING_URI#RUN_ID[/MODE]` (several seeds: `#ID1,ID2`), as `rlbench check` reads it
(rlbench/ingest/mlflow_run.py): its steps (`get_metric_history`) and its checks (`check.*` tags and
metrics); a run another tool logged has no checks, and is checked here against `--suite` / `--profile`.

    rlbench compare mlflow:http://mlflow:5000#0a1b2c mlflow:http://mlflow:5000#3d4e5f,6a7b8c --out cmp.html

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

import numpy as np
import pandas as pd

from rlbench.checks.results import CheckResult
from rlbench.ingest.load import load_metrics
from rlbench.ingest.mlflow_run import is_mlflow_locator, parse_locator, read_stored_run
from rlbench.report.charts import Charts, esc, fmt, metric_chart
from rlbench.report.summary import badge
from rlbench.store.sqlite import CheckRow
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
    checked_as: str = ""  # "arch gfx942, device MI300X" when its logs were checked here against a suite


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
    if suite is None or profile is None:
        raise ConfigError(f"{folder}: holds logs and no checks.json; give --suite and --profile to check them")
    return _evaluate_frames(folder.name, {m: load_metrics(p).frame for m, p in logs.items()}, suite, profile,
                            arch, device)


def _evaluate_frames(label: str, frames: dict[str, pd.DataFrame], suite: Suite, profile: str, arch: str,
                     device: str) -> SeedRun:
    from rlbench.checks.evaluate import evaluate

    # Each log is checked as a run of the steps it has (logs trained with their own total_steps):
    # a mode's checks on that mode's log alone, the checks across modes (ratios) on all of them.
    results = [r for m, f in frames.items() for r in evaluate(suite, profile, {m: f}, arch=arch, device_name=device,
                                                              steps=int(f.index.max())) if r.run == m]
    results += [r for r in evaluate(suite, profile, frames, arch=arch, device_name=device) if "/" in r.run]
    return SeedRun(label, frames, results)


def check_result(c: CheckRow) -> CheckResult:
    """A check as the store wrote it, as a result: the statistic is the check id's part after the metric."""
    band = (c.lo if c.lo is not None else -math.inf, c.hi if c.hi is not None else math.inf)
    return CheckResult(c.check_id, c.verdict, c.metric, c.check_id.partition(":")[2], "", c.value, "", "",  # type: ignore[arg-type]
                       message=c.message, run=c.mode, ref_value=c.ref_value,
                       ref_band=band if c.lo is not None or c.hi is not None else None)


def _from_mlflow(locator: str, suite: Suite | None, profile: str | None, arch: str, device: str) -> list[SeedRun]:
    """`mlflow:URI#RUN_ID[,RUN_ID...][/MODE]`: one seed run per MLflow run id, its steps and stored checks;
    a run with no stored check (logged by another tool) is checked here against --suite / --profile, as
    the profile's only mode."""
    uri, ids, mode = parse_locator(locator)
    runs = []
    for run_id in [i for i in ids.split(",") if i]:
        one = f"mlflow:{uri}#{run_id}" + (f"/{mode}" if mode else "")
        got = read_stored_run(one)
        label = run_id[:7] + (f" seed {got.record.seed}" if got.record.seed is not None else "")
        if got.checks:
            runs.append(SeedRun(label, got.frames, [check_result(c) for c in got.checks.values()]))
            continue
        if suite is None or profile is None:
            raise ConfigError(f"{one}: a run with no rlbench checks; give --suite and --profile to check it")
        if "" in got.frames:  # another tool's run: it is the profile's only mode
            modes = suite.profile(profile).modes
            if len(modes) != 1:
                raise ConfigError(f"{one}: a run with no rlbench checks, and profile {profile} runs "
                                  f"{', '.join(modes)}: compare runs the results store wrote (rlbench check "
                                  "--run MODE=... --store mlflow:...), which know their modes")
            got.frames = {modes[0]: got.frames[""]}
        run = _evaluate_frames(locator, got.frames, suite, profile, arch, device)
        runs.append(SeedRun(label, run.frames, run.results))
    return runs


def load_side(path: str | Path, name: str, *, suite: Suite | None = None, profile: str | None = None,
              arch: str = "cpu", device: str = "") -> Side:
    """One side of a comparison (see module docstring); a one-line ConfigError when nothing is there."""
    if is_mlflow_locator(path):
        return Side(name, _from_mlflow(str(path), suite, profile, arch, device))
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
            side.checked_as = f"arch {arch}" + (f", device {device}" if device else "")
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
            tag, rs = ("A", per[0]) if not va else ("B", per[1])
            evaluated = [r for r in rs if r is not None and r.verdict != "skip"]
            stmt = f"n/a (no value on {tag})" if evaluated else f"n/a (not evaluated on {tag}: not its arch or board)"
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
    head = [f"{tag}: {s.name} ({len(s.runs)} run(s): {', '.join(r.label for r in s.runs)})"
            + (f"; checked as {s.checked_as}" if s.checked_as else "") for tag, s in (("A", a), ("B", b))]
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
            "<p>" + "<br>".join(f"<b>{tag}</b>: {esc(s.name)}: {esc(', '.join(r.label for r in s.runs))}"
                                + (f" (checked as {esc(s.checked_as)})" if s.checked_as else "")
                                for tag, s in (("A", a), ("B", b))) + "</p>",
            ("<p class=\"note\">Speed-like metrics: ratio of the means B/A. Others: B-A of the means with a Welch 95% "
             "interval over seeds (t with Welch-Satterthwaite degrees of freedom; needs 2 seeds a side).</p>"),
            ("<table><thead><tr><th>check</th><th>A verdicts</th><th>A mean</th><th>B verdicts</th><th>B mean</th>"
             f"<th>B vs A</th></tr></thead><tbody>{table}</tbody></table>"), "<h2>Curves</h2>"]
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


def side_name(path: str) -> str:
    """A side's default name: its folder's name, or an MLflow locator's run ids."""
    if is_mlflow_locator(path):
        return path.rpartition("#")[2]
    return Path(path).name or str(path)

