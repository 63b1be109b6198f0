"""Read one MLflow run as a metrics log: every metric's full history, with MLflow's own client.

    rlbench check mlflow:http://mlflow.internal:5000#RUN_ID --suite SUITE --profile cpu --arch cpu
    rlbench check --suite SUITE --run colocated=mlflow:http://host:5000#RUN_ID/colocated \\
        --run fully_async=mlflow:http://host:5000#RUN_ID/fully_async
    from rlbench.ingest.mlflow_run import read_mlflow_run
    frame, warnings = read_mlflow_run("mlflow:http://127.0.0.1:5000#0a1b2c...")

A log argument that starts with `mlflow:` is `mlflow:TRACKING_URI#RUN_ID[/MODE]` (rlbench/ingest/load.py
sends it here): `MlflowClient(TRACKING_URI).get_run(RUN_ID)`, then `get_metric_history` of each of the
run's metric keys (every step, not MLflow's latest value). A step logged twice for one key keeps the
last value (by timestamp), with a warning.

Names: MLflow allows only alphanumerics, `_ - . : /` and spaces in a metric name, so writers spell
`@` as `_at_` (verl's MLflow logger does; so does rlbench/store/mlflow_store.py) and rlbench writes any
other character as `_xHH_` (its code point in hex); both are read back (`from_mlflow_name`, rlbench/store/mlflow_client.py), so
`val-core/x/acc/mean_at_1` reads as `val-core/x/acc/mean@1`.

Runs the rlbench store wrote (tag `rlbench.mode`) hold each mode's steps under `<mode>/<metric>` and
the checks under `check.*`: with one mode the locator needs no `/MODE`; with several it must name one.
Runs logged by other tools (verl's `trainer.logger: mlflow`, ...) are read whole.
`read_stored_run` reads a run the store wrote whole for `rlbench compare`: every mode's frame and
its checks (the `check.*` tags and metrics, rlbench/store/mlflow_store.py `stored_checks`).

Refused with one line naming the URI and run: an unreachable server, an unknown run id, a run with no
metric, a malformed locator, or mlflow not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from rlbench.store.mlflow_client import MODE_TAG, client, fail_fast, from_mlflow_name, unreachable
from rlbench.store.mlflow_store import stored_checks, stored_record
from rlbench.store.sqlite import CheckRow, RunRecord
from trainer.errors import DataError

PREFIX = "mlflow:"
def is_mlflow_locator(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def parse_locator(value: str) -> tuple[str, str, str | None]:
    """(tracking URI, run id, mode or None) of `mlflow:URI#RUN_ID[/MODE]`."""
    uri, sep, frag = value[len(PREFIX):].rpartition("#")
    run_id, _, mode = frag.partition("/")
    if not sep or not uri or not run_id:
        raise DataError(f"{value}: an MLflow run is mlflow:TRACKING_URI#RUN_ID[/MODE] "
                        "(e.g. mlflow:http://127.0.0.1:5000#0a1b2c3d...); the run id is on the run's MLflow page")
    return uri, run_id, mode or None


def _get_run(mc: Any, value: str, uri: str, run_id: str) -> Any:
    """The MLflow run, or one DataError line naming `value` and the fix."""
    from mlflow.exceptions import MlflowException

    try:
        with fail_fast():
            return mc.get_run(run_id)
    except MlflowException as e:
        if unreachable(e):
            raise DataError(f"{value}: cannot reach the MLflow tracking server at {uri}; start it or fix the URI "
                            "(mlflow server --host ... --port ...)") from None
        if getattr(e, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise DataError(f"{value}: no run {run_id} on {uri}; copy the run id from the run's MLflow page "
                            "(or MlflowClient.search_runs)") from None
        raise DataError(f"{value}: MLflow refused to read run {run_id}: {str(e).splitlines()[0]}") from None


def read_mlflow_run(value: str) -> tuple[pd.DataFrame, list[str]]:
    """(frame [steps, metrics] of float, warnings) of the run `value` names; DataError when it cannot be read."""
    uri, run_id, mode = parse_locator(value)
    mc = client(uri, value)
    return _frame(mc, _get_run(mc, value, uri, run_id), value, uri, run_id, mode)


@dataclass
class StoredMlflowRun:
    """A run the rlbench store wrote (rlbench/store/mlflow_store.py): every mode's steps, its checks, its fields."""

    run_id: str
    frames: dict[str, pd.DataFrame]  # mode -> [steps, metrics]
    checks: dict[str, CheckRow]  # check id -> what the store wrote
    record: RunRecord
    warnings: list[str]


def read_stored_run(value: str) -> StoredMlflowRun:
    """Each mode's frame (or the one `/MODE` names) and the checks of the run `value` names. A run that
    another tool logged (no `rlbench.mode` tag) has no modes or checks: `frames` is {"": frame}."""
    uri, run_id, mode = parse_locator(value)
    mc = client(uri, value)
    run = _get_run(mc, value, uri, run_id)
    tags = run.data.tags
    modes = [mode] if mode is not None else (tags[MODE_TAG].split("+") if MODE_TAG in tags else [None])
    frames, warnings = {}, []
    for m in modes:
        frame, w = _frame(mc, run, value, uri, run_id, m)
        frames[m or ""] = frame
        warnings += w
    checks = stored_checks(tags, run.data.metrics)
    if mode is not None:
        checks = {k: c for k, c in checks.items() if c.mode in (mode, "") or "/" in c.mode}
    return StoredMlflowRun(run_id, frames, checks, stored_record(tags), warnings)


def _frame(mc: Any, run: Any, value: str, uri: str, run_id: str, mode: str | None) -> tuple[pd.DataFrame, list[str]]:
    keys = _keys(list(run.data.metrics), run.data.tags.get(MODE_TAG), mode, value)
    if not keys:
        raise DataError(f"{value}: run {run_id} on {uri} has no metric"
                        + (f" of mode {mode}" if mode else "") + "; log the run's metrics with step=, or pick "
                        "the run that has them")
    cols: dict[str, dict[int, float]] = {}
    warnings: list[str] = []
    for key, name in keys.items():
        col: dict[int, float] = {}
        history = sorted(mc.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        for m in history:
            if int(m.step) in col:
                warnings.append(f"{name}: step {m.step} logged more than once; the last value is kept")
            col[int(m.step)] = float(m.value)
        cols[name] = col
    frame = pd.DataFrame(cols).sort_index().astype(float)
    frame.index = frame.index.astype(int)
    frame.index.name = "step"
    return frame, list(dict.fromkeys(warnings))


def _keys(keys: list[str], modes_tag: str | None, mode: str | None, where: str) -> dict[str, str]:
    """MLflow key -> metric name of the keys to read: a mode's `<mode>/` keys of a run the rlbench
    store wrote, or every key of another run."""
    if modes_tag is None:
        if mode is not None:
            raise DataError(f"{where}: /{mode} names a mode, and this run was not written by the rlbench store "
                            "(no rlbench.mode tag): drop /MODE")
        return {k: from_mlflow_name(k) for k in sorted(keys)}
    modes = modes_tag.split("+")
    if mode is None and len(modes) == 1:
        mode = modes[0]
    if mode not in modes:
        fix = f"name one: {where if mode is None else where.rpartition('/')[0]}/{modes[0]}"
        what = "the run holds modes" if mode is None else f"mode {mode} is not in this run; it holds"
        raise DataError(f"{where}: {what} {', '.join(modes)}; {fix}")
    head = f"{mode}/"
    return {k: from_mlflow_name(k[len(head):]) for k in sorted(keys) if k.startswith(head)}
