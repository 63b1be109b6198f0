"""A run stopped after a checkpoint and resumed logs exactly what an uninterrupted run logs."""

from __future__ import annotations

import pytest

from tests.helpers.configs import tiny_config
from trainer.api import train
from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = pytest.mark.integration


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


def test_resume_reproduces_uninterrupted_run(tmp_path):
    sections = dict(trainer={"total_steps": 4, "save_freq": 2, "test_freq": 2},
                    actor={"ppo_mini_batch_size": 2})  # two optimizer steps per step: optimizer state matters
    full = read_metrics(train(load_config(tiny_config(str(tmp_path / "full"), **sections))))

    part_dir = str(tmp_path / "part")
    train(load_config(tiny_config(part_dir, **sections), ["trainer.total_steps=2"]))  # "killed" after step 2
    resumed = read_metrics(train(load_config(tiny_config(part_dir, **sections))))

    assert [ln["step"] for ln in resumed] == [0, 1, 2, 3, 4]  # nothing lost, nothing duplicated
    for a, b in zip(full, resumed):
        assert a["step"] == b["step"]
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys()
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)


def test_resume_false_starts_over(tmp_path):
    sections = dict(trainer={"total_steps": 2, "save_freq": 1, "test_freq": 0})
    out = str(tmp_path / "r")
    train(load_config(tiny_config(out, **sections)))
    lines = read_metrics(train(load_config(tiny_config(out, **sections), ["trainer.resume=false"])))
    assert [ln["step"] for ln in lines] == [1, 2]


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, capsys):
    """A truncated state.pt in the newest checkpoint: resume warns naming both checkpoints, continues from
    the previous one, and the log ends up as an uninterrupted run's (no line lost or duplicated)."""
    import logging

    sections = dict(trainer={"total_steps": 4, "save_freq": 2, "test_freq": 2}, actor={"ppo_mini_batch_size": 2})
    full = read_metrics(train(load_config(tiny_config(str(tmp_path / "full"), **sections))))
    out = tmp_path / "part"
    train(load_config(tiny_config(str(out), **sections), ["trainer.total_steps=3"]))  # checkpoints 2 and 3
    state = out / "checkpoints" / "step_000003" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 3])  # a torn write (or a full disk)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="trainer.components.checkpoint"):
        resumed = read_metrics(train(load_config(tiny_config(str(out), **sections))))
    warning = caplog.text
    assert "step_000003 is damaged" in warning and "state.pt is" in warning and "step_000002 instead" in warning
    assert "resuming from checkpoint" in capsys.readouterr().err
    assert [ln["step"] for ln in resumed] == [0, 1, 2, 3, 4]
    for a, b in zip(full, resumed):
        na, nb = _numbers(a), _numbers(b)
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6), (a["step"], k)


def test_rerun_of_a_finished_run_says_complete_and_how_to_start_fresh(tmp_path, capsys):
    sections = dict(trainer={"total_steps": 2, "save_freq": 2, "test_freq": 0})
    out = str(tmp_path / "r")
    train(load_config(tiny_config(out, **sections)))
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    capsys.readouterr()
    train(load_config(tiny_config(out, **sections)))
    err = capsys.readouterr().err
    assert "already complete at 2/2 steps" in err and "trainer.resume=false" in err and "trainer.total_steps" in err
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before
    lines = read_metrics(train(load_config(tiny_config(out, **sections), ["trainer.total_steps=3"])))
    assert "resuming from checkpoint" in capsys.readouterr().err and [ln["step"] for ln in lines] == [1, 2, 3]
