"""Every shipped suite file loads, validates and resolves a trainer config for each profile and mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.suites.suite import discover_suites, load_suite
from trainer.config import load_config
from trainer.errors import ConfigError

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
    assert suite.profile_names()[:3] == ["full", "mini", "cpu"]  # required; cpu-vllm optional
    for pname in suite.profile_names():
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
    # CI cost: few steps and short responses; a tool round trip (Miles JSON call, output, answer) is
    # about 70 SmolLM2 tokens, so a multi-turn cpu profile may use up to 80
    assert cpu.steps <= 20 and cpu_cfg.data.max_response_length <= (80 if cpu_cfg.agent.enable else 24)
    # every profile has at least one check that applies to it, and every reference cites and reasons
    for pname in suite.profile_names():
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


def test_cpu_vllm_profile_is_the_cpu_profile_on_vllm_in_both_modes() -> None:
    """DAPO's cpu-vllm: the cpu profile's model, data and algorithm, with vLLM, colocated on Ray and fully-async."""
    d = load_suite(SUITES_DIR / "verl_dapo_qwen25_math_7b_fully_async_gfx942.yaml")
    prof = d.profile("cpu-vllm")
    assert prof.modes == ["colocated", "fully_async"] and prof.requires.packages == ["vllm"]
    assert prof.requires.gpus == 0 and len(prof.seeds) >= 3
    cpu = load_config(d.resolve_trainer_config("cpu", "fully_async", env={}))
    co = load_config(d.resolve_trainer_config("cpu-vllm", "colocated", env={}))
    fa = load_config(d.resolve_trainer_config("cpu-vllm", "fully_async", env={}))
    assert co.trainer.use_ray and co.trainer.mode == "colocated" and co.trainer.n_gpus_per_node == 1
    assert (fa.async_.rollout_gpus, fa.async_.train_gpus) == (1, 1)
    for c in (co, fa):
        assert c.rollout.engine == "vllm" and c.rollout.gpu_memory_utilization == 0.15
        assert c.trainer.device == "cpu" and c.model.path == cpu.model.path and c.data == cpu.data
        assert c.actor == cpu.actor and c.algorithm == cpu.algorithm and c.rollout.n == cpu.rollout.n
    # every check of the cpu profile but the 4-step learning and golden windows applies to cpu-vllm too
    cpu_refs = [r for r in d.references if "cpu" in r.profiles and r.kind == "metric" and r.n != 4]
    assert cpu_refs and all("cpu-vllm" in r.profiles for r in cpu_refs)
    assert [r.n for r in d.references if "cpu-vllm" in r.profiles and r.stat == "delta"] == [3]
    # the other suites define no cpu-vllm profile, and asking for it says so in one line
    g = load_suite(SUITES_DIR / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    assert "cpu-vllm" not in g.profile_names()
    with pytest.raises(ConfigError, match="has no cpu-vllm profile .*defines full, mini, cpu"):
        g.profile("cpu-vllm")
