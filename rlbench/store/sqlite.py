"""The embedded results store: one SQLite file that every `pytest suites/`, `rlbench run` and
`rlbench check` appends its runs to (suite, profile, machine, versions, every check, every step).

    from rlbench.store.sqlite import ResultsStore
    store = ResultsStore("results.sqlite")
    run_id = store.append(RunRecord(suite="x", profile="cpu", ...), checks=[...], metrics=[...])
    store.trusted_values("x", "cpu", "perf/throughput:median>=history", match={"device": "cpu"}, last=10)

    sqlite3 results.sqlite "select suite, profile, device, verdict, finished from runs order by id desc limit 5"

Why SQLite and not DuckDB: SQLite is in Python's standard library (no dependency on CI runners or in
the ROCm/CUDA images), and its write-ahead log (WAL) lets two CI jobs append to one file at once
(writers queue on the database lock, `busy_timeout` waits for it) while readers go on reading.
Each run is appended in one transaction (`BEGIN IMMEDIATE` ... `COMMIT`): a writer killed with
SIGKILL mid-write leaves the file as it was before that run, never a run without its checks, and
the next open rolls the torn write back. DuckDB's single-writer-process lock would make the second
CI job fail instead of wait. What WAL needs: the file on a local disk (not NFS/SMB, where SQLite's
locks are unreliable), and the `-wal`/`-shm` files beside it writable by every job.

Schema (version 1): `runs` (one row per suite x profile x seed evaluated), `checks` (one row per
check result of a run: value, band, verdict, message) and `metrics` (one row per run, mode, step and
metric key). Values are REAL; NaN and infinities are stored as NULL.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from typing_extensions import Self

from trainer.errors import RLBenchError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 120_000  # a writer waits this long for another job's transaction to end

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    suite TEXT NOT NULL, profile TEXT NOT NULL, mode TEXT NOT NULL, seed INTEGER,
    arch TEXT NOT NULL, device TEXT NOT NULL, host TEXT NOT NULL DEFAULT '',
    versions TEXT NOT NULL DEFAULT '{}', git_commit TEXT, dirty INTEGER,
    started TEXT, finished TEXT NOT NULL,
    trusted INTEGER NOT NULL DEFAULT 0, source TEXT NOT NULL, verdict TEXT NOT NULL,
    folder TEXT NOT NULL DEFAULT '', command TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS runs_lookup ON runs (suite, profile, trusted, id);
CREATE TABLE IF NOT EXISTS checks (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    check_id TEXT NOT NULL, mode TEXT NOT NULL DEFAULT '', metric TEXT NOT NULL DEFAULT '',
    value REAL, lo REAL, hi REAL, ref_value REAL,
    verdict TEXT NOT NULL, message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS checks_run ON checks (run_id);
CREATE INDEX IF NOT EXISTS checks_id ON checks (check_id, run_id);
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    mode TEXT NOT NULL DEFAULT '', step INTEGER NOT NULL, key TEXT NOT NULL, value REAL
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run_id, key);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

MATCH_KEYS = ("arch", "device", "host")  # what a history lookup may require equal to this run's


@dataclass
class RunRecord:
    """One run's row in `runs`: what ran, where, with what, and what it concluded."""

    suite: str
    profile: str
    mode: str  # the modes evaluated, "+"-joined (e.g. "colocated+fully_async")
    arch: str
    device: str
    source: str  # pytest | run | check
    verdict: str
    seed: int | None = None
    host: str = ""
    versions: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    dirty: bool | None = None
    started: str | None = None
    finished: str = ""
    trusted: bool = False
    folder: str = ""
    command: str = ""


@dataclass
class CheckRow:
    check_id: str
    verdict: str
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    ref_value: float | None = None
    mode: str = ""
    metric: str = ""
    message: str = ""


@dataclass
class StoredRun:
    """A run read back, with its checks by id."""

    id: int | str  # the SQLite row id, or the MLflow run id
    record: RunRecord
    checks: dict[str, CheckRow]


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class StoreError(RLBenchError):
    """The store file cannot be opened or is not an rlbench store (message names the file and the fix)."""


class ResultsStore:
    """An rlbench results store in one SQLite file (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder; the results store is one file, e.g. {self.path}/results.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")  # a committed run survives power loss too
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.executescript(SCHEMA)
            found = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if found is None:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(found[0]) != SCHEMA_VERSION:
                raise StoreError(f"{self.path}: store schema {found[0]}, this rlbench reads {SCHEMA_VERSION}; "
                                 "use a new store file or the rlbench that wrote it")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not an rlbench results store ({e}); point --store / RLBENCH_STORE "
                             "at a new file or at one rlbench wrote") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def append(self, run: RunRecord, checks: Iterable[CheckRow] = (),
               metrics: Iterable[tuple[str, int, str, float | None]] = ()) -> int:
        """Write one run with its checks and metrics (mode, step, key, value) in one transaction; its id."""
        row = asdict(run)
        row["versions"] = json.dumps(run.versions, sort_keys=True, default=str)
        row["finished"] = run.finished or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        row["trusted"] = int(bool(run.trusted))
        row["dirty"] = None if run.dirty is None else int(run.dirty)
        cols = list(row)
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            cur = db.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                             [row[c] for c in cols])
            run_id = int(cur.lastrowid or 0)
            db.executemany("INSERT INTO checks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           ((run_id, c.check_id, c.mode, c.metric, _num(c.value), _num(c.lo), _num(c.hi),
                             _num(c.ref_value), c.verdict, c.message) for c in checks))
            db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?)",
                           ((run_id, m, int(s), k, _num(v)) for m, s, k, v in metrics))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return run_id

    # ------------------------------------------------------------------ reading
    def runs(self, suite: str | None = None, profile: str | None = None, trusted: bool | None = None,
             limit: int | None = None) -> list[StoredRun]:
        """Runs, newest first, with their checks."""
        where, args = self._where(suite=suite, profile=profile, trusted=trusted)
        sql = f"SELECT * FROM runs {where} ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        out = []
        for r in self._db.execute(sql, args).fetchall():
            out.append(StoredRun(r[0], self._record(r), self.checks(r[0])))
        return out

    def checks(self, run_id: int) -> dict[str, CheckRow]:
        rows = self._db.execute("SELECT check_id, verdict, value, lo, hi, ref_value, mode, metric, message "
                                "FROM checks WHERE run_id = ?", (run_id,)).fetchall()
        return {r[0]: CheckRow(*r) for r in rows}

    def metrics(self, run_id: int) -> list[tuple[str, int, str, float | None]]:
        return [tuple(r) for r in self._db.execute(  # type: ignore[misc]
            "SELECT mode, step, key, value FROM metrics WHERE run_id = ? ORDER BY mode, step, key", (run_id,))]

    def recent_runs(self, suite: str, profile: str, mode: str, device: str, *, last: int = 20) -> list[StoredRun]:
        """The last `last` runs (trusted or not) of suite x profile with these modes ("+"-joined) on
        `device`, with their checks; newest first. The report's trend charts read them."""
        where, args = self._where(suite=suite, profile=profile, mode=mode, device=device)
        rows = self._db.execute(f"SELECT * FROM runs {where} ORDER BY id DESC LIMIT ?", [*args, int(last)]).fetchall()
        return [StoredRun(r[0], self._record(r), self.checks(r[0])) for r in rows]

    def trusted_values(self, suite: str, profile: str, check_id: str, *, match: dict[str, str],
                       last: int) -> list[tuple[int, float]]:
        """(run id, value) of `check_id` in the last `last` trusted runs of suite x profile whose
        `match` columns (arch, device, host) equal the given ones and that logged a value; newest first."""
        for k in match:
            if k not in MATCH_KEYS:
                raise ValueError(f"match key {k!r}: one of {', '.join(MATCH_KEYS)}")
        where, args = self._where(suite=suite, profile=profile, trusted=True, **match)
        sql = (f"SELECT runs.id, checks.value FROM runs JOIN checks ON checks.run_id = runs.id {where} "
               "AND checks.check_id = ? AND checks.value IS NOT NULL ORDER BY runs.id DESC LIMIT ?")
        return [(int(i), float(v)) for i, v in self._db.execute(sql, [*args, check_id, int(last)])]

    def _where(self, **eq: Any) -> tuple[str, list[Any]]:
        parts, args = [], []
        for k, v in eq.items():
            if v is None:
                continue
            parts.append(f"runs.{k} = ?")
            args.append(int(v) if isinstance(v, bool) else v)
        return ("WHERE " + " AND ".join(parts)) if parts else "WHERE 1", args

    @staticmethod
    def _record(r: Sequence[Any]) -> RunRecord:
        (_, suite, profile, mode, seed, arch, device, host, versions, commit, dirty, started, finished,
         trusted, source, verdict, folder, command) = r
        return RunRecord(suite=suite, profile=profile, mode=mode, seed=seed, arch=arch, device=device, host=host,
                         versions=json.loads(versions or "{}"), git_commit=commit,
                         dirty=None if dirty is None else bool(dirty), started=started, finished=finished,
                         trusted=bool(trusted), source=source, verdict=verdict, folder=folder, command=command)
