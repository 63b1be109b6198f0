"""MLflow as the results store (rlbench/store/mlflow_store.py) and as a log `rlbench check` reads
(rlbench/ingest/mlflow_run.py), against a real `mlflow server` this module starts (sqlite backend, local
artifact root, a free port on 127.0.0.1), once for the module.

    pytest tests/unit/test_mlflow_store.py -q
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="mlflow not installed (pip install 'rlbench[mlflow]')")

from mlflow.tracking import MlflowClient

from rlbench.checks.history import HistorySource, history_values
from rlbench.cli import main
from rlbench.ingest.load import load_metrics
from rlbench.ingest.mlflow_run import read_mlflow_run
from rlbench.store.mlflow_client import from_mlflow_name, mlflow_name
from rlbench.store.mlflow_store import MlflowResultsStore
from rlbench.store.sqlite import CheckRow, RunRecord, StoreError
from rlbench.store.target import MlflowLocation, resolve_target
from rlbench.suites.suite import History
from trainer.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "reports/cpu/grpo_smollm2_arithmetic.metrics.jsonl"
SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server: its URI, up (/health) before the first test, killed at the end."""
    tmp = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", str(tmp / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not come up: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield uri
    finally:
        os.killpg(proc.pid, 9)  # the server and its uvicorn workers: a session of their own
        proc.wait(timeout=30)
        log.close()


def _record(seed: int = 0, trusted: bool = True, device: str = "cpu", mode: str = "colocated") -> RunRecord:
    return RunRecord(suite="s", profile="cpu", mode=mode, arch="cpu", device=device, source="check",
                     verdict="pass", seed=seed, trusted=trusted, versions={"torch": "2.13.0+cpu"},
                     git_commit="abc123", dirty=False)


def test_check_appends_to_mlflow_and_reads_the_run_back(server: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`rlbench check LOG --store mlflow:URI` writes one MLflow run (tags, checks, every step, the
    report); `rlbench check mlflow:URI#RUN_ID` reads it back: every value and every verdict equal."""
    store = f"mlflow:{server}#experiment=round-trip"
    args = ["--suite", SUITE, "--profile", "cpu", "--arch", "cpu"]
    rc = main(["check", str(LOG), *args, "--out", str(tmp_path / "a"), "--store", store, "--trusted"])
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    assert f"results store {MlflowLocation(server, 'round-trip')}: appended trusted run(s)" in err
    mc = MlflowClient(tracking_uri=server)
    exp = mc.get_experiment_by_name("round-trip")
    (run,) = mc.search_runs([exp.experiment_id])
    tags = run.data.tags
    assert run.info.status == "FINISHED" and run.info.run_name == f"{SUITE} [cpu] seed 0"
    assert {k: tags[f"rlbench.{k}"] for k in ("suite", "profile", "mode", "arch", "device", "trusted", "source")} \
        == {"suite": SUITE, "profile": "cpu", "mode": "colocated", "arch": "cpu", "device": "cpu", "trusted": "1",
            "source": "check"}
    assert [a.path for a in mc.list_artifacts(run.info.run_id)] == ["report.html"]

    written = json.loads((tmp_path / "a" / "checks.json").read_text())["results"]
    for r in written:
        key = f"check.{mlflow_name(r['check_id'])}"
        assert tags[f"{key}.id"] == r["check_id"] and tags[f"{key}.verdict"] == r["verdict"]
        if r["actual"] is not None:
            assert run.data.metrics[f"{key}.value"] == r["actual"]

    frame = load_metrics(LOG).frame
    log_values = {(k, int(s)): v for k, col in frame.items() for s, v in col.dropna().items()}
    back = read_mlflow_run(f"mlflow:{server}#{run.info.run_id}")[0]
    got = {(k, int(s)): v for k, col in back.items() for s, v in col.dropna().items()}
    assert len(got) > 1000 and got == log_values  # every number, every step, as doubles

    rc2 = main(["check", f"mlflow:{server}#{run.info.run_id}", *args, "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert rc2 == rc and f"colocated: mlflow:{server}#{run.info.run_id} (mlflow, 31 steps: steps 0-30" in err
    again = json.loads((tmp_path / "b" / "checks.json").read_text())["results"]
    assert [(r["check_id"], r["verdict"], r["actual"]) for r in again] == \
        [(r["check_id"], r["verdict"], r["actual"]) for r in written]


def test_trusted_values_for_history_gates(server: str) -> None:
    """History reads the FINISHED trusted runs of the suite x profile on the matching device, newest first."""
    where = MlflowLocation(server, "history")
    cid = "perf/throughput:median>=history"
    with MlflowResultsStore(where) as store:
        for i, (trusted, device) in enumerate([(True, "cpu"), (True, "cpu"), (False, "cpu"), (True, "MI300X"),
                                               (True, "cpu")]):
            store.append(_record(i, trusted, device), [CheckRow(cid, "pass", 100.0 + i, 95.0, 105.0)])
        got = store.trusted_values("s", "cpu", cid, match={"device": "cpu"}, last=10)
        assert [v for _, v in got] == [104.0, 101.0, 100.0]
        assert [v for _, v in store.trusted_values("s", "cpu", cid, match={"device": "cpu"}, last=2)] == [104.0, 101.0]
        assert store.trusted_values("s", "cpu", "other-check", match={}, last=10) == []
    src = HistorySource(store=where, suite="s", profile="cpu", arch="cpu", device="MI300X")
    assert history_values(History(rule="median_rel", last=10, band=0.05), src, cid) == [103.0]


def test_modes_and_names_round_trip(server: str) -> None:
    """A run of two modes reads one mode at a time; names MLflow refuses (`@`, `>=`, `[`) read back as logged."""
    odd = "val-core/x/acc/mean@1:mean_last[3]~=0.9@colocated"
    assert from_mlflow_name(mlflow_name(odd)) == odd
    rows = [(m, s, "val-core/x/acc/mean@1", s / 10 + (m == "fully_async")) for m in ("colocated", "fully_async")
            for s in range(5)]
    with MlflowResultsStore(MlflowLocation(server, "modes")) as store:
        run_id = store.append(_record(mode="colocated+fully_async"), [CheckRow(odd, "pass", 0.4)], rows)
    data = MlflowClient(tracking_uri=server).get_run(run_id).data
    assert data.tags[f"check.{mlflow_name(odd)}.id"] == odd and data.params["version.torch"] == "2.13.0+cpu"
    assert data.tags["rlbench.commit"] == "abc123" and data.tags["rlbench.dirty"] == "0"
    for mode in ("colocated", "fully_async"):
        frame, warnings = read_mlflow_run(f"mlflow:{server}#{run_id}/{mode}")
        assert list(frame.columns) == ["val-core/x/acc/mean@1"] and not warnings
        assert frame["val-core/x/acc/mean@1"].to_dict() == {s: v for m, s, _, v in rows if m == mode}
    with pytest.raises(DataError, match=f"holds modes colocated, fully_async; name one: mlflow:.*#{run_id}/colocated"):
        read_mlflow_run(f"mlflow:{server}#{run_id}")
    with pytest.raises(DataError, match="mode sync_async is not in this run"):
        read_mlflow_run(f"mlflow:{server}#{run_id}/sync_async")


def test_refusals(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    mc = MlflowClient(tracking_uri=server)
    empty = mc.create_run(mc.create_experiment("empty")).info.run_id
    with pytest.raises(DataError, match=f"run {empty} on {server} has no metric"):
        read_mlflow_run(f"mlflow:{server}#{empty}")
    with pytest.raises(DataError, match=f"no run 0123456789abcdef on {server}; copy the run id"):
        read_mlflow_run(f"mlflow:{server}#0123456789abcdef")
    with pytest.raises(DataError, match="an MLflow run is mlflow:TRACKING_URI#RUN_ID"):
        read_mlflow_run(f"mlflow:{server}")
    down = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(DataError, match=f"cannot reach the MLflow tracking server at {down}"):
        read_mlflow_run(f"mlflow:{down}#abc")
    with pytest.raises(StoreError, match=f"cannot reach the MLflow tracking server at {down}"):
        MlflowResultsStore(MlflowLocation(down, "x"))
    assert time.monotonic() - t0 < 30  # no minutes of retries
    rc = main(["check", f"mlflow:{server}#0123456789abcdef", "--suite", SUITE, "--profile", "cpu", "--arch", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: mlflow:")


def test_store_target_selects_mlflow() -> None:
    t = resolve_target("mlflow:http://h:5000#experiment=nightly", True, "run", env={})
    assert t is not None and t.path == MlflowLocation("http://h:5000", "nightly") and t.trusted
    t = resolve_target(None, False, "pytest", env={"RLBENCH_STORE": "https://h", "RLBENCH_MLFLOW_EXPERIMENT": "ci"})
    assert t is not None and t.path == MlflowLocation("https://h", "ci")
    t = resolve_target("results.sqlite", False, "run", env={})
    assert t is not None and t.path == Path("results.sqlite")
    with pytest.raises(ConfigError, match="the part after # must be experiment=NAME"):
        resolve_target("mlflow:http://h:5000#exp=x", False, "run", env={})
    with pytest.raises(ConfigError, match="no tracking URI after mlflow:"):
        resolve_target("mlflow:", False, "run", env={})
