"""Read a training log (verl, Miles, or the trainer's own) into one step x metric table.

    from rlbench.ingest import load_metrics
    log = load_metrics("run/metrics.jsonl")          # format detected from the content
    log.frame["actor/ppo_kl"]                          # float series indexed by step

Formats (`fmt=`):
- `verl-jsonl`: verl's file logger, one `{"step": N, "data": {...}}` per line; several lines may
  share a step (later keys win).
- `rlbench`: the trainer's `metrics.jsonl`, the same shape; a `"_meta"` key (run metadata, on its
  own line or beside `data`) marks it and is skipped.
- `verl-console`: verl's console logger, `step:12 - actor/ppo_kl:0.001 - ...`, with numpy/torch
  reprs (`np.float64(0.5)`, `tensor(0.5)`), Ray prefixes (`(TaskRunner pid=1) step:1 - ...`) and
  unrelated lines in between (ignored).
- `miles-jsonl`: one dict per line with Miles names and a step key (`rollout/step`,
  `train/step`, `eval/step` or `step`).
- `miles-console`: Miles' logger lines `perf 3: {...}`, `eval 3: {...}`, `step 3: {...}` (Python
  dict reprs; `[actor-]step N` for the trainer).

All names are mapped onto verl's vocabulary (`rlbench.vocab`). Values that are not numbers
(strings, lists) are dropped; booleans become 0/1. A truncated last JSON line (a run killed
mid-write) is ignored and reported in `MetricLog.warnings`; a malformed line elsewhere is a
`DataError` naming the file and line.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

try:  # optional speed-up: orjson parses a 10,000-step log ~5x faster than json
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

from rlbench.vocab import STEP_KEYS, canonical_name
from trainer.errors import ConfigError, DataError

FORMATS: tuple[str, ...] = ("verl-jsonl", "verl-console", "miles-jsonl", "miles-console", "rlbench")
_SOURCE_OF_FORMAT = {
    "verl-jsonl": "verl",
    "verl-console": "verl",
    "miles-jsonl": "miles",
    "miles-console": "miles",
    "rlbench": "rlbench",
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# verl console: "step:12 - key:value - key:value", anywhere on the line (after a Ray prefix).
_VERL_CONSOLE = re.compile(r"(?:^|[\s)\]])step:(?P<step>\d+)(?P<rest>(?:\s+-\s+.*)?)$")
# Miles logger: "... perf 3: {...}", "... eval 3: {...}", "... step 3: {...}", "actor-step 3: {...}".
_MILES_CONSOLE = re.compile(
    r"(?:^|[\s:\])])(?P<kind>perf|eval|rollout|(?:[\w]+-)?step)\s+(?P<id>\d+):\s*(?P<dict>\{.*\})\s*$"
)
# numpy / torch scalar reprs: np.float64(0.5), numpy.int64(3), tensor(0.5, device='cuda:0').
_NP_SCALAR = re.compile(r"\b(?:np|numpy)\.\w+\(\s*([^(),]*?)\s*\)")
_TENSOR_SCALAR = re.compile(r"\btensor\(\s*([^(),]*?)\s*(?:,[^()]*)?\)")
_BARE_NAN = re.compile(r"(?<![\w'\"/.])nan(?![\w'\"])")
_BARE_INF = re.compile(r"(?<![\w'\"/.])inf(?![\w'\"])")


@dataclass
class MetricLog:
    """A log as one table: `frame` has an int `step` index (sorted) and one float column per metric."""

    frame: pd.DataFrame  # [num_steps, num_metrics], NaN where a metric was not logged at a step
    source_format: str  # one of FORMATS
    warnings: list[str] = field(default_factory=list)
    path: Path | None = None

    def series(self, metric: str) -> pd.Series:
        """The metric's values at the steps where it was logged (NaN dropped)."""
        if metric not in self.frame.columns:
            known = ", ".join(sorted(self.frame.columns)[:8])
            raise DataError(
                f"{self.path}: metric {metric!r} is not in the log; it has {len(self.frame.columns)} "
                f"metrics ({known}, ...): check the metric name against rlbench.vocab"
            )
        return self.frame[metric].dropna()


def _to_float(value: Any) -> float:
    """A logged value as a float; NaN when it is not a number (strings, lists, None)."""
    t = type(value)
    if t is float or t is int or t is bool:
        return float(value)
    if t is str:
        v = _parse_scalar(value)
        return math.nan if v is None else v
    return math.nan


def _parse_scalar(text: str) -> float | None:
    """A console value as a float: `0.5`, `np.float64(0.5)`, `tensor(0.5)`, `nan`, `-inf`; else None."""
    text = text.strip()
    m = _NP_SCALAR.fullmatch(text) or _TENSOR_SCALAR.fullmatch(text)
    if m:
        text = m.group(1).strip()
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    try:
        return float(text)  # also parses "nan", "inf", "-inf", "1e-4"
    except ValueError:
        return None


def _step_of(record: dict[str, Any], where: str) -> int:
    for key in STEP_KEYS:
        if key in record:
            raw = record[key]
            try:
                step = int(raw)
            except (TypeError, ValueError):
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


def _frame(rows: dict[int, dict[str, Any]], path: Path, fmt: str) -> pd.DataFrame:
    """One float column per canonical metric name, from rows of raw (source-named) values."""
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
    names = [canonical_name(str(c), source) for c in frame.columns]
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


def _load_json_lines(lines: list[str], path: Path, fmt: str, warnings: list[str]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
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
            _merge(rows, _step_of(record, f"{path}:{i + 1}"), data)
        else:  # miles-jsonl: a flat dict with a step key
            _merge(rows, _step_of(record, f"{path}:{i + 1}"), record)
    return rows


def _clean_console(line: str) -> str:
    return _RAY_REPEAT.sub("", _ANSI.sub("", line)).rstrip()


def _load_verl_console(lines: list[str], warnings: list[str]) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for i, raw in enumerate(lines):
        if "step:" not in raw:
            continue
        m = _VERL_CONSOLE.search(_clean_console(raw))
        if not m:
            continue
        values: dict[str, float] = {}
        for item in m.group("rest").split(" - ")[1:]:
            key, sep, text = item.partition(":")
            key = key.strip()
            if not sep or not key:
                continue
            v = _parse_scalar(text)
            if v is None:
                warnings.append(f"line {i + 1}: value of {key!r} is not a number ({text.strip()[:40]!r}); ignored")
                continue
            values[key] = v
        if values:  # "step:5" alone (a progress line) carries no metrics
            _merge(rows, int(m.group("step")), values)
    return rows


def _literal_dict(text: str) -> dict[str, Any] | None:
    """A Python dict repr (with numpy/torch scalars, nan, inf) as a dict; None if it does not parse."""
    text = _NP_SCALAR.sub(r"\1", text)
    text = _TENSOR_SCALAR.sub(r"\1", text)
    text = _BARE_NAN.sub("None", text)  # None -> NaN below
    text = _BARE_INF.sub("1e999", text)  # 1e999 parses as inf
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, dict):
        return None
    return {str(k): (math.nan if v is None else v) for k, v in value.items()}


def _load_miles_console(lines: list[str], path: Path, warnings: list[str]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for i, raw in enumerate(lines):
        if ": {" not in raw:
            continue
        m = _MILES_CONSOLE.search(_clean_console(raw))
        if not m:
            continue
        record = _literal_dict(m.group("dict"))
        if record is None:
            warnings.append(f"line {i + 1}: Miles '{m.group('kind')}' line has an unreadable dict; ignored")
            continue
        has_step = any(k in record for k in STEP_KEYS)
        step = _step_of(record, f"{path}:{i + 1}") if has_step else int(m.group("id"))
        _merge(rows, step, record)
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
    for line in lines:
        if "step:" in line and _VERL_CONSOLE.search(_clean_console(line)):
            return "verl-console"
        if ": {" in line and _MILES_CONSOLE.search(_clean_console(line)):
            return "miles-console"
    raise DataError(
        f"{path}: no recognizable metrics found; accepted formats are {', '.join(FORMATS)} "
        "(see rlbench.ingest); pass fmt= if detection is wrong"
    )


def load_metrics(path: str | Path, fmt: str = "auto") -> MetricLog:
    """Read the log at `path` (format `fmt`, or detected when "auto") into a `MetricLog`."""
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError(f"unknown log format {fmt!r} for {path}; use auto or one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise DataError(f"{path}: metrics log not found; check the path")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the metrics log ({exc.strerror})") from None
    lines = text.splitlines()
    if fmt == "auto":
        fmt = detect_format(lines, path)
    warnings: list[str] = []
    if fmt in ("verl-jsonl", "rlbench", "miles-jsonl"):
        rows = _load_json_lines(lines, path, fmt, warnings)
    elif fmt == "verl-console":
        rows = _load_verl_console(lines, warnings)
    else:
        rows = _load_miles_console(lines, path, warnings)
    return MetricLog(frame=_frame(rows, path, fmt), source_format=fmt, warnings=warnings, path=path)
