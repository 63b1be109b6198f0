"""Every shipped suite file loads, validates and resolves a trainer config for each profile and mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.suite import PROFILE_NAMES, discover_suites, load_suite
from trainer.config import load_config

SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"
SUITE_FILES = sorted(SUITES_DIR.glob("*.yaml"))
FAKE_ENV = {"MODEL_DIR": "/models", "DATA_DIR": "/data"}


def test_the_five_case_studies_are_shipped() -> None:
    assert {p.stem for p in SUITE_FILES} >= {
        "verl_grpo_qwen3_8b_sglang_gfx950",
        "verl_dapo_qwen25_math_7b_fully_async_gfx942",
        "verl_geo3k_qwen35_35b_a3b_moe_gfx950",
        "miles_grpo_qwen3_30b_a3b_gfx942",
        "miles_retool_qwen25_32b_gfx942",
    }
    assert [s.id for s in discover_suites(SUITES_DIR)] == sorted(p.stem for p in SUITE_FILES)


@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: p.stem)
def test_suite_loads_and_resolves(path: Path) -> None:
    suite = load_suite(path)
    assert suite.id == path.stem
    text = path.read_text()
    assert text.startswith("# "), "a suite starts with a header comment saying what it replays"
    assert "pytest suites/" in text and "rlbench " in text, "the header gives copy-paste commands"
    for pname in PROFILE_NAMES:
        prof = suite.profile(pname)
        for mode in prof.modes:
            cfg = suite.resolve_trainer_config(pname, mode, env=FAKE_ENV)
            assert "${" not in repr(cfg)
            tc = load_config(cfg)  # the trainer accepts it
            assert tc.trainer.mode == mode and tc.trainer.total_steps == prof.steps
    # full replays the published GPU count on the published arch; cpu needs nothing but CPU
    full, cpu = suite.profile("full"), suite.profile("cpu")
    if suite.published_on.gpus:
        assert full.requires.gpus == suite.published_on.gpus
    assert full.requires.arch == [suite.published_on.arch]
    assert set(full.requires.env) >= {"MODEL_DIR", "DATA_DIR"}
    assert cpu.requires.gpus == 0 and not cpu.requires.env
    cpu_cfg = load_config(suite.resolve_trainer_config("cpu", cpu.modes[0], env={}))
    assert cpu_cfg.rollout.engine == "hf" and cpu_cfg.trainer.device == "cpu"
    assert cpu_cfg.actor.strategy == "fsdp2" and cpu_cfg.data.train_files.startswith("synthetic:")
    assert cpu.steps <= 20 and cpu_cfg.data.max_response_length <= 24
    # every profile has at least one check that applies to it, and every reference cites and reasons
    for pname in PROFILE_NAMES:
        assert any(pname in r.profiles for r in suite.references), pname
    for r in suite.references:
        assert r.source.strip() and r.why.strip()
        if r.scope == "device":
            assert r.device


def test_full_profiles_keep_published_engines_and_mini_keeps_them_too() -> None:
    s = load_suite(SUITES_DIR / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    full = load_config(s.resolve_trainer_config("full", "colocated", env=FAKE_ENV))
    mini = load_config(s.resolve_trainer_config("mini", "colocated", env=FAKE_ENV))
    assert (full.rollout.engine, full.rollout.n, full.data.train_batch_size) == ("sglang", 5, 1024)
    assert (full.actor.ppo_mini_batch_size, full.actor.kl_loss_coef, full.actor.lr) == (256, 0.001, 1e-6)
    assert full.model.path == "/models/Qwen3-8B" and full.trainer.total_steps == 200
    assert mini.rollout.engine == "sglang" and "sglang" in s.profile("mini").requires.packages

    d = load_suite(SUITES_DIR / "verl_dapo_qwen25_math_7b_fully_async_gfx942.yaml")
    fa = load_config(d.resolve_trainer_config("full", "fully_async", env=FAKE_ENV))
    assert (fa.async_.rollout_gpus, fa.async_.train_gpus, fa.async_.staleness_threshold) == (16, 16, 0.5)
    assert (fa.async_.trigger_parameter_sync_step, fa.async_.partial_rollout) == (4, True)
    assert (fa.data.max_prompt_length, fa.data.max_response_length, fa.rollout.n) == (2048, 28672, 16)
    assert fa.rollout.engine == "vllm" and fa.actor.clip_ratio_high == 0.28
    assert d.profile("full").modes == ["colocated", "fully_async"]

    g = load_suite(SUITES_DIR / "verl_geo3k_qwen35_35b_a3b_moe_gfx950.yaml")
    co = load_config(g.resolve_trainer_config("full", "colocated", env=FAKE_ENV))
    fa = load_config(g.resolve_trainer_config("full", "fully_async", env=FAKE_ENV))
    assert (co.actor.megatron.tensor_model_parallel_size, co.actor.megatron.expert_model_parallel_size) == (2, 8)
    assert (fa.actor.megatron.tensor_model_parallel_size, fa.actor.megatron.expert_model_parallel_size) == (2, 4)
    assert (fa.async_.rollout_gpus, fa.async_.train_gpus) == (4, 4)
