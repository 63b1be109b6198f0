"""MLflow as the results store (rlbench/store/mlflow_store.py) and as a log `rlbench check` reads
(rlbench/ingest/mlflow_run.py), against a real `mlflow server` this module starts (sqlite backend, local
artifact root, a free port on 127.0.0.1), once for the module.

    pytest tests/unit/test_mlflow_store.py -q
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="mlflow not installed (pip install 'rlbench[mlflow-server]')")

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
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            # no job runner: its nine huey consumers cost the 2-core machine half a minute at start
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240  # a loaded 2-core CI machine can take minutes to import mlflow
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


def test_check_with_an_unreachable_store_refuses_in_one_line_and_keeps_the_report(tmp_path: Path,
                                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The store is written after the checks: a server that is down stops `rlbench check` with one
    `error:` line naming the store and the fix (exit 2), and the run folder it wrote stays."""
    down = f"mlflow:http://127.0.0.1:{_free_port()}"
    rc = main(["check", str(LOG), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu", "--out", str(tmp_path),
               "--store", down])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2
    server = down[len("mlflow:"):]
    assert errors == [f"error: results store {down}#experiment=rlbench: cannot reach the MLflow tracking server at "
                      + f"{server}; start it or fix --store / RLBENCH_STORE"]
    assert list(tmp_path.rglob("report.html")) and list(tmp_path.rglob("checks.json"))


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


def _steps(throughput: float, acc: float, n: int = 6) -> list[tuple[str, int, str, float]]:
    return [row for s in range(1, n + 1) for row in (("colocated", s, "perf/throughput", throughput + s),
                                                     ("colocated", s, "val-core/x/acc/mean@1", acc + s / 100))]


def test_compare_reads_mlflow_runs_as_sides(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlbench compare mlflow:URI#A mlflow:URI#B1,B2`: the checks and steps the store wrote, compared."""
    from rlbench.report.compare import compare_sides, load_side

    acc_id, tput_id = "val-core/x/acc/mean@1:mean_last[3]~=0.9", "perf/throughput:median>=100"
    written = {"a": (0.90, 150.0, "pass"), "b1": (0.95, 200.0, "pass"), "b2": (0.97, 210.0, "fail")}
    ids = {}
    with MlflowResultsStore(MlflowLocation(server, "compare")) as store:
        for i, (name, (acc, tput, verdict)) in enumerate(written.items()):
            checks = [CheckRow(acc_id, "pass", acc, 0.85, 0.95, 0.9, "colocated", "val-core/x/acc/mean@1", "ok"),
                      CheckRow(tput_id, verdict, tput, 100.0, None, 100.0, "colocated", "perf/throughput", "t")]
            ids[name] = store.append(_record(seed=i), checks, _steps(tput, acc))
    a, b = f"mlflow:{server}#{ids['a']}", f"mlflow:{server}#{ids['b1']},{ids['b2']}"
    side_a, side_b = load_side(a, "A"), load_side(b, "B")
    assert [r.label for r in side_b.runs] == [f"{ids['b1'][:7]} seed 1", f"{ids['b2'][:7]} seed 2"]
    assert list(side_a.runs[0].frames) == ["colocated"]
    assert side_a.runs[0].frames["colocated"]["perf/throughput"].to_dict() == {s: 150.0 + s for s in range(1, 7)}
    rows = {r.check_id: r for r in compare_sides(side_a, side_b)}
    assert rows[acc_id].values == ([0.90], [0.95, 0.97]) and rows[acc_id].verdicts == ("pass 1/1", "pass 2/2")
    assert rows[tput_id].values == ([150.0], [200.0, 210.0]) and rows[tput_id].verdicts == ("pass 1/1",
                                                                                           "pass 1/2, fail 1/2")
    assert rows[tput_id].statement == f"B/A = {205.0 / 150.0:.3f}x"
    assert rows["perf/throughput:median@colocated"].values == ([153.5], [203.5, 213.5])  # medians of the steps
    assert "no interval: 1 and 2 seeds" in rows[acc_id].statement

    out = tmp_path / "compare.html"
    assert main(["compare", a, b, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"A: {ids['a']} (1 run(s): {ids['a'][:7]} seed 0)" in text
    assert f"{acc_id}\n    A pass 1/1 (mean 0.9) | B pass 2/2 (mean 0.96) | B-A = +0.06" in text
    page = out.read_text()
    assert page.count('class="rlbench-chart"') == 2  # the two checked metrics, both sides' curves


def test_compare_refuses_an_unreadable_mlflow_side(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"mlflow:{server}#0123456789abcdef"
    assert main(["compare", missing, missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {missing}: no run 0123456789abcdef on {server}; copy")
    down = f"mlflow:http://127.0.0.1:{_free_port()}#abc"
    assert main(["compare", down, down]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {down}: cannot reach the MLflow tracking server" in err
    mc = MlflowClient(tracking_uri=server)
    other = mc.create_run(mc.create_experiment("foreign")).info.run_id  # logged by another tool: no checks
    mc.log_metric(other, "perf/throughput", 1.0, step=1)
    assert main(["compare", f"mlflow:{server}#{other}", f"mlflow:{server}#{other}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a run with no rlbench checks; give --suite and --profile" in err


def test_trend_charts_from_an_mlflow_history(server: str, tmp_path: Path) -> None:
    """recent_runs on MLflow: the FINISHED runs of suite x profile x modes x device, newest first; the
    report's trend chart draws them (rlbench/report/trends.py)."""
    import pandas as pd

    from rlbench.checks.results import CheckResult
    from rlbench.report.html import render_report
    from rlbench.report.trends import load_trends
    from tests.unit.test_report_trends import charts_by_check, trace

    cid = "val-core/x/acc/mean@1:mean_last[3]~=history"
    where = MlflowLocation(server, "trends")
    with MlflowResultsStore(where) as store:
        ids = [store.append(_record(i, trusted=i % 4 != 3), [CheckRow(cid, "pass", 0.8 + i / 100, 0.7, 0.9)])
               for i in range(11)]
        store.append(_record(99, device="MI300X"), [CheckRow(cid, "pass", 0.1)])
        store.append(_record(98, mode="colocated+fully_async"), [CheckRow(cid, "pass", 0.2)])
    trends = load_trends(where, suite="s", profile="cpu", mode="colocated", device="cpu")
    assert [r.id for r in trends.runs] == ids[::-1]
    assert [r.record.trusted for r in trends.runs[::-1]] == [i % 4 != 3 for i in range(11)]
    current = [CheckResult(cid, "pass", "val-core/x/acc/mean@1", "mean_last[3]", "", 0.85, "", "",
                           ref_band=(0.72, 0.92))]
    frame = pd.DataFrame({"val-core/x/acc/mean@1": [0.85]}, index=pd.Index([1], name="step"))
    page = render_report(tmp_path / "r.html", title="t", runs={"colocated": frame}, results=current, env={},
                         trends=trends).read_text()
    fig = charts_by_check(page)[cid]
    assert trace(fig, "value")["x"] == [i[:7] for i in ids] + ["this run"]
    assert trace(fig, "value")["y"] == pytest.approx([0.8 + i / 100 for i in range(11)] + [0.85])
    assert trace(fig, "band lo")["y"] == [0.7] * 11 + [0.72] and trace(fig, "band hi")["y"] == [0.9] * 11 + [0.92]
    assert trace(fig, "untrusted")["x"] == [ids[3][:7], ids[7][:7]] and len(trace(fig, "trusted")["x"]) == 9


def test_pytest_suites_writes_mlflow_runs_that_check_and_compare_read_back(server: str, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`pytest suites/ --rlbench-logs DIR --rlbench-store mlflow:URI` (validating a user's verl log, twice: the
    second log with a lower accuracy) writes one FINISHED MLflow run each; `rlbench check mlflow:URI#RUN_ID`
    reads one back with the same verdicts, and `rlbench compare` sets the two side by side."""
    from tests.helpers.verl_logs import write_qwen3_8b_grpo_log

    experiment = "suites-e2e"
    for name, kw in (("good", {}), ("worse", {"gsm8k_peak": 0.90})):
        logs = tmp_path / name / "logs"
        write_qwen3_8b_grpo_log(logs / SUITE / "full" / "colocated.jsonl", **kw)
        res = subprocess.run([sys.executable, "-m", "pytest", "suites", "-q", "-p", "no:cacheprovider", "--arch", "gfx950",
                              "--profile", "full", "-k", SUITE, "--rlbench-logs", str(logs),
                              "--rlbench-out", str(tmp_path / name / "runs"),
                              "--rlbench-store", f"mlflow:{server}#experiment={experiment}"],
                             check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode in (0, 1), res.stdout[-2000:] + res.stderr[-2000:]
    mc = MlflowClient(tracking_uri=server)
    runs = mc.search_runs([mc.get_experiment_by_name(experiment).experiment_id], order_by=["attributes.start_time"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    assert {r.data.tags["rlbench.source"] for r in runs} == {"pytest"}
    good, worse = (r.info.run_id for r in runs)
    written = json.loads((tmp_path / "good" / "runs" / SUITE / "full" / "checks.json").read_text())
    rc = main(["check", f"mlflow:{server}#{good}", "--suite", SUITE, "--profile", "full", "--arch", "gfx950",
               "--out", str(tmp_path / "readback")])
    assert rc == 0, capsys.readouterr().err
    read = json.loads((tmp_path / "readback" / "checks.json").read_text())

    def verdicts(doc: dict) -> list:
        return sorted((r["check_id"], r["verdict"]) for r in doc["results"])

    assert verdicts(read) == verdicts(written) and len(verdicts(read)) >= 10
    out = tmp_path / "cmp.html"
    assert main(["compare", f"mlflow:{server}#{good}", f"mlflow:{server}#{worse}", "--out", str(out)]) in (0, 1)
    text = capsys.readouterr().out
    # the planted accuracy drop: the GSM8K peak passes on A, fails on B, and the difference is B's lower peak
    assert re.search(r"gsm8k/acc/mean@1:peak>=0.956\n\s+A pass 1/1 \(mean 0.95\d+\) \| B fail 1/1 \(mean 0.89\d+\) "
                     r"\| B-A = -0.05", text), text
    assert re.search(r"MATH/acc/mean@1:peak>=0.839\n\s+A pass 1/1 .* \| B pass 1/1 .* \| B-A = \+0", text), text
    assert out.is_file() and "Plotly.newPlot" in out.read_text()
