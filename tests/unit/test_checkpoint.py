"""Checkpoint commit order, manifests, damaged-checkpoint fallback, log restore and the fault hook
(`trainer/components/checkpoint.py`, `trainer/components/faults.py`), on small states: no model, no training."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.components.checkpoint import (
    MANIFEST,
    finish_step,
    latest_checkpoint,
    prepare_checkpoint,
    restore_log,
    resume_checkpoint,
    resume_or_start,
    save_checkpoint,
    verify_checkpoint,
)
from trainer.components.faults import FAULT_ENV, PACE_ENV, fault_point, rollout_pace_s
from trainer.components.metrics import MetricsWriter, read_metrics
from trainer.errors import ConfigError, RLBenchError


def _save(out: Path, step: int) -> Path:
    return save_checkpoint(out, step, {"payload": list(range(1000)), "data": {"pos": step}}, keep=3)


def _steps(path: Path) -> list[int]:
    return [ln["step"] for ln in read_metrics(path)]


def test_manifest_lists_every_file_and_verifies(tmp_path: Path):
    ckpt = _save(tmp_path, 2)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["step"] == 2 and set(manifest["files"]) == {"state.pt"}
    assert verify_checkpoint(ckpt) is None


def test_truncated_state_pt_falls_back_to_the_previous_checkpoint_and_warns(tmp_path: Path, caplog):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a torn write
    with caplog.at_level(logging.WARNING, logger="trainer.components.checkpoint"):
        used = resume_checkpoint(tmp_path)
    assert used is not None and used.name == "step_000002"
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "step_000004" in warning and "damaged" in warning and "step_000002" in warning and "bytes" in warning
    assert not newest.exists() and (newest.parent / ".damaged_step_000004").is_dir()  # moved aside, kept


def test_flipped_byte_is_caught_by_the_checksum(tmp_path: Path, caplog):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    data = bytearray((newest / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (newest / "state.pt").write_bytes(bytes(data))
    assert "crc32" in verify_checkpoint(newest)
    assert resume_checkpoint(tmp_path).name == "step_000001"


def test_every_checkpoint_damaged_is_one_line_error(tmp_path: Path):
    only = _save(tmp_path, 3)
    (only / "state.pt").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(RLBenchError, match=r"step_000003 is damaged .* no earlier checkpoint is intact .*trainer.resume=false"):
        resume_checkpoint(tmp_path)


def test_checkpoint_without_manifest_gets_a_load_test(tmp_path: Path):
    ckpt = _save(tmp_path, 1)
    (ckpt / MANIFEST).unlink()
    assert verify_checkpoint(ckpt) is None
    (ckpt / "state.pt").write_bytes(b"garbage")
    assert "does not load" in verify_checkpoint(ckpt)


def test_uncommitted_checkpoint_is_not_resumed(tmp_path: Path):
    _save(tmp_path, 1)
    pending = prepare_checkpoint(tmp_path, 2, {"x": 1})
    assert pending.tmp.is_dir() and latest_checkpoint(tmp_path).name == "step_000001"
    assert resume_checkpoint(tmp_path).name == "step_000001"
    pending.commit()
    assert resume_checkpoint(tmp_path).name == "step_000002"


def test_finish_step_writes_the_line_before_the_commit_and_copies_the_log(tmp_path: Path):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    for step in (0, 1):
        writer.write(step, {"x": float(step)})
    pending = prepare_checkpoint(tmp_path, 2, {"x": 2})
    finish_step(writer, 2, {"x": 2.0}, pending)
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert _steps(writer.path) == [0, 1, 2] and _steps(ckpt / "metrics.jsonl") == [0, 1, 2]
    assert "metrics.jsonl" in json.loads((ckpt / MANIFEST).read_text())["files"]


def test_restore_log_cuts_later_lines_and_a_torn_last_line(tmp_path: Path):
    log = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(log)
    for step in range(4):
        writer.write(step, {"x": float(step)})
    ckpt = _save(tmp_path, 2)
    with log.open("a") as f:
        f.write('{"step": 4, "data": {"x"')  # killed mid-write
    restore_log(log, ckpt, 2)
    assert _steps(log) == [0, 1, 2]
    assert log.read_text().endswith("\n")


def test_restore_log_takes_lost_lines_from_the_checkpoint_copy(tmp_path: Path, caplog):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    for step in range(3):
        writer.write(step, {"x": float(step)})
    pending = prepare_checkpoint(tmp_path, 3, {"x": 3})
    finish_step(writer, 3, {"x": 3.0}, pending)
    writer.path.write_text(writer.path.read_text().splitlines()[0] + "\n")  # the log lost lines 1-3
    with caplog.at_level(logging.WARNING, logger="trainer.components.checkpoint"):
        restore_log(writer.path, tmp_path / "checkpoints" / "step_000003", 3)
    assert _steps(writer.path) == [0, 1, 2, 3] and "restored" in caplog.text


def test_fresh_start_removes_checkpoints_of_an_earlier_run(tmp_path: Path, caplog):
    _save(tmp_path, 4)
    log = tmp_path / "metrics.jsonl"
    MetricsWriter(log).write(4, {"x": 1.0})
    with caplog.at_level(logging.WARNING, logger="trainer.components.checkpoint"):
        assert resume_or_start(tmp_path, log, resume=False) is None
    assert latest_checkpoint(tmp_path) is None and log.read_text() == ""
    assert "removing 1 checkpoint" in caplog.text and "replacing the 1 line" in caplog.text


def test_prune_keeps_the_newest(tmp_path: Path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {"x": step}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003", "step_000004"]


def test_fault_hook_rejects_an_unknown_phase(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "rolout:1")
    with pytest.raises(ConfigError, match="rollout, update, checkpoint, line, commit"):
        fault_point("rollout", 1)


def test_rollout_pace_reads_seconds_and_rejects_anything_else(monkeypatch):
    assert rollout_pace_s() == 0.0
    monkeypatch.setenv(PACE_ENV, "0.01")
    assert rollout_pace_s() == 0.01
    for bad in ("10ms", "-1", "nan"):
        monkeypatch.setenv(PACE_ENV, bad)
        with pytest.raises(ConfigError, match=PACE_ENV):
            rollout_pace_s()


def test_fault_hook_kills_at_its_phase_and_step_only(tmp_path: Path):
    code = ("from trainer.components.faults import fault_point\n"
            "fault_point('rollout', 2); fault_point('line', 1); print('passed', flush=True)\n"
            "fault_point('line', 2); print('not reached')\n")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, FAULT_ENV: "line:2"},
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == -9 and out.stdout.strip() == "passed"


def test_a_damaged_worker_file_is_caught_too(tmp_path: Path):
    """The Ray paths add the workers' files (actor.pt) before the commit: the manifest covers them."""
    def write_files(folder: Path) -> dict:
        (folder / "actor.pt").write_bytes(b"w" * 4096)
        return {"world_size": 2}

    save_checkpoint(tmp_path, 2, {"x": 1}, write_files=write_files)
    newest = save_checkpoint(tmp_path, 4, {"x": 2}, write_files=write_files)
    assert set(json.loads((newest / MANIFEST).read_text())["files"]) == {"actor.pt", "state.pt"}
    (newest / "actor.pt").write_bytes(b"w" * 100)
    assert verify_checkpoint(newest) == "actor.pt is 100 bytes, the manifest says 4096"
    assert resume_checkpoint(tmp_path).name == "step_000002"
