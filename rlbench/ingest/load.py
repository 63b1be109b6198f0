"""Read a training log (verl, Miles, or the trainer's own) into one step x metric table.

    from rlbench.ingest.load import load_metrics
    log = load_metrics("run/metrics.jsonl")          # format detected from the content
    log.frame["actor/ppo_kl"]                          # float series indexed by step

Formats (`fmt=`):
- `verl-jsonl`: verl's file logger, one `{"step": N, "data": {...}}` per line; several lines may
  share a step (later keys win).
- `rlbench`: the trainer's `metrics.jsonl`, the same shape; a `"_meta"` key (run metadata, on its
  own line or beside `data`) marks it and is skipped.
- `verl-console`: verl's console logger, `step:12 - actor/ppo_kl:0.001 - ...`, with numpy/torch
  reprs (`np.float64(0.5)`, `tensor(0.5)`), Ray prefixes (`(TaskRunner pid=1) step:1 - ...`) and
  unrelated lines in between (ignored); step lines broken across physical lines at any width,
  or printed one item per line, are reassembled (`rlbench.ingest.console_logs`).
- `miles-jsonl`: one dict per line with Miles names and a step key (`rollout/step`,
  `train/step`, `eval/step` or `step`).
- `miles-console`: Miles' logger lines `perf 3: {...}`, `eval 3: {...}`, `step 3: {...}` (Python
  dict reprs; `[actor-]step N` for the trainer), the dict possibly wrapped over several lines.
- `tensorboard`: a folder of event files (rlbench/ingest/tensorboard.py).
- `mlflow`: `mlflow:TRACKING_URI#RUN_ID[/MODE]`, a run on an MLflow server, every metric's full
  history (rlbench/ingest/mlflow_run.py).

All names are mapped onto verl's vocabulary (`rlbench.ingest.vocab`). Values that are not numbers
(strings, lists) are dropped; booleans become 0/1. A truncated last JSON line (a run killed
mid-write) is ignored and reported in `MetricLog.warnings`, and so is a console record cut
mid-value; a malformed JSON line elsewhere is a `DataError` naming the file and line.

Never a silent drop: steps that go back or come again after other steps (a resumed or
concatenated run), negative steps (ignored), and lines over `MAX_LINE_BYTES` (skipped unread in
console logs, refused in JSON logs, in bounded memory and time) are warned about; a binary
file, an empty file, a directory or what is not a regular file (`/dev/null`, a FIFO) is refused
with one line, and so is a metric name with a byte that is not UTF-8 (it would read as a new
metric while the real one goes missing at that step).

A value logged as NaN (JSON `NaN`, the trainer's `"nan"`, a console `nan`) is a NaN in `frame`
like a step without the metric; the steps where the log gave NaN are kept apart in
`frame.attrs["nan_steps"]` (metric -> sorted steps), so that a check can tell a NaN the run
logged from a step that did not log the metric (rlbench/checks/metric.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

try:  # optional speed-up: orjson parses a 10,000-step log ~5x faster than json
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

from rlbench.ingest.console_logs import parse_scalar, read_miles_console, read_verl_console
from rlbench.ingest.log_lines import MAX_LINE_BYTES, drop_negative_steps, mb, read_lines, step_order_warnings
from rlbench.ingest.vocab import STEP_KEYS, accuracy_twin, canonical_name_and_scale
from trainer.errors import ConfigError, DataError

FORMATS: tuple[str, ...] = ("verl-jsonl", "verl-console", "miles-jsonl", "miles-console", "rlbench",
                            "tensorboard",  # a folder of event files (rlbench/ingest/tensorboard.py)
                            "mlflow")  # mlflow:URI#RUN_ID, a run on a tracking server (rlbench/ingest/mlflow_run.py)
_SOURCE_OF_FORMAT = {
    "verl-jsonl": "verl",
    "verl-console": "verl",
    "miles-jsonl": "miles",
    "miles-console": "miles",
    "rlbench": "rlbench",
}

_DETECT_LINES = 5000
# Miles record kinds -> the counter their number is (rollout id, optimizer step, evaluation).
_MILES_FAMILY = {"perf": "rollout/step", "rollout": "rollout/step", "step": "train/step", "eval": "eval/step"}  # console format detection reads this many lines at most


@dataclass
class MetricLog:
    """A log as one table: `frame` has an int `step` index (sorted) and one float column per metric."""

    frame: pd.DataFrame  # [num_steps, num_metrics], NaN where a metric was not logged at a step
    source_format: str  # one of FORMATS
    warnings: list[str] = field(default_factory=list)
    path: Path | None = None
    notes: list[str] = field(default_factory=list)  # how names were read (e.g. reward read as accuracy)

    @property
    def first_step(self) -> int:
        return int(self.frame.index[0])

    @property
    def last_step(self) -> int:
        return int(self.frame.index[-1])

    def series(self, metric: str) -> pd.Series:
        """The metric's values at the steps where it was logged (NaN dropped)."""
        if metric not in self.frame.columns:
            known = ", ".join(sorted(self.frame.columns)[:8])
            raise DataError(
                f"{self.path}: metric {metric!r} is not in the log; it has {len(self.frame.columns)} "
                f"metrics ({known}, ...): check the metric name against rlbench.ingest.vocab"
            )
        return self.frame[metric].dropna()


def _to_float(value: Any) -> float:
    """A logged value as a float; NaN when it is not a number (strings, lists, None)."""
    t = type(value)
    if t is float or t is int or t is bool:
        return float(value)
    if t is str:
        v = parse_scalar(value)
        return math.nan if v is None else v
    return math.nan


def _step_of(record: dict[str, Any], where: str) -> int:
    for key in STEP_KEYS:
        if key in record:
            raw = record[key]
            if isinstance(raw, bool) or raw is None:
                raise DataError(f"{where}: step key {key!r} has value {raw!r}, expected an integer")
            try:
                step = int(raw)
            except (TypeError, ValueError, OverflowError):
                raise DataError(f"{where}: step key {key!r} has value {raw!r}, expected an integer") from None
            if isinstance(raw, float) and raw != step:
                raise DataError(f"{where}: step key {key!r} has value {raw!r}, expected an integer")
            return step
    raise DataError(f"{where}: no step key (one of {', '.join(STEP_KEYS)}); is this a metrics log?")


def _merge(rows: dict[int, dict[str, Any]], step: int, values: dict[str, Any]) -> None:
    row = rows.get(step)
    if row is None:
        rows[step] = dict(values)
    else:
        row.update(values)  # later keys win


def _logged_nan(rows: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    """Raw name -> the steps whose logged value is NaN (a float NaN or a NaN written as text)."""
    out: dict[str, list[int]] = {}
    for step, row in rows.items():
        for key, v in row.items():
            t = type(v)
            if (t is float and math.isnan(v)) or (t is str and v.strip().lower().endswith(("nan", "nan)"))
                                                   and (x := parse_scalar(v)) is not None and math.isnan(x)):
                out.setdefault(key, []).append(step)
    return out


def _frame(rows: dict[int, dict[str, Any]], path: Path, fmt: str) -> pd.DataFrame:
    """One float column per canonical metric name, from rows of raw (source-named) values; the steps
    where a metric was logged as NaN in `attrs["nan_steps"]`."""
    frame = _values_frame(rows, path, fmt)
    nan_at = {}
    for raw, steps in _logged_nan(rows).items():
        name = canonical_name_and_scale(str(raw), _SOURCE_OF_FORMAT[fmt])[0]
        if name in frame.columns:
            at = pd.Index(sorted(set(steps)), dtype="int64")
            at = at[frame.loc[at, name].isna().to_numpy()]  # where another source name gave it no value
            if len(at):
                nan_at[name] = at.union(pd.Index(nan_at.get(name, []), dtype="int64")).to_numpy()
    frame.attrs["nan_steps"] = nan_at
    return frame


def _values_frame(rows: dict[int, dict[str, Any]], path: Path, fmt: str) -> pd.DataFrame:
    if not rows:
        raise DataError(f"{path}: read as {fmt} but no step with metrics was found; check the file and fmt=")
    steps = sorted(rows)
    frame = pd.DataFrame.from_records([rows[s] for s in steps], index=pd.Index(steps, name="step"))
    frame = frame.drop(columns=[c for c in (*STEP_KEYS, "_meta") if c in frame.columns])
    not_numeric = []
    for col in frame.columns:
        if frame[col].dtype.kind not in "fiub":  # strings, lists, reprs: keep what reads as a number
            frame[col] = frame[col].astype(object).map(_to_float).astype("float64")
            if frame[col].isna().all():
                not_numeric.append(col)  # e.g. a config string logged as a metric
    frame = frame.drop(columns=not_numeric).astype("float64")
    source = _SOURCE_OF_FORMAT[fmt]
    named = [canonical_name_and_scale(str(c), source) for c in frame.columns]
    for (_, scale), col in zip(named, list(frame.columns)):
        if scale != 1.0:  # e.g. verl's old "critic/lr(1e-4)" logged lr x 1e4
            frame[col] = frame[col] * scale
    names = [n for n, _ in named]
    if len(set(names)) == len(names):
        frame.columns = pd.Index(names)
        return frame
    # Several source names map to one metric (e.g. two Miles generations of a name): the
    # column further right wins where it has a value.
    merged: dict[str, pd.Series] = {}
    for name, col in zip(names, frame.columns):
        series = frame[col]
        merged[name] = series if name not in merged else series.combine_first(merged[name])
    return pd.DataFrame(merged, index=frame.index)


def _loads(line: str) -> Any:
    """One JSON line; orjson when installed (5x faster), json for what orjson refuses (NaN)."""
    if _orjson is not None:
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(line)


def _load_json_lines(lines: list[str], path: Path, fmt: str, warnings: list[str],
                     seen: list[Any]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    last = max((i for i, line in enumerate(lines) if line and not line.isspace()), default=-1)
    paired = fmt in ("verl-jsonl", "rlbench")
    for i, line in enumerate(lines):
        if not line or line.isspace():
            continue
        try:
            record = _loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                warnings.append(
                    f"line {i + 1}: truncated JSON line ignored (the run was probably killed mid-write)"
                )
                continue
            raise DataError(
                f"{path}:{i + 1}: malformed JSON line ({exc.msg} at column {exc.colno}); "
                "fix or delete that line (only the last line may be cut short)"
            ) from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{i + 1}: expected a JSON object per line, got {type(record).__name__}")
        if paired:
            data = record.get("data")
            if data is None:
                if "_meta" in record:  # a metadata-only line of the trainer's log
                    continue
                raise DataError(
                    f"{path}:{i + 1}: line has no 'data' object; expected {{\"step\": N, \"data\": {{...}}}}"
                )
            if not isinstance(data, dict):
                raise DataError(f"{path}:{i + 1}: 'data' must be an object of metric -> value")
            step = _step_of(record, f"{path}:{i + 1}")
            _merge(rows, step, data)
        else:  # miles-jsonl: a flat dict with a step key
            step = _step_of(record, f"{path}:{i + 1}")
            _merge(rows, step, record)
        seen.append((step, i + 1, "" if paired else next((k for k in STEP_KEYS if k in record), "")))
    return rows


def _load_miles_console(lines: list[str], path: Path, warnings: list[str],
                        seen: list[Any]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}

    def emit(record: dict[str, Any], kind: str, rid: str, where: str) -> None:
        has_step = any(k in record for k in STEP_KEYS)
        step = _step_of(record, f"{path}:{where.split()[-1].split('-')[0]}") if has_step else int(rid)
        key = next((k for k in STEP_KEYS if k in record), None)
        family = key or _MILES_FAMILY.get(kind.split("-")[-1], kind)
        seen.append((step, int(where.split()[-1].split("-")[0]), family))
        _merge(rows, step, record)

    read_miles_console(lines, warnings, emit)
    return rows


def _first_json_object(lines: list[str]) -> dict[str, Any] | None:
    for line in lines[:50]:
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            return None
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return None
        if isinstance(record, dict) and not ("data" not in record and set(record) == {"_meta"}):
            return record
    return None


def detect_format(lines: list[str], path: Path) -> str:
    """Which of FORMATS the lines are, from their content."""
    record = _first_json_object(lines)
    if record is not None:
        if "data" in record and "step" in record:
            head = lines[:50]
            return "rlbench" if any('"_meta"' in line for line in head) or "_meta" in record else "verl-jsonl"
        if any(k in record for k in STEP_KEYS):
            return "miles-jsonl"
    elif any(line.lstrip().startswith('{"_meta"') for line in lines[:5]):
        return "rlbench"
    # Console logs: read the head with each reader (records may be wrapped over several lines);
    # the format whose first record comes first wins.
    for size in (200, _DETECT_LINES):  # most logs show a record in their first lines
        head = lines[:size]
        verl_seen: list[tuple[int, int]] = []
        read_verl_console(head, [], verl_seen)
        miles_seen: list[int] = []
        read_miles_console(head, [], lambda rec, kind, rid, where, seen=miles_seen: seen.append(
            int(where.split()[-1].split("-")[0])))
        firsts = {"verl-console": min((ln for _, ln in verl_seen), default=None),
                  "miles-console": min(miles_seen, default=None)}
        found = {k: v for k, v in firsts.items() if v is not None}
        if found:
            return min(found, key=lambda k: found[k])
        if len(lines) <= size:
            break
    raise DataError(
        f"{path}: no recognizable metrics found; accepted formats are {', '.join(FORMATS)} "
        "(see rlbench.ingest.load); pass fmt= if detection is wrong"
    )


def _accuracy_from_reward(frame: pd.DataFrame, path: Path, notes: list[str]) -> pd.DataFrame:
    """Copy each validation mean reward to its accuracy name, after checking the rewards are 0/1."""
    for col in list(frame.columns):
        twin = accuracy_twin(str(col))
        if twin is None or twin in frame.columns:
            continue
        x = frame[col].dropna()
        bad = x[(x < 0) | (x > 1)]
        if len(bad):
            raise DataError(f"{path}: {col} is {bad.iloc[0]:g} at step {bad.index[0]}, outside [0, 1]: it is a "
                            "mean reward, not an accuracy; drop --reward-is-accuracy")
        for side, op in (("critic/score/min", lambda v: v < 0), ("critic/score/max", lambda v: v > 1)):
            if side in frame.columns and op(frame[side].dropna()).any():
                raise DataError(f"{path}: {side} leaves [0, 1], so rewards are not 0/1 and {col} is not an "
                                "accuracy; drop --reward-is-accuracy")
        frame[twin] = frame[col]
        if col in frame.attrs.get("nan_steps", {}):
            frame.attrs["nan_steps"][twin] = frame.attrs["nan_steps"][col]
        notes.append(f"{col} read as {twin} (--reward-is-accuracy: 0/1 rewards)")
    return frame


def _file_kind(path: Path) -> str:
    import stat

    mode = path.stat().st_mode
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a file"


def _refuse_undecodable_names(frame: pd.DataFrame, lines: list[str], path: Path) -> None:
    """A metric name holding U+FFFD (a byte that is not UTF-8, replaced when read) is an error naming its line."""
    for name in frame.columns:
        name = str(name)
        if "\ufffd" not in name:
            continue
        i = name.index("\ufffd")
        piece = name[max(i - 12, 0): i + 12]
        line = next((n for n, text in enumerate(lines, 1) if name in text), None) or next(
            (n for n, text in enumerate(lines, 1) if piece in text), None)
        where = f"{path}:{line}" if line else str(path)
        shown = name.replace("\ufffd", "?")
        raise DataError(f"{where}: metric name {shown!r} has a byte that is not UTF-8 (shown as ?), so it would "
                        "read as a metric of its own; the log is damaged or in another encoding: fix that line, or "
                        f"convert the file to UTF-8 (iconv -f LATIN1 -t UTF-8 {path.name})")


def load_metrics(path: str | Path, fmt: str = "auto", *, reward_is_accuracy: bool = False,
                 max_line_bytes: int = MAX_LINE_BYTES) -> MetricLog:
    """Read the log at `path` (format `fmt`, or detected when "auto") into a `MetricLog`.

    `reward_is_accuracy`: the run's rewards are 0/1 per sample, so each validation mean reward
    (`val-core/<ds>/reward/mean@N`) is also its accuracy (`val-core/<ds>/acc/mean@N`); checked
    against the logged values (a reward outside [0, 1] is an error).
    """
    from rlbench.ingest.mlflow_run import is_mlflow_locator, read_mlflow_run

    if is_mlflow_locator(path) or fmt == "mlflow":
        if not is_mlflow_locator(path):
            raise DataError(f"{path}: --format mlflow reads mlflow:TRACKING_URI#RUN_ID, not a file")
        if fmt not in ("auto", "mlflow"):
            raise ConfigError(f"{path}: an MLflow run; --format {fmt} reads files: drop --format")
        frame, warnings = read_mlflow_run(str(path))
        return MetricLog(frame=frame, source_format="mlflow", warnings=warnings, path=Path(str(path)))
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError(f"unknown log format {fmt!r} for {path}; use auto or one of {', '.join(FORMATS)}")
    if fmt == "tensorboard" and not path.is_dir():
        raise DataError(f"{path}: --format tensorboard reads a folder of events.out.tfevents.* files, not a file")
    if path.is_dir():
        from rlbench.ingest.tensorboard import is_tensorboard_dir, read_tensorboard

        if is_tensorboard_dir(path) and fmt in ("auto", "tensorboard"):
            frame, warnings = read_tensorboard(path)
            return MetricLog(frame=frame, source_format="tensorboard", warnings=warnings, path=path)
        raise DataError(f"{path}: is a directory, not a metrics log; pass the log file inside it "
                        "(e.g. metrics.jsonl)")
    if not path.exists():
        raise DataError(f"{path}: metrics log not found; check the path")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file ({_file_kind(path)}), not a metrics log; pass the log file "
                        "the run wrote (e.g. metrics.jsonl), or save the stream to a file first")
    lines, oversize = read_lines(path, max_line_bytes)
    if not any(lines):
        if oversize:
            n, size = oversize[0]
            raise DataError(f"{path}:{n}: a {mb(size)} line, over the {mb(max_line_bytes)} limit of a metrics "
                            "line, and nothing else: this is not a metrics log")
        raise DataError(f"{path}: the file is empty; a metrics log has one line per step")
    if fmt == "auto":
        fmt = detect_format(lines, path)
    warnings: list[str] = []
    seen: list[Any] = []  # (step, line[, family]) of each record, in file order
    if oversize:
        n, size = oversize[0]
        if fmt in ("verl-jsonl", "rlbench", "miles-jsonl"):
            raise DataError(f"{path}:{n}: line is {mb(size)}, over the {mb(max_line_bytes)} limit of a metrics "
                            "line; a JSON metrics line is a few kB: fix or delete that line")
        more = f" (and {len(oversize) - 1} more)" if len(oversize) > 1 else ""
        warnings.append(f"line {n}: {mb(size)} long, over the {mb(max_line_bytes)} limit of a log line; "
                        f"skipped unread{more}")
    if fmt in ("verl-jsonl", "rlbench", "miles-jsonl"):
        rows = _load_json_lines(lines, path, fmt, warnings, seen)
    elif fmt == "verl-console":
        rows = read_verl_console(lines, warnings, seen)
    else:
        rows = _load_miles_console(lines, path, warnings, seen)
    drop_negative_steps(rows, seen, warnings)
    warnings.extend(step_order_warnings(seen))
    frame = _frame(rows, path, fmt)
    _refuse_undecodable_names(frame, lines, path)
    notes: list[str] = []
    if reward_is_accuracy:
        frame = _accuracy_from_reward(frame, path, notes)
    return MetricLog(frame=frame, source_format=fmt, warnings=warnings, path=path, notes=notes)
