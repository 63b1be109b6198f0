"""The suites pytest plugin, through pytester: arch contradiction stops the session, profiles this
machine cannot run are skipped with reasons (never a pass), `--rlbench-logs` checks logs shaped
like the published Qwen3-8B run, `-k` selects, the session report is written, and a plain run of
another folder never loads the plugin."""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch  # noqa: F401 - imported before pytester's in-process runs, which drop modules they import

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlbench.run.pytest_plugin import expected_check_ids
from rlbench.suites.suite import load_suite
from tests.helpers.verl_logs import write_qwen3_8b_grpo_log

pytest_plugins = ["pytester"]

SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"
DAPO = "verl_dapo_qwen25_math_7b_fully_async_gfx942"



@pytest.fixture()
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A checkout-like tree: suites/ with the real conftest and two suite files, and a tests/ folder."""
    suites = pytester.mkdir("suites")
    shutil.copy(ROOT / "suites" / "conftest.py", suites / "conftest.py")
    for sid in (SUITE, DAPO):
        shutil.copy(ROOT / "suites" / f"{sid}.yaml", suites / f"{sid}.yaml")
    tests = pytester.mkdir("tests")
    (tests / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    return pytester


def _args(p: pytest.Pytester, *extra: str) -> list[str]:
    return ["suites", "-p", "no:cacheprovider", "-rs", "--rlbench-out", str(p.path / "runs"), *extra]


def test_arch_contradicting_machine_stops_at_start(project: pytest.Pytester) -> None:
    res = project.runpytest(*_args(project, "--arch", "gfx950"))
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    err = res.stderr.str()
    assert "--arch gfx950 but this machine is cpu" in err and "MI350X/MI355X" in err
    assert "passed" not in res.stdout.str()


@pytest.mark.parametrize("arch, shown, hint", [("gfx9500", "gfx9500", "did you mean gfx950?"),
                                               ("CPU", "CPU", "did you mean cpu?"), ("", "''", "")])
def test_unknown_arch_stops_at_start_naming_the_known_ones(project: pytest.Pytester, arch: str, shown: str,
                                                           hint: str) -> None:
    """As `rlbench check` refuses them: no "a gfx9500 GPU", no "a CPU GPU", and '' is not "not given"."""
    res = project.runpytest(*_args(project, "--arch", arch, "--collect-only"))
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    err = res.stderr.str()
    assert f"--arch {shown}: not a known arch; choose one of cpu, gfx942, gfx950, sm_80, sm_90" in err, err
    assert hint in err and "GPU, or use --arch" not in err


def test_rlbench_device_unknown_or_without_logs_stops_at_start(project: pytest.Pytester, tmp_path: Path) -> None:
    res = project.runpytest(*_args(project, "--arch", "cpu", "--rlbench-device", "MI300X", "--collect-only"))
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "--rlbench-device MI300X: names the board of logs made elsewhere" in res.stderr.str()
    res = project.runpytest(*_args(project, "--arch", "gfx950", "--rlbench-logs", str(tmp_path),
                                   "--rlbench-device", "MI355", "--collect-only"))
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "--rlbench-device MI355: matches no known board; did you mean MI355X?" in res.stderr.str()


def test_profiles_that_cannot_run_are_skipped_with_reasons(project: pytest.Pytester) -> None:
    res = project.runpytest(*_args(project, "--arch", "cpu", "--profile", "full,mini"))
    outcomes = res.parseoutcomes()
    assert outcomes.get("passed", 0) == 0 and outcomes.get("failed", 0) == 0
    assert outcomes["skipped"] > 20
    out = res.stdout.str()
    assert "cannot run here: needs 8 GPUs of arch gfx950" in out  # qwen3-8b full
    assert "needs 32 GPUs of arch gfx942" in out  # dapo full
    assert "needs 1 GPU" in out and "needs sglang installed" in out  # mini
    assert "rlbench: arch cpu, device cpu, profiles full,mini, runs into" in out  # report header
    assert not (project.path / "runs" / SUITE).exists()  # nothing trained


def _logs(p: pytest.Pytester, **kw: float) -> Path:
    logs = p.path / "logs"
    write_qwen3_8b_grpo_log(logs / SUITE / "full" / "colocated.jsonl", **kw)
    return logs


def test_rlbench_logs_pass(project: pytest.Pytester) -> None:
    logs = _logs(project)
    report = project.path / "session.html"
    res = project.runpytest(*_args(project, "--arch", "gfx950", "--profile", "full", "--rlbench-logs", str(logs),
                                   "--rlbench-report", str(report)))
    outcomes = res.parseoutcomes()
    assert outcomes["passed"] == 11 and outcomes.get("failed", 0) == 0  # the suite's 11 full references
    assert "no logs for verl_dapo_qwen25_math_7b_fully_async_gfx942 [full]" in res.stdout.str()
    out = res.stdout.str()
    # status line, not captured: this profile's checks, then those of other profiles (no items)
    assert re.search(rf"\[rlbench\] {SUITE} \[full\]: PASS: 11 pass \(\+\d+ of other profiles\)", out)
    html = report.read_text()
    assert "Plotly.newPlot" in html and "Qwen3-8B" in html
    # The report states pytest's numbers and the profile that could not run, with its item count.
    assert f"pytest items: 11 passed, {outcomes['skipped']} skipped." in html
    assert f"{outcomes['skipped']} checks of verl DAPO" in html and "could not run here: no logs for" in html
    assert "<b>10</b> of 10 published references" in html
    assert (project.path / "runs" / SUITE / "full" / "checks.json").is_file()


def test_rlbench_logs_failing_check_is_one_line(project: pytest.Pytester) -> None:
    logs = _logs(project, gsm8k_peak=0.90)
    res = project.runpytest(*_args(project, "--arch", "gfx950", "--profile", "full", "--rlbench-logs", str(logs),
                                   "-k", SUITE))
    outcomes = res.parseoutcomes()
    assert outcomes["failed"] == 3 and outcomes["passed"] == 8
    out = res.stdout.str()
    assert "val-core/openai/gsm8k/acc/mean@1 peak over steps 0-200 = 0.900 (at step" in out
    assert ">= 0.926 (0.956 - tol 0.03; 000_af77aeb111e0721a.txt: GSM8K peak 0.956): FAIL" in out
    assert "Traceback" not in out and "def runtest" not in out and "CheckFailed" not in out


def test_k_selects_items(project: pytest.Pytester) -> None:
    logs = _logs(project)
    res = project.runpytest(*_args(project, "--arch", "gfx950", "--profile", "full", "--rlbench-logs", str(logs),
                                   "-k", "qwen3_8b and peak"))
    outcomes = res.parseoutcomes()
    assert outcomes == {"passed": 2, "deselected": outcomes["deselected"]}  # GSM8K peak and MATH peak


def test_plain_run_of_tests_does_not_load_the_plugin(project: pytest.Pytester) -> None:
    res = project.runpytest("tests", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res = project.runpytest("tests", "-p", "no:cacheprovider", "--arch", "cpu")
    assert res.ret == pytest.ExitCode.USAGE_ERROR  # --arch is unknown outside suites/


def test_collection_names_and_ids() -> None:
    suite = load_suite(ROOT / "suites" / f"{SUITE}.yaml")
    ids = [cid for ref in suite.references for cid in expected_check_ids(suite, "cpu", ref)]
    assert ids == [
        "actor/pg_loss:no_nan",
        "critic/score/mean:delta>=0.05",
        "actor/ppo_kl:first<=0.05",
        "training/rollout_probs_diff_max:each in [0,0.0001]",
        "actor/ppo_kl_first_minibatch:each in [-1e-05,1e-05]",
        "actor/pg_clipfrac_first_minibatch:each in [0,0]",
        "training/weight_sync_max_abs_diff:each in [0,0]",
        "critic/advantages/group_mean_abs_max:each in [0,0.0001]",
        "actor/grad_norm:each in [0,50]",
        "actor/kl_loss:max<=0.5",
        "critic/score/mean:each in [0,1]",
        "val-core/synthetic/arithmetic/acc/mean@1:first~=0.625",
        "response_length/mean:each in [1,24]",
        "golden:colocated:critic/score/mean:mean_last[4]",
        "golden:colocated:critic/score/mean:mean_first[4]",
        "golden:colocated:response_length/mean:mean",
        # the mechanics invariants (trainer/components/invariants.py)
        "training/reward_audit_failures:each in [0,0]", "training/reward_rescore_max_abs_diff:each in [0,1e-06]",
        "training/data_repeats_in_epoch:each in [0,0]@colocated", "training/data_epoch_err:each in [0,0]@colocated",
        "training/gen_stop_violations:each in [0,0]", "training/optimizer_update_err:each in [0,1]",
        "training/optimizer_steps_err:each in [0,0]", "training/grad_stale_max:each in [0,0]",
        "training/grad_clip_err:each in [0,0.0001]", "training/loss_witness_err:each in [0,0.0001]",
        "training/clipfrac_witness_err:each in [0,0.5]",
    ]
    assert len([c for ref in suite.references for c in expected_check_ids(suite, "full", ref)]) == 11


def test_cpu_vllm_ids_and_only_the_suites_defining_it() -> None:
    dapo = load_suite(ROOT / "suites" / f"{DAPO}.yaml")
    ids = [cid for ref in dapo.references for cid in expected_check_ids(dapo, "cpu-vllm", ref)]
    assert ids == [
        "actor/pg_loss:no_nan@colocated", "actor/pg_loss:no_nan@fully_async",
        "fully_async/staleness/max_version_lag:each in [0,2]@fully_async",
        "response_length/mean:each in [1,24]@colocated", "response_length/mean:each in [1,24]@fully_async",
        "critic/score/mean:delta[3]>=0.1@colocated", "critic/score/mean:delta[3]>=0.1@fully_async",
        "training/rollout_probs_diff_max:each in [0,0.0001]@colocated",
        *(f"golden:{m}:{k}" for k in ("critic/score/mean:mean_last[3]", "critic/score/mean:mean_first[3]",
                                      "response_length/mean:mean") for m in ("colocated", "fully_async")),
        # the mechanics invariants (trainer/components/invariants.py)
        *(f"training/{k}@fully_async" for k in ("reward_audit_failures:each in [0,0]",
                                                "reward_rescore_max_abs_diff:each in [0,1e-06]",
                                                "gen_stop_violations:each in [0,0]")),
        *(f"training/{k}@{m}" for k in ("optimizer_update_err:each in [0,1]", "optimizer_steps_err:each in [0,0]",
                                        "grad_stale_max:each in [0,0]", "grad_clip_err:each in [0,0.0001]",
                                        "loss_witness_err:each in [0,0.0001]", "clipfrac_witness_err:each in [0,0.5]")
          for m in ("colocated", "fully_async")),
    ]


def test_cpu_vllm_is_collected_from_the_suites_that_define_it(project: pytest.Pytester) -> None:
    res = project.runpytest(*_args(project, "--arch", "cpu", "--profile", "cpu-vllm", "--collect-only", "-q"))
    lines = [ln for ln in res.stdout.str().splitlines() if ln.startswith("suites/")]
    # 29 checks of the suite's references, and the profile's memory items: each mode's peak and the driver's growth
    assert len(lines) == 29 + 3 and all(ln.startswith(f"suites/{DAPO}.yaml::{DAPO}[cpu-vllm]::") for ln in lines)
    assert sum("::memory/" in ln for ln in lines) == 3


def test_slow_modes_are_marked_and_not_trained_when_deselected(project: pytest.Pytester) -> None:
    """The DAPO cpu-vllm profile's fully_async mode is slow: under `-m 'not slow'` its items are deselected and
    the profile trains colocated alone; without `-m` every item is selected and both modes train."""
    from rlbench.run.pytest_plugin import _STATE

    def collected(*extra: str):
        rec = project.inline_run(*_args(project, "--arch", "cpu", "--profile", "cpu-vllm", "--collect-only", *extra))
        call = rec.getcall("pytest_collection_modifyitems")
        return call.items, call.config.stash[_STATE].train_modes[(DAPO, "cpu-vllm")]

    fast, fast_modes = collected("-m", "not slow")
    assert fast_modes == ["colocated"]
    assert fast and all("fully_async" not in i.modes for i in fast)
    assert any(i.name == "training/rollout_probs_diff_max:each in [0,0.0001]@colocated" for i in fast)
    every, every_modes = collected()
    assert every_modes == ["colocated", "fully_async"]
    slow = [i for i in every if i.get_closest_marker("slow")]
    assert len(every) == len(fast) + len(slow) and all("fully_async" in i.modes for i in slow)
    assert any(i.name == "memory/peak_rss_gb<=16[fully_async]" for i in slow)


def test_collected_item_ids(project: pytest.Pytester) -> None:
    res = project.runpytest(*_args(project, "--arch", "cpu", "--profile", "cpu", "--collect-only", "-q"))
    lines = res.stdout.str().splitlines()
    assert f"suites/{SUITE}.yaml::{SUITE}[cpu]::critic/score/mean:delta>=0.05" in lines
    # dapo cpu runs fully_async only: no @mode suffix on single-mode checks
    assert any(ln.startswith(f"suites/{DAPO}.yaml::{DAPO}[cpu]::") for ln in lines)


def test_quiet_run_summarises_skip_reasons(project: pytest.Pytester) -> None:
    res = project.runpytest("suites", "-p", "no:cacheprovider", "-q", "--rlbench-out", str(project.path / "runs"),
                            "--arch", "cpu", "--profile", "full")
    outcomes = res.parseoutcomes()
    out = res.stdout.str()
    assert f"rlbench: {outcomes['skipped']} skipped, by reason:" in out
    lines = [ln for ln in out.splitlines() if re.match(r"^\s+\d+\s{2}\S", ln)]
    assert len(lines) == 2  # one line per reason: each suite's full profile needs its GPUs
    assert sum(int(ln.split()[0]) for ln in lines) == outcomes["skipped"]
    assert any("needs 8 GPUs of arch gfx950" in ln for ln in lines)


def test_progress_lines_follow_the_metrics_log(tmp_path: Path) -> None:
    from rlbench.run.progress import MetricsTail, progress_line

    assert progress_line("s [cpu] colocated", 3, 8, {"critic/score/mean": 0.4123}, 19.24, 0.59) == \
        "s [cpu] colocated: step 3/8, 19.2 s/step, score 0.412, val acc 0.59, ~1.6 min left"
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 7, "data": {"critic/score/mean": 0.9}}\n')  # an earlier run's log: not reported
    lines: list[str] = []

    def trainer() -> None:
        log.write_text("")  # a fresh run truncates the log
        for step in range(1, 5):
            time.sleep(0.05)
            rec = {"step": step, "data": {"critic/score/mean": 0.1 * step, "timing_s/step": 2.0}}
            with log.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    with MetricsTail(log, total=4, label="run", status=lines.append, every_s=0.0, poll_s=0.01):
        t = threading.Thread(target=trainer)
        t.start()
        t.join()
    steps = [int(re.search(r"step (\d+)/4", ln).group(1)) for ln in lines]  # type: ignore[union-attr]
    assert steps == sorted(set(steps)) and steps[-1] == 4 and 7 not in steps
    assert lines[-1] == "run: step 4/4, 2.0 s/step, score 0.400"


def test_checks_not_evaluated_fail_their_items(project: pytest.Pytester) -> None:
    """A log that ends at step 120 of 200: checks that need the run's end are not evaluated, and
    pytest counts them as failures (never as passes), as many as the checks module reports."""
    from rlbench.checks.evaluate import evaluate
    from rlbench.ingest.load import load_metrics

    logs = project.path / "logs"
    log = write_qwen3_8b_grpo_log(logs / SUITE / "full" / "colocated.jsonl", steps=120)
    suite = load_suite(ROOT / "suites" / f"{SUITE}.yaml")
    results = evaluate(suite, "full", {"colocated": load_metrics(log).frame}, arch="gfx950", device_name="")
    mine = [r for r in results if not (r.verdict == "skip" and "applies to profile" in r.message)]  # items of full
    bad = [r for r in mine if r.verdict not in ("pass", "skip")]
    res = project.runpytest(*_args(project, "--arch", "gfx950", "--profile", "full", "--rlbench-logs", str(logs),
                                   "-k", SUITE))
    outcomes = res.parseoutcomes()
    assert outcomes.get("failed", 0) == len(bad) > 0
    assert outcomes.get("passed", 0) == sum(r.verdict == "pass" for r in mine)
    if any(r.verdict == "not_evaluated" for r in bad):
        assert "NOT EVALUATED" in res.stdout.str()
