"""`rlbench check` says what it checked: not-evaluated checks and partial logs named, a non-zero exit
when nothing was evaluated, the profile guessed from the log's shape, the cpu arch defaulted on a
CPU machine, shape mismatches warned, and bad logs, suites and flags refused in one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlbench import cli
from rlbench.run import inputs as check_inputs
from tests.helpers.verl_logs import qwen3_8b_grpo_steps, write_qwen3_8b_grpo_log

SUITE = "verl_grpo_qwen3_8b_sglang_gfx950"


def _write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _shaped_log(path: Path, steps: int, seqs: int, resp: float = 12.0, longest: float = 20.0) -> Path:
    """A trainer-style log with `steps` training steps of `seqs` sequences (prompt 20 + resp tokens)."""
    recs = [{"step": t, "data": {"critic/score/mean": 0.2 + 0.05 * t, "actor/ppo_kl": 1e-4,
                                 "prompt_length/mean": 20.0, "response_length/mean": resp,
                                 "response_length/max": longest, "perf/total_num_tokens": seqs * (20.0 + resp)}}
            for t in range(1, steps + 1)]
    return _write_records(path, recs)


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------- not evaluated, partial logs
def test_late_starting_log_names_the_checks_it_could_not_evaluate(tmp_path: Path, capsys) -> None:
    late = [r for r in qwen3_8b_grpo_steps() if r["step"] >= 80]
    log = _write_records(tmp_path / "late.jsonl", late)
    rc, out, err = _main(["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950",
                          "--out", str(tmp_path / "o")], capsys)
    assert rc == 1
    ne = [ln for ln in out.splitlines() if ln.startswith("N/E")]
    assert ne and all("the log starts at step 80, after step" in ln for ln in ne)
    assert any(":first" in ln for ln in ne)  # the step-0 reference is not compared with step 80
    assert not any(ln.startswith("PASS") and ":first" in ln for ln in out.splitlines())
    assert "log has steps 80-200 of the profile's 0/1-200 (starts late)" in err
    doc = json.loads((tmp_path / "o" / "checks.json").read_text())
    assert {r["coverage"] for r in doc["results"] if r["verdict"] != "skip"} == {
        "log has steps 80-200 of the profile's 0/1-200 (starts late)"}
    assert doc["provenance"]["log_coverage"] == {"colocated": "log has steps 80-200 of the profile's 0/1-200 (starts late)"}


def test_no_check_evaluated_exits_1_and_says_why(tmp_path: Path, capsys) -> None:
    log = _write_records(tmp_path / "other.jsonl", [{"step": t, "data": {"foo/bar": 1.0}} for t in range(201)])
    rc, out, err = _main(["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950",
                          "--out", str(tmp_path / "o")], capsys)
    assert rc == 1
    assert "PASS" not in out and "FAIL" not in out
    line = [ln for ln in err.splitlines() if ln.startswith("error: no check was evaluated")]
    assert len(line) == 1 and "not in run 'colocated'" in line[0] and "compared nothing does not pass" in line[0]


def test_mode_the_profile_does_not_run_is_refused(tmp_path: Path, capsys) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    rc, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu",
                        "--mode", "fully_async"], capsys)
    assert rc == 2
    assert err.strip() == (f"error: --mode fully_async: profile cpu of {SUITE} runs colocated only, so no check "
                           "reads a fully_async log; give the log's real mode, or another --profile")


def test_one_mode_given_twice_is_refused(tmp_path: Path, capsys) -> None:
    a = write_qwen3_8b_grpo_log(tmp_path / "a.jsonl")
    rc, _, err = _main(["check", str(a), str(a), "--suite", "verl_geo3k_qwen35_35b_a3b_moe_gfx950", "--profile",
                        "full", "--arch", "gfx950", "--mode", "colocated", "--mode", "colocated"], capsys)
    assert rc == 2 and err.strip() == "error: --mode colocated --mode colocated: each mode once, one per LOG"


def test_non_monotone_steps_are_warned(tmp_path: Path, capsys) -> None:
    recs = [{"step": s, "data": {"actor/ppo_kl": 1e-4}} for s in (5, -3, 5, 2, 2, 1)]
    log = _write_records(tmp_path / "order.jsonl", recs)
    _, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu",
                       "--out", str(tmp_path / "o")], capsys)
    assert "negative steps -3 (line 2) are not steps of a run; ignored" in err
    assert "steps go back: step -3 at line 2 after step 5" in err
    assert "steps logged again after other steps: 5 (lines 1, 3)" in err


# ---------------------------------------------------------------- profile and arch
def test_profile_guessed_from_the_log_shape_and_cpu_arch_defaulted(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(check_inputs, "detected_arch", lambda: "cpu")
    log = _shaped_log(tmp_path / "cpu.jsonl", steps=8, seqs=32)  # cpu profile: 8 steps of 8 prompts x n 4
    _, _, err = _main(["check", str(log), "--suite", SUITE, "--out", str(tmp_path / "o")], capsys)
    assert ("note: --profile not given; the log's shape (8 steps, 32 sequences per step, longest response 20 "
            f"tokens) matches profile cpu of {SUITE}: checking as cpu") in err
    assert "note: --arch not given; profile cpu on this CPU-only machine: checking as arch cpu" in err
    assert json.loads((tmp_path / "o" / "checks.json").read_text())["profile"] == "cpu"


def test_unmatched_shape_falls_back_to_full_and_says_so(tmp_path: Path, capsys) -> None:
    log = _shaped_log(tmp_path / "odd.jsonl", steps=30, seqs=64)
    _, _, err = _main(["check", str(log), "--suite", SUITE, "--out", str(tmp_path / "o")], capsys)
    assert (f"--profile not given and the log (30 steps, 64 sequences per step, longest response 20 tokens) "
            f"matches no profile of {SUITE}: checking as full") in err
    assert "note: --arch not given; checking as the published arch gfx950" in err


def test_plain_shape_mismatch_is_warned_with_the_hint(tmp_path: Path, capsys) -> None:
    log = _shaped_log(tmp_path / "n8.jsonl", steps=30, seqs=64)  # a 30-step n=8 run
    _, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu",
                       "--out", str(tmp_path / "o")], capsys)
    warn = [ln for ln in err.splitlines() if "was not run with profile cpu" in ln]
    assert len(warn) == 1
    assert "the log has 30 steps (the profile runs 8); 64 sequences per step (the profile makes 32 = " \
           "train_batch_size 8 x n 4)" in warn[0]
    mini = _shaped_log(tmp_path / "mini.jsonl", steps=60, seqs=320, longest=60.0)
    _, _, err = _main(["check", str(mini), "--suite", SUITE, "--profile", "cpu", "--arch", "cpu",
                       "--out", str(tmp_path / "o2")], capsys)
    assert "responses up to 60 tokens (the profile caps them at 24)" in err
    assert "it looks like profile mini: pass --profile mini" in err


def test_multi_turn_log_is_not_read_as_more_sequences(tmp_path: Path, capsys) -> None:
    """A tool-use step's token count holds the observations too: 16 sequences of 50 + 56 model tokens and 16
    observation tokens read as 18.4 sequences; with num_turns/mean above 1 that signal is not used."""
    recs = [{"step": t, "data": {"critic/score/mean": 0.5, "prompt_length/mean": 50.0, "response_length/mean": 56.0,
                                 "response_length/max": 80.0, "num_turns/mean": 3.7,
                                 "perf/total_num_tokens": 16 * (50.0 + 56.0 + 16.0)}} for t in range(1, 6)]
    log = _write_records(tmp_path / "retool.jsonl", recs)
    retool = ["--suite", "miles_retool_qwen25_32b_gfx942", "--profile", "cpu", "--arch", "cpu", "--mode", "colocated"]
    _, _, err = _main(["check", str(log), *retool, "--out", str(tmp_path / "o")], capsys)
    assert "golden" in err + (tmp_path / "o" / "checks.json").read_text()  # the checks ran
    assert "was not run with profile cpu" not in err
    single = [{**r, "data": {**r["data"], "num_turns/mean": 1.0}} for r in recs]  # the same counts, one turn
    _, _, err = _main(["check", str(_write_records(tmp_path / "one.jsonl", single)), *retool,
                       "--out", str(tmp_path / "o2")], capsys)
    assert "18 sequences per step (the profile makes 16" in err


def test_cpu_profile_on_a_gpu_machine_still_needs_arch(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(check_inputs, "detected_arch", lambda: "gfx942")
    log = _shaped_log(tmp_path / "cpu.jsonl", steps=8, seqs=32)
    rc, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "cpu"], capsys)
    assert rc == 2 and err.strip().endswith("--arch: say which arch the cpu run ran on (e.g. --arch cpu or gfx942)")


@pytest.mark.parametrize("argv_tail", [["check", "LOG", "--suite", SUITE, "--arch", "gfx999"],
                                       ["run", SUITE, "--profile", "cpu", "--arch", "gfx999"],
                                       ["list", "--arch", "gfx999"]])
def test_unknown_arch_is_rejected_with_the_known_ones(tmp_path: Path, capsys, argv_tail: list[str]) -> None:
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    rc, _, err = _main([str(log) if a == "LOG" else a for a in argv_tail], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith("error: --arch gfx999: not a known arch; choose one of ")
    assert all(a in lines[0] for a in ("cpu", "gfx942", "gfx950", "sm_90"))


@pytest.mark.parametrize("arch, shown, hint", [("CPU", "CPU", "; did you mean cpu?"), ("", "''", ""),
                                               ("gfx9500", "gfx9500", "; did you mean gfx950?")])
def test_arch_in_another_case_or_empty_is_refused(tmp_path: Path, capsys, arch: str, shown: str, hint: str) -> None:
    """`--arch CPU` is not cpu and `--arch ''` is not "not given": both refused with the known arches."""
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    rc, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", arch], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: --arch {shown}: not a known arch; choose one of cpu, gfx942, gfx950")
    assert lines[0].endswith(f"e.g. gfx942 or sm_90){hint}")


def test_device_that_matches_no_board_is_refused(tmp_path: Path, capsys) -> None:
    """`--device MI355` would make every device-scoped check skip as "another board"."""
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    argv = ["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950", "--out", str(tmp_path / "o")]
    rc, out, err = _main(argv + ["--device", "MI355"], capsys)
    assert rc == 2 and out == "" and err.strip().startswith(
        "error: --device MI355: matches no known board; did you mean MI355X? give one of A100, H100")
    assert "MI350X, MI355X, or the name the GPU reports" in err and not (tmp_path / "o").exists()
    for good in ("MI355X", "AMD Instinct MI355X"):
        rc, _, err = _main(argv + ["--device", good], capsys)
        assert rc == 0, err


def test_out_that_is_an_existing_file_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    """`--out FILE` (or a folder under a file): one line before anything is read or written; the file is kept."""
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    for out, what in ((afile, "is an existing file"), (afile / "sub", f"lies under {afile}, an existing file")):
        rc, _, err = _main(["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950",
                            "--out", str(out)], capsys)
        assert rc == 2 and err.strip() == (f"error: --out {out}: {what}, not a folder (fix: pass a folder to write "
                                           "into, e.g. --out runs/check)"), err
    rc, _, err = _main(["run", SUITE, "--profile", "cpu", "--arch", "cpu", "--out", str(afile)], capsys)
    assert rc == 2 and err.strip().startswith(f"error: --out {afile}: is an existing file, not a folder")
    assert afile.read_text() == "keep me\n"


# ---------------------------------------------------------------- rewards, bad files
def test_reward_named_accuracy_needs_the_flag(tmp_path: Path, capsys) -> None:
    text = write_qwen3_8b_grpo_log(tmp_path / "r.jsonl").read_text().replace("/acc/mean@1", "/reward/mean@1")
    log = tmp_path / "reward.jsonl"
    log.write_text(text)
    argv = ["check", str(log), "--suite", SUITE, "--profile", "full", "--arch", "gfx950", "--out", str(tmp_path / "o")]
    rc, out, _ = _main(argv, capsys)
    assert rc == 1 and "pass --reward-is-accuracy" in out
    rc, out, err = _main(argv + ["--reward-is-accuracy"], capsys)
    assert rc == 0 and "N/E" not in out
    assert "read as val-core/openai/gsm8k/acc/mean@1 (--reward-is-accuracy: 0/1 rewards)" in err


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.write_bytes(b"\x00\x01\x02" * 100), "is a binary file"),
    (lambda p: p.write_text("step:1 - a/x:" + "7" * (25 * 10**6)), "a 25.0 MB line, over the 1.0 MB limit"),
    (lambda p: p.write_text(""), "the file is empty"),
    (lambda p: p.mkdir(), "is a directory, not a metrics log"),
    (lambda p: os.mkfifo(p), "not a regular file (a FIFO), not a metrics log"),
    (lambda p: p.symlink_to(os.devnull), "not a regular file (a character device), not a metrics log"),
])
def test_bad_log_files_are_one_line_exit_2(tmp_path: Path, capsys, make, needle: str) -> None:
    path = tmp_path / "bad.log"
    make(path)
    rc, _, err = _main(["check", str(path), "--suite", SUITE, "--profile", "full", "--arch", "gfx950"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_binary_suite_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    suite = tmp_path / "s.yaml"
    suite.write_bytes(bytes(range(256)) * 16)
    log = write_qwen3_8b_grpo_log(tmp_path / "run.jsonl")
    rc, _, err = _main(["check", str(log), "--suite", str(suite), "--arch", "gfx950"], capsys)
    assert rc == 2 and err.strip() == f"error: {suite}: is a binary file (NUL bytes), not a suite YAML; pass suites/<id>.yaml"
