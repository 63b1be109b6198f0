"""Ingest of verl, Miles and trainer logs into one step x metric frame with verl names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlbench.ingest.load import detect_format, load_metrics
from rlbench.ingest.vocab import canonical_name, mapping_table
from trainer.errors import ConfigError, DataError, RLBenchError


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------- vocabulary


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        ("perf/step_time", "miles", "timing_s/step"),
        ("perf/rollout_time", "miles", "timing_s/gen"),
        ("perf/actor_train_time", "miles", "timing_s/update_actor"),
        ("perf/update_weights_time", "miles", "timing_s/update_weights"),
        ("perf/log_probs_time", "miles", "timing_s/old_log_prob"),
        ("perf/ref_log_probs_time", "miles", "timing_s/ref"),
        ("perf/tokens_per_gpu_per_sec", "miles", "perf/throughput"),
        ("perf/actor_train_tok_per_s", "miles", "perf/actor_train_tok_per_s"),
        ("train/ppo_kl", "miles", "actor/ppo_kl"),
        ("train/actor-ppo_kl", "miles", "actor/ppo_kl"),
        ("train/entropy_loss", "miles", "actor/entropy"),
        ("rollout/raw_reward", "miles", "critic/score/mean"),
        ("rollout/response_lengths", "miles", "response_length/mean"),
        ("eval/aime", "miles", "val-core/aime/acc/mean@1"),
        ("eval/aime-2024", "miles", "val-core/aime-2024/acc/mean@1"),
        ("eval/aime-pass@16", "miles", "val-core/aime/acc/pass@16"),
        ("eval/aime-2024-truncated_ratio", "miles", "val-aux/aime-2024/truncated_ratio"),
        ("eval/aime/response_len/mean", "miles", "val-aux/aime/response_len/mean"),
        # a mean reward is not an accuracy (+-1 rewards): it keeps a reward name
        ("val-core/openai/gsm8k/reward/mean@1", "verl", "val-core/openai/gsm8k/reward/mean@1"),
        ("val/test_score/openai/gsm8k", "verl", "val-core/openai/gsm8k/reward/mean@1"),
        # verl's quickstart names (older releases)
        ("timing/gen", "verl", "timing_s/gen"),
        ("timing/update_actor", "verl", "timing_s/update_actor"),
        ("actor/entropy_loss", "verl", "actor/entropy"),
        # Miles tables do not apply to verl logs, and unknown names pass through.
        ("train/ppo_kl", "verl", "train/ppo_kl"),
        ("actor/ppo_kl", "verl", "actor/ppo_kl"),
        ("custom/thing", "miles", "custom/thing"),
    ],
)
def test_canonical_name(name: str, source: str, expected: str) -> None:
    assert canonical_name(name, source) == expected


def test_canonical_name_rejects_unknown_source() -> None:
    with pytest.raises(ValueError, match="unknown metric source"):
        canonical_name("x", "openrlhf")


def test_mapping_table_lists_every_rule() -> None:
    rows = mapping_table()
    by_name = {r["name"]: r["canonical"] for r in rows}
    assert by_name["perf/step_time"] == "timing_s/step"
    assert any(r["source"].startswith("verl") and "test_score" in r["name"] for r in rows)
    assert all(set(r) == {"source", "name", "canonical"} for r in rows)


# ---------------------------------------------------------------- verl JSONL


def test_verl_jsonl_merges_lines_of_one_step_and_tolerates_truncated_last_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "verl.jsonl",
        "\n".join(
            [
                json.dumps({"step": 2, "data": {"actor/ppo_kl": 0.003, "timing_s/step": 12, "note": "hi"}}),
                json.dumps({"step": 1, "data": {"actor/ppo_kl": 0.001, "timing_s/step": 10.0}}),
                json.dumps({"step": 1, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.5, "actor/ppo_kl": 0.002}}),
                '{"step": 3, "data": {"actor/pp',
            ]
        ),
    )
    log = load_metrics(path)
    assert log.source_format == "verl-jsonl"
    assert log.path == path
    frame = log.frame
    assert list(frame.index) == [1, 2]
    assert frame.index.name == "step"
    assert frame.loc[1, "actor/ppo_kl"] == 0.002  # the later line of step 1 wins
    assert frame.loc[2, "actor/ppo_kl"] == 0.003
    assert frame.loc[2, "timing_s/step"] == 12.0
    assert frame.loc[1, "val-core/openai/gsm8k/reward/mean@1"] == 0.5  # a reward, not read as accuracy
    assert math.isnan(frame.loc[2, "val-core/openai/gsm8k/reward/mean@1"])
    assert "val-core/openai/gsm8k/acc/mean@1" not in frame.columns
    assert "note" not in frame.columns  # not a number
    assert all(str(t) == "float64" for t in frame.dtypes)
    assert len(log.warnings) == 2 and log.warnings[0].startswith("line 4: truncated JSON line ignored")
    assert log.warnings[1].startswith("steps go back: step 1 at line 2 after step 2")  # written 2, 1, 1


def test_verl_jsonl_reads_nan_and_keeps_all_nan_metric(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", '{"step": 1, "data": {"a/x": NaN, "a/y": 1}}\n')
    frame = load_metrics(path).frame
    assert math.isnan(frame.loc[1, "a/x"]) and frame.loc[1, "a/y"] == 1.0


def test_malformed_middle_line_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "bad.jsonl",
        '{"step": 1, "data": {"a/x": 1}}\n{"step": 2, "data": {"a/x": }\n{"step": 3, "data": {"a/x": 3}}\n',
    )
    with pytest.raises(DataError) as info:
        load_metrics(path)
    msg = str(info.value)
    assert f"{path}:2:" in msg and "\n" not in msg


def test_line_without_data_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", '{"step": 1, "data": {"a/x": 1}}\n{"step": 2, "metrics": {}}\n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: line has no 'data'"):
        load_metrics(path, fmt="verl-jsonl")


def test_rlbench_log_with_meta_is_recognized_and_meta_skipped(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "metrics.jsonl",
        "\n".join(
            [
                json.dumps({"_meta": {"commit": "abc", "seed": 1}}),
                json.dumps({"step": 0, "data": {"actor/ppo_kl": 0.0, "_meta": {"x": 1}}}),
                json.dumps({"step": 1, "data": {"actor/ppo_kl": 0.5}, "_meta": {"t": 3}}),
            ]
        )
        + "\n",
    )
    log = load_metrics(path)
    assert log.source_format == "rlbench"
    assert list(log.frame.columns) == ["actor/ppo_kl"]
    assert list(log.frame["actor/ppo_kl"]) == [0.0, 0.5]
    assert log.warnings == []


# ---------------------------------------------------------------- verl console


VERL_CONSOLE = """\
2026-01-01 12:00:00 INFO Loading model from /models/qwen
(TaskRunner pid=123) step:1 - actor/ppo_kl:np.float64(0.001) - critic/score/mean:np.float32(-0.5) - \
actor/pg_clipfrac:0.0 - perf/total_num_tokens:np.int64(4096) - timing_s/step:12.5
(TaskRunner pid=123) Training Progress:  10%|#         | 1/10 [00:12<01:50, 12.2s/it]
some other line with step:words in it
\x1b[36m(TaskRunner pid=123)\x1b[0m step:2 - actor/ppo_kl:tensor(0.002, device='cuda:0') - \
critic/score/mean:nan - actor/grad_norm:inf - training/global_step:2 - actor/lr:1e-06 [repeated 2x across cluster]
step:3 - val-core/openai/gsm8k/reward/mean@1:0.75 - actor/ppo_kl:0.004 - note:hello
(TaskRunner pid=123) step:4
"""


def test_verl_console_with_numpy_reprs_and_ray_prefixes(tmp_path: Path) -> None:
    path = _write(tmp_path / "console.log", VERL_CONSOLE)
    log = load_metrics(path)
    assert log.source_format == "verl-console"
    f = log.frame
    assert list(f.index) == [1, 2, 3]  # the bare "step:4" line carries no metrics
    assert list(f["actor/ppo_kl"]) == [0.001, 0.002, 0.004]
    assert f.loc[1, "critic/score/mean"] == -0.5
    assert f.loc[1, "perf/total_num_tokens"] == 4096.0
    assert f.loc[1, "timing_s/step"] == 12.5
    assert math.isnan(f.loc[2, "critic/score/mean"])
    assert f.loc[2, "actor/grad_norm"] == math.inf
    assert f.loc[2, "actor/lr"] == 1e-6  # the Ray "[repeated ...]" suffix is not part of the value
    assert f.loc[3, "val-core/openai/gsm8k/reward/mean@1"] == 0.75
    assert "note" not in f.columns
    assert any("'note'" in w for w in log.warnings)


# ---------------------------------------------------------------- Miles


def test_miles_jsonl_names_mapped_and_step_keys_merged(tmp_path: Path) -> None:
    lines = [
        {"rollout/step": 0, "perf/rollout_time": 150.0, "perf/tokens_per_gpu_per_sec": 1200.0,
         "rollout/raw_reward": 0.25, "rollout/response_lengths": 11718},
        {"train/step": 0, "train/ppo_kl": 1e-4, "train/pg_clipfrac": 0.01, "train/grad_norm": 0.3},
        {"rollout/step": 0, "perf/step_time": 388.5, "perf/actor_train_time": 95.3,
         "perf/update_weights_time": 33.85, "perf/log_probs_time": 31.53},
        {"eval/step": 1, "eval/aime": 0.665, "eval/aime-pass@16": 0.89, "eval/aime-truncated_ratio": 0.294},
    ]
    path = _write(tmp_path / "miles.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    log = load_metrics(path)
    assert log.source_format == "miles-jsonl"
    f = log.frame
    assert list(f.index) == [0, 1]
    assert f.loc[0, "timing_s/gen"] == 150.0
    assert f.loc[0, "perf/throughput"] == 1200.0
    assert f.loc[0, "critic/score/mean"] == 0.25
    assert f.loc[0, "response_length/mean"] == 11718.0
    assert f.loc[0, "actor/ppo_kl"] == 1e-4
    assert f.loc[0, "timing_s/step"] == 388.5
    assert f.loc[0, "timing_s/old_log_prob"] == 31.53
    assert f.loc[1, "val-core/aime/acc/mean@1"] == 0.665
    assert f.loc[1, "val-core/aime/acc/pass@16"] == 0.89
    assert f.loc[1, "val-aux/aime/truncated_ratio"] == 0.294
    for key in ("rollout/step", "train/step", "eval/step", "step", "train/ppo_kl", "perf/step_time"):
        assert key not in f.columns


def test_miles_two_names_for_one_metric_keep_a_value(tmp_path: Path) -> None:
    lines = [
        {"rollout/step": 0, "rollout/response_lengths": 100.0},
        {"rollout/step": 1, "rollout/response_len/mean": 200.0},
    ]
    path = _write(tmp_path / "miles.jsonl", "\n".join(json.dumps(x) for x in lines))
    f = load_metrics(path).frame
    assert list(f.columns) == ["response_length/mean"]
    assert list(f["response_length/mean"]) == [100.0, 200.0]


MILES_CONSOLE = """\
[2026-01-01 10:00:00] INFO rollout.py:120 - perf 0: {'perf/rollout_time': 152.79, \
'perf/tokens_per_gpu_per_sec': np.float64(1250.5), 'rollout/raw_reward': 0.5, 'rollout/truncated_ratio': nan}
[2026-01-01 10:03:00] INFO model.py:400 - step 0: {'train/ppo_kl': 2e-05, 'train/grad_norm': 0.25, \
'train/lr-pg_0': 1e-06}
(MegatronTrainRayActor pid=42) [2026-01-01 10:03:01] INFO - actor-step 1: {'train/actor-ppo_kl': 3e-05}
[2026-01-01 10:04:00] INFO train_metric_utils.py:47 - perf 0: {'perf/step_time': 388.5, 'perf/actor_train_time': inf}
[2026-01-01 10:05:00] INFO rollout.py:60 - eval 1: {'eval/aime': 0.7, 'eval/aime-pass@16': 0.9}
unrelated: {'a': 1}
"""


def test_miles_console_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "miles.log", MILES_CONSOLE)
    log = load_metrics(path)
    assert log.source_format == "miles-console"
    f = log.frame
    assert list(f.index) == [0, 1]
    assert f.loc[0, "timing_s/gen"] == 152.79
    assert f.loc[0, "perf/throughput"] == 1250.5
    assert math.isnan(f.loc[0, "response_length/clip_ratio"])
    assert f.loc[0, "actor/ppo_kl"] == 2e-05
    assert f.loc[1, "actor/ppo_kl"] == 3e-05  # role-tagged name
    assert f.loc[0, "actor/lr"] == 1e-06
    assert f.loc[0, "timing_s/step"] == 388.5
    assert f.loc[0, "timing_s/update_actor"] == math.inf
    assert f.loc[1, "val-core/aime/acc/mean@1"] == 0.7
    assert f.loc[1, "val-core/aime/acc/pass@16"] == 0.9
    assert "a" not in f.columns


# ---------------------------------------------------------------- detection and user errors


def test_detect_format_on_each_kind(tmp_path: Path) -> None:
    assert detect_format(['{"step": 1, "data": {}}'], tmp_path) == "verl-jsonl"
    assert detect_format(['{"_meta": {}}', '{"step": 1, "data": {}}'], tmp_path) == "rlbench"
    assert detect_format(['{"train/step": 1, "train/ppo_kl": 0}'], tmp_path) == "miles-jsonl"
    assert detect_format(["hello", "step:1 - a/b:1"], tmp_path) == "verl-console"
    assert detect_format(["INFO x - eval 3: {'eval/aime': 0.5}"], tmp_path) == "miles-console"


def test_unrecognizable_file_names_file_and_formats(tmp_path: Path) -> None:
    path = _write(tmp_path / "notes.txt", "just some text\nno metrics here\n")
    with pytest.raises(DataError) as info:
        load_metrics(path)
    msg = str(info.value)
    assert str(path) in msg and "verl-jsonl" in msg and "miles-console" in msg and "\n" not in msg


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_metrics(tmp_path / "nope.jsonl")
    path = _write(tmp_path / "m.jsonl", '{"step": 1, "data": {"a/x": 1}}\n')
    with pytest.raises(ConfigError, match="unknown log format 'wandb'"):
        load_metrics(path, fmt="wandb")


def test_explicit_format_with_no_steps_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.log", "nothing\n")
    with pytest.raises(RLBenchError, match="no step with metrics"):
        load_metrics(path, fmt="verl-console")


def test_non_integer_step_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", '{"step": 1.5, "data": {"a/x": 1}}\n{"step": 2, "data": {}}\n')
    with pytest.raises(DataError, match=r"m\.jsonl:1: step key 'step' has value 1.5"):
        load_metrics(path)


def test_series_drops_missing_steps_and_names_unknown_metric(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "m.jsonl",
        '{"step": 1, "data": {"a/x": 1}}\n{"step": 2, "data": {"a/y": 2}}\n{"step": 3, "data": {"a/x": 3}}\n',
    )
    log = load_metrics(path)
    assert list(log.series("a/x").index) == [1, 3]
    with pytest.raises(DataError, match="'a/z' is not in the log"):
        log.series("a/z")
