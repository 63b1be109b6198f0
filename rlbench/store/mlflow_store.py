"""MLflow as the shared results store: what the SQLite store appends (rlbench/store/sqlite.py), as
one MLflow run per stored run, written and read with MLflow's client (`MlflowClient`).

    rlbench run SUITE --profile cpu --store mlflow:http://mlflow.internal:5000 [--trusted]
    pytest suites/ --arch gfx942 --rlbench-store https://mlflow.internal#experiment=rlbench-nightly
    rlbench check mlflow:http://mlflow.internal:5000#RUN_ID --suite SUITE --profile cpu   # read a run back

Which values select it, and the experiment: rlbench/store/target.py. One stored run (a suite x
profile x seed evaluated) is one MLflow run of the experiment, named `SUITE [PROFILE] seed N`:

- tags `rlbench.<field>` for every field of `RunRecord`: suite, profile, mode (modes "+"-joined),
  seed, arch, device, host, commit, dirty, started, finished, trusted (`1`/`0`), source, verdict,
  folder, command; params `version.<package>` for the versions.
- each check: tags `check.<key>.id` (the exact check id), `.verdict`, `.metric`, `.mode`,
  `.message`, and its numbers as metrics at step 0: `check.<key>.value`, `.lo`, `.hi`, `.ref_value`
  (a number that is None or not finite is not logged). `<key>` is the check id spelled as an MLflow
  name (`@` -> `_at_`, other characters MLflow refuses -> `_xHH_`: rlbench/store/mlflow_client.py).
- every logged step as the metric `<mode>/<metric>` (the same spelling) with `step=`.
- the run's `report.html` as the artifact `report.html`, when there is one.

MLflow has no transaction: the run is created RUNNING, written in batches (`log_batch`), then
marked FINISHED; a writer that fails marks it FAILED, and one killed leaves it RUNNING. History
gates (`trusted_values`, rlbench/checks/history.py) read FINISHED runs only, so a half-written run
is never a baseline. Values are MLflow metrics, stored as doubles: they read back equal.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from typing_extensions import Self

from rlbench.store.mlflow_client import MODE_TAG, client, fail_fast, mlflow_name, unreachable
from rlbench.store.sqlite import MATCH_KEYS, CheckRow, RunRecord, StoredRun, StoreError
from rlbench.store.target import MlflowLocation

_T = TypeVar("_T")
_TAG_MAX = 8000  # MLflow's longest tag value (MAX_TAG_VAL_LENGTH)
_PARAM_MAX = 6000  # and param value
_RECORD_TAGS = ("suite", "profile", "seed", "arch", "device", "host", "started", "finished", "source",
                "verdict", "folder", "command")


def check_key(check_id: str) -> str:
    """The MLflow key prefix of a check: `check.<id spelled as an MLflow name>`."""
    return f"check.{mlflow_name(check_id)}"


def _chunks(items: Sequence[_T], n: int) -> Iterator[Sequence[_T]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(float(x))


class MlflowResultsStore:
    """An rlbench results store in one MLflow experiment (created on first use)."""

    def __init__(self, where: MlflowLocation) -> None:
        from mlflow.exceptions import MlflowException

        self.where = where
        self._client = client(where.uri, str(where))
        try:
            with fail_fast():
                exp = self._client.get_experiment_by_name(where.experiment)
            self.experiment_id = (exp.experiment_id if exp is not None
                                  else self._client.create_experiment(where.experiment))
        except MlflowException as e:
            self._raise(e, "open the experiment")

    def close(self) -> None:
        """Nothing to release: the client holds no connection between calls."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise(self, e: Exception, doing: str) -> None:
        if unreachable(e):
            raise StoreError(f"results store {self.where}: cannot reach the MLflow tracking server at "
                             f"{self.where.uri}; start it or fix --store / RLBENCH_STORE") from None
        raise StoreError(f"results store {self.where}: could not {doing}: {str(e).splitlines()[0]}") from None

    # ------------------------------------------------------------------ writing
    def append(self, run: RunRecord, checks: Iterable[CheckRow] = (),
               metrics: Iterable[tuple[str, int, str, float | None]] = (), *, report: Path | None = None) -> str:
        """Write one run with its checks, metrics (mode, step, key, value) and report; its MLflow run id."""
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException

        finished = run.finished or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fields = {**{k: getattr(run, k) for k in _RECORD_TAGS}, "finished": finished,
                  "trusted": "1" if run.trusted else "0", "commit": run.git_commit,
                  "dirty": None if run.dirty is None else str(int(run.dirty))}
        tags = [RunTag(f"rlbench.{k}", str(v)[:_TAG_MAX]) for k, v in fields.items() if v is not None]
        tags.append(RunTag(MODE_TAG, run.mode))
        params = [Param(f"version.{mlflow_name(k)}", str(v)[:_PARAM_MAX]) for k, v in sorted(run.versions.items())]
        now = int(time.time() * 1000)
        rows: list[Any] = []
        for c in checks:
            key = check_key(c.check_id)
            tags += [RunTag(f"{key}.{f}", str(v)[:_TAG_MAX]) for f, v in
                     (("id", c.check_id), ("verdict", c.verdict), ("metric", c.metric), ("mode", c.mode),
                      ("message", c.message))]
            rows += [Metric(f"{key}.{f}", float(v), now, 0) for f, v in
                     (("value", c.value), ("lo", c.lo), ("hi", c.hi), ("ref_value", c.ref_value)) if _finite(v)]
        rows += [Metric(f"{mode}/{mlflow_name(k)}", float(v), now, int(s)) for mode, s, k, v in metrics if _finite(v)]
        name = f"{run.suite} [{run.profile}]" + (f" seed {run.seed}" if run.seed is not None else "")
        try:
            created = self._client.create_run(self.experiment_id, run_name=name)
        except MlflowException as e:
            self._raise(e, "create a run")
        run_id = created.info.run_id
        try:
            for part in _chunks(tags, 100):
                self._client.log_batch(run_id, tags=list(part))
            for part in _chunks(params, 100):
                self._client.log_batch(run_id, params=list(part))
            for part in _chunks(rows, 1000):
                self._client.log_batch(run_id, metrics=list(part))
            if report is not None and Path(report).is_file():
                self._client.log_artifact(run_id, str(report))
            self._client.set_terminated(run_id, "FINISHED")
        except BaseException as e:
            with contextlib.suppress(Exception):  # the first error is the one to report
                self._client.set_terminated(run_id, "FAILED")
            if isinstance(e, MlflowException):
                self._raise(e, f"write run {run_id}")
            raise
        return str(run_id)

    # ------------------------------------------------------------------ reading
    def trusted_values(self, suite: str, profile: str, check_id: str, *, match: dict[str, str],
                       last: int) -> list[tuple[str, float]]:
        """(run id, value) of `check_id` in the last `last` FINISHED trusted runs of suite x profile
        whose `match` tags (arch, device, host) equal the given ones and that logged a value; newest first."""
        from mlflow.exceptions import MlflowException

        for k in match:
            if k not in MATCH_KEYS:
                raise ValueError(f"match key {k!r}: one of {', '.join(MATCH_KEYS)}")
        query = " and ".join([f"tags.`rlbench.{k}` = '{_quoted(v)}'" for k, v in
                              (("suite", suite), ("profile", profile), ("trusted", "1"))]
                             + ["attributes.status = 'FINISHED'"])
        key = f"{check_key(check_id)}.value"
        out: list[tuple[str, float]] = []
        token = None
        try:
            while len(out) < last:
                page = self._client.search_runs([self.experiment_id], filter_string=query, max_results=200,
                                                order_by=["attributes.start_time DESC"], page_token=token)
                for r in page:
                    if all(r.data.tags.get(f"rlbench.{k}", "") == v for k, v in match.items()) \
                            and key in r.data.metrics and len(out) < last:
                        out.append((r.info.run_id, float(r.data.metrics[key])))
                token = page.token
                if not token:
                    break
        except MlflowException as e:
            self._raise(e, f"search the trusted runs of {suite} [{profile}]")
        return out

    def recent_runs(self, suite: str, profile: str, mode: str, device: str, *, last: int = 20) -> list[StoredRun]:
        """The last `last` FINISHED runs (trusted or not) of suite x profile with these modes ("+"-joined)
        on `device`, with their checks (tags and step-0 metrics); newest first. The report's trend charts
        read them. One search_runs call: a run's latest metric values come with it."""
        from mlflow.exceptions import MlflowException

        query = " and ".join([f"tags.`rlbench.{k}` = '{_quoted(v)}'" for k, v in
                              (("suite", suite), ("profile", profile), ("mode", mode), ("device", device))]
                             + ["attributes.status = 'FINISHED'"])
        try:
            page = self._client.search_runs([self.experiment_id], filter_string=query, max_results=int(last),
                                            order_by=["attributes.start_time DESC"])
        except MlflowException as e:
            self._raise(e, f"search the runs of {suite} [{profile}]")
        return [StoredRun(r.info.run_id, stored_record(r.data.tags), stored_checks(r.data.tags, r.data.metrics))
                for r in page]


def stored_record(tags: dict[str, str]) -> RunRecord:
    """The RunRecord of a run this store wrote, from its `rlbench.*` tags (versions are params: left out)."""
    t = {k[len("rlbench."):]: v for k, v in tags.items() if k.startswith("rlbench.")}
    seed = t.get("seed")
    return RunRecord(suite=t.get("suite", ""), profile=t.get("profile", ""), mode=t.get("mode", ""),
                     arch=t.get("arch", ""), device=t.get("device", ""), source=t.get("source", ""),
                     verdict=t.get("verdict", ""), seed=int(seed) if seed and seed.lstrip("-").isdigit() else None,
                     host=t.get("host", ""), git_commit=t.get("commit"),
                     dirty=None if t.get("dirty") is None else t["dirty"] == "1", started=t.get("started"),
                     finished=t.get("finished", ""), trusted=t.get("trusted") == "1", folder=t.get("folder", ""),
                     command=t.get("command", ""))


def stored_checks(tags: dict[str, str], metrics: dict[str, float]) -> dict[str, CheckRow]:
    """The checks of a run this store wrote, by check id: the `check.<key>.*` tags and step-0 metrics."""
    out = {}
    for tag, cid in tags.items():
        if not (tag.startswith("check.") and tag.endswith(".id")):
            continue
        key = tag[:-len(".id")]
        num = {f: float(metrics[f"{key}.{f}"]) if f"{key}.{f}" in metrics else None
               for f in ("value", "lo", "hi", "ref_value")}
        out[cid] = CheckRow(check_id=cid, verdict=tags.get(f"{key}.verdict", ""), mode=tags.get(f"{key}.mode", ""),
                            metric=tags.get(f"{key}.metric", ""), message=tags.get(f"{key}.message", ""), **num)
    return out


def _quoted(value: str) -> str:
    """A value inside a search_runs filter string's single quotes."""
    if "'" in value:
        raise StoreError(f"{value!r}: a suite or profile with a quote cannot be searched in MLflow; rename it")
    return value
