"""The results store (rlbench/store/): a run survives a writer killed with SIGKILL mid-write (no partial
run visible), two processes writing at once both land, and what a check appends reads back.

    pytest tests/unit/test_store.py -q
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlbench.store.sqlite import ResultsStore, RunRecord, StoreError
from rlbench.store.target import resolve_target
from trainer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"

_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlbench.store.sqlite import CheckRow, ResultsStore, RunRecord

    store, tag, n, marker = ResultsStore(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    while start is not None and not start.exists():
        time.sleep(0.005)

    def rec(i):
        return RunRecord(suite="s", profile="cpu", mode="colocated", arch="cpu", device="cpu", source=tag,
                         verdict="pass", seed=i, trusted=True)

    for i in range(n):
        store.append(rec(i), [CheckRow(f"c{i}", "pass", float(i))], [("colocated", s, "k", float(s)) for s in range(50)])
    print("committed", flush=True)
    if marker != "-":
        def slow_rows():  # a run far larger than the others: the kill lands while it is being written
            for s in range(10**8):
                if s == 200_000:
                    Path(marker).write_text("mid-write")
                yield "colocated", s, "k", float(s)
        store.append(rec(n), [CheckRow("big", "pass", 1.0)], slow_rows())
""")


def _writer(tmp_path: Path, db: Path, tag: str, n: int, marker: str = "-", start: Path | None = None):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    args = [sys.executable, str(script), str(db), tag, str(n), marker] + ([str(start)] if start else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # the tree under test, installed or not


def test_kill_9_mid_write_leaves_earlier_runs_and_no_partial_run(tmp_path: Path) -> None:
    db, marker = tmp_path / "results.sqlite", tmp_path / "marker"
    proc = _writer(tmp_path, db, "job", 3, str(marker))
    deadline = time.time() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.time() < deadline, "the writer never reached the middle of its large run"
        time.sleep(0.01)
    assert (tmp_path / "results.sqlite-wal").stat().st_size > 0  # the big run's pages are being written
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with ResultsStore(db) as store:
        runs = store.runs()
        assert sorted(r.record.seed for r in runs) == [0, 1, 2]  # the killed run is not there at all
        for r in runs:
            assert list(r.checks) == [f"c{r.record.seed}"]
            assert len(store.metrics(r.id)) == 50
        orphans = store._db.execute("SELECT COUNT(*) FROM metrics WHERE run_id NOT IN (SELECT id FROM runs)")
        assert orphans.fetchone()[0] == 0
        assert store._db.execute("SELECT COUNT(*) FROM checks WHERE check_id = 'big'").fetchone()[0] == 0
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        store.append(RunRecord("s", "cpu", "colocated", "cpu", "cpu", "after", "pass", seed=9))  # still writable
    with ResultsStore(db) as store:
        assert len(store.runs()) == 4


def test_two_processes_writing_at_once_both_land(tmp_path: Path) -> None:
    db, start = tmp_path / "results.sqlite", tmp_path / "go"
    ResultsStore(db).close()
    procs = [_writer(tmp_path, db, tag, 40, start=start) for tag in ("job-a", "job-b")]
    time.sleep(1.0)  # both importing and waiting on the start file
    start.write_text("go")
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "committed" in out
    with ResultsStore(db) as store:
        runs = store.runs()
        by_source = {tag: sorted(r.record.seed for r in runs if r.record.source == tag) for tag in ("job-a", "job-b")}
        assert by_source == {"job-a": list(range(40)), "job-b": list(range(40))}
        assert len({r.id for r in runs}) == 80
        ids = [r.id for r in runs if r.record.source == "job-a"]
        assert all(len(store.metrics(i)) == 50 for i in ids[:5])
        # the two jobs' transactions interleaved: neither waited for the other to finish all of its runs
        order = [r.record.source for r in sorted(runs, key=lambda r: r.id)]
        switches = sum(a != b for a, b in itertools.pairwise(order))
        assert switches >= 1


def test_recorded_check_reads_back(tmp_path: Path) -> None:
    """`rlbench check` of the real cpu log with --store: the run, its checks and every step read back."""
    from rlbench.cli import main
    from rlbench.ingest.load import load_metrics

    db = tmp_path / "results.sqlite"
    rc = main([ "check", str(LOG), "--suite", "verl_grpo_qwen3_8b_sglang_gfx950", "--profile", "cpu",
                "--arch", "cpu", "--out", str(tmp_path / "out"), "--store", str(db), "--trusted"])
    assert rc in (0, 1)
    with ResultsStore(db) as store:
        (run,) = store.runs()
        assert (run.record.suite, run.record.profile, run.record.source, run.record.trusted) == \
               ("verl_grpo_qwen3_8b_sglang_gfx950", "cpu", "check", True)
        assert (run.record.arch, run.record.device) == ("cpu", "cpu")
        import json
        doc = json.loads((tmp_path / "out/checks.json").read_text())
        assert run.record.verdict == doc["verdict"]
        assert {r["check_id"]: r["verdict"] for r in doc["results"]} == {k: c.verdict for k, c in run.checks.items()}
        frame = load_metrics(LOG).frame
        rows = store.metrics(run.id)
        expected = int(frame.apply(lambda c: c.notna()).sum().sum())
        assert len(rows) == expected
        got = {(s, k): v for _, s, k, v in rows}
        assert got[(7, "perf/throughput")] == frame.loc[7, "perf/throughput"]


def test_store_target_from_option_and_environment(tmp_path: Path) -> None:
    assert resolve_target(None, False, "run", env={}) is None
    t = resolve_target(None, False, "pytest", env={"RLBENCH_STORE": str(tmp_path / "a.sqlite"), "RLBENCH_TRUSTED": "1"})
    assert t is not None and t.trusted and t.path == tmp_path / "a.sqlite"
    t = resolve_target(str(tmp_path / "b.sqlite"), False, "run", env={"RLBENCH_STORE": str(tmp_path / "a.sqlite")})
    assert t is not None and t.path.name == "b.sqlite" and not t.trusted
    with pytest.raises(ConfigError, match="RLBENCH_TRUSTED='maybe'"):
        resolve_target(None, False, "run", env={"RLBENCH_TRUSTED": "maybe"})
    with pytest.raises(ConfigError, match="none is set"):
        resolve_target(None, True, "run", env={})
    with pytest.raises(ConfigError, match="is a folder"):
        resolve_target(str(tmp_path), False, "run", env={})


def test_not_a_store_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_text("this is not a database file, it is text " * 100)
    with pytest.raises(StoreError, match="not an rlbench results store"):
        ResultsStore(bad)
