"""Bad input to `python -m trainer` gives one line naming the key or path and the fix, and exit code 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from trainer.__main__ import main

pytestmark = pytest.mark.integration


@pytest.fixture
def config_file(tmp_path):
    def write(text: str) -> str:
        p = tmp_path / "cfg.yaml"
        p.write_text(text)
        return str(p)

    return write


BASE = ("model: {path: 'tiny:qwen2'}\n"
        "trainer: {total_steps: 1, test_freq: 0, device: cpu, progress: false, out_dir: OUT}\n")


def _run(capsys, args):
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _one_line(err: list[str]) -> str:
    lines = [ln for ln in err if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in "\n".join(err)
    return lines[0]


def test_unknown_key(config_file, capsys, tmp_path):
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), "actor.lrr=1e-5"])
    line = _one_line(err)
    assert code == 2 and "actor.lrr" in line and "did you mean 'lr'" in line


def test_wrong_type(config_file, capsys, tmp_path):
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), "data.train_batch_size=many"])
    line = _one_line(err)
    assert code == 2 and "data.train_batch_size" in line and "integer" in line


def test_missing_model_path(config_file, capsys, tmp_path):
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), f"model.path={tmp_path}/nope"])
    line = _one_line(err)
    assert code == 2 and "model.path" in line and "nope" in line and "fix" in line


def test_missing_data_path(config_file, capsys, tmp_path):
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), f"data.train_files={tmp_path}/x.parquet"])
    line = _one_line(err)
    assert code == 2 and "x.parquet" in line and "fix" in line


def test_empty_dataset(config_file, capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), f"data.train_files={empty}"])
    line = _one_line(err)
    assert code == 2 and "empty.jsonl" in line


def test_malformed_parquet_row(config_file, capsys, tmp_path):
    good = {"data_source": "synthetic/arithmetic", "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"index": 0}}
    bad = dict(good, prompt=[{"role": "user", "content": None}])  # a message without content
    path = tmp_path / "rows.parquet"
    pd.DataFrame([good, good, bad]).to_parquet(path)
    code, err = _run(capsys, [config_file(BASE.replace("OUT", str(tmp_path))), f"data.train_files={path}"])
    line = _one_line(err)
    assert code == 2 and "rows.parquet" in line and "row 2" in line and "prompt" in line


def test_missing_config_file(capsys, tmp_path):
    code, err = _run(capsys, [str(tmp_path / "none.yaml")])
    line = _one_line(err)
    assert code == 2 and "none.yaml" in line


def test_invalid_yaml(config_file, capsys):
    code, err = _run(capsys, [config_file("model: {path: [unclosed\n")])
    line = _one_line(err)
    assert code == 2 and "invalid YAML" in line and "line" in line


def test_good_run_writes_metrics(config_file, capsys, tmp_path):
    code = main([config_file(BASE.replace("OUT", str(tmp_path / "ok")))])
    assert code == 0
    lines = (tmp_path / "ok" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 1
