"""`actor.strategy: megatron` on the Ray trainer workers (CPU, gloo, tiny random-init models).

Colocated on 2 workers (`trainer.use_ray`): TP=1 (DP=2) and TP=2 (DP=1) on tiny:qwen3, EP=2 (the dense
part DP=2, load-balancing loss 0.01) on tiny:qwen3_moe log the same per-step numbers, `actor/moe/*`
included, as the FSDP2 run of the same config and seed
(the engines sample the same rollouts, so the whole run is comparable; fp32 bound: rel 1e-4, abs 2e-6),
and after every update the engines hold the trainer's weights (`training/rollout_probs_diff_max` < 1e-4;
about 3e-9 on clean runs, 2.4e-3 when the export hands out stale weights). A TP=2 run stopped after step
2's checkpoint and resumed logs what the uninterrupted run logs. With the KL loss on, TP=2 (and EP=2, slow
tier) logs the FSDP2 run's numbers, `actor/kl_loss` included: the reference policy is built in the policy's layout. Fully-async with 1 rollout + 2 trainer
workers at TP=2, strictly on-policy (staleness 0, a sync after every step): the broadcast reaches the
rollout worker (the same bound at every version). Each run takes ~25-50 s on 2 busy cores.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer.backends.strategy import megatron_missing
from trainer.components.checkpoint import latest_checkpoint
from trainer.components.metrics import read_metrics
from trainer.config import load_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(megatron_missing() is not None,
                                 reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")]
ray = pytest.importorskip("ray")

WEIGHTS_REACHED = 1e-4  # training/rollout_probs_diff_max when the engines hold the trainer's weights
REL, ABS = 1e-4, 2e-6  # fp32: two backends, two reduction orders
MOE_AUX = ("actor.moe_aux_loss_coeff=0.01",)  # MoE runs: the router load-balancing loss in both backends


def _cfg(out: Path, model: str, strategy: str, *overrides: str):
    if "moe" in model:
        overrides = (*MOE_AUX, *overrides)
    return load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={out}", f"model.path={model}", f"actor.strategy={strategy}", "trainer.use_ray=true",
        "trainer.n_gpus_per_node=2", "trainer.progress=false", "trainer.save_freq=0", "trainer.total_steps=3",
        "trainer.test_freq=0", "trainer.num_threads=1",
        # two optimizer steps per step (ppo_kl > 0, AdamW moments matter), steps large enough to move the weights
        "actor.ppo_mini_batch_size=2", "actor.lr=0.01", "actor.entropy_coeff=0.01", *overrides])


def _run(cfg) -> list[dict]:
    from trainer.api import train

    return read_metrics(train(cfg))


def _numbers(line: dict) -> dict:
    return {k: v for k, v in line["data"].items() if not k.startswith(("timing_s/", "perf/"))}


@pytest.fixture(scope="module")
def fsdp2_runs(tmp_path_factory):
    """The FSDP2 run on 2 workers, once per model."""
    cache: dict[str, list[dict]] = {}

    def get(model: str) -> list[dict]:
        if model not in cache:
            cache[model] = _run(_cfg(tmp_path_factory.mktemp("fsdp2"), model, "fsdp2"))
        return cache[model]

    return get


FSDP2_ONLY = {"training/clipfrac_witness_err", "training/grad_clip_err", "training/grad_stale_max",
              "training/loss_witness_err", "training/optimizer_steps_err", "training/optimizer_update_err"}


@pytest.mark.parametrize(("model", "layout"), [
    ("tiny:qwen3", ()),
    ("tiny:qwen3", ("actor.megatron.tensor_model_parallel_size=2",)),
    ("tiny:qwen3_moe", ("actor.megatron.expert_model_parallel_size=2",)),
], ids=["qwen3-tp1-dp2", "qwen3-tp2-dp1", "qwen3_moe-ep2-dp2"])
def test_colocated_ray_megatron_equals_fsdp2(tmp_path: Path, fsdp2_runs, model: str, layout: tuple[str, ...]):
    _assert_same_run(_run(_cfg(tmp_path, model, "megatron", *layout)), fsdp2_runs(model))


KL = ("actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", "actor.kl_loss_type=low_var_kl")


@pytest.mark.parametrize(("model", "layout"), [
    ("tiny:qwen3", ("actor.megatron.tensor_model_parallel_size=2",)),
    pytest.param("tiny:qwen3_moe", ("actor.megatron.expert_model_parallel_size=2",), marks=pytest.mark.slow),
], ids=["qwen3-tp2-dp1", "qwen3_moe-ep2-dp2"])
def test_kl_loss_reference_under_megatron_equals_fsdp2(tmp_path: Path, model: str, layout: tuple[str, ...]):
    """`actor.use_kl_loss` under Megatron: the reference policy, a second GPTModel in the policy's layout, gives
    the FSDP2 run's KL loss (and every other number) at every step; the KL has left zero by the last step."""
    meg = _run(_cfg(tmp_path / "megatron", model, "megatron", *layout, *KL))
    _assert_same_run(meg, _run(_cfg(tmp_path / "fsdp2", model, "fsdp2", *KL)))
    assert meg[-1]["data"]["actor/kl_loss"] > 1e-6 and meg[-1]["data"]["timing_s/ref"] > 0


def _assert_same_run(meg: list[dict], ref: list[dict]) -> None:
    """The Megatron run's metrics equal the FSDP2 run's at every step (REL / ABS), the weights reached the engines."""
    assert [ln["step"] for ln in meg] == [ln["step"] for ln in ref] == [1, 2, 3]
    assert all(ln["data"]["actor/grad_norm"] > 0 for ln in meg) and meg[-1]["data"]["actor/ppo_kl"] != 0
    for a, b in zip(meg, ref):
        na, nb = _numbers(a), _numbers(b)
        # actor/moe/* too on the MoE model; the update witness (loss and optimizer re-derived apart) is the
        # FSDP2 actor's alone: Megatron has its own optimizer and update (Actor.update_witness)
        nb = {k: v for k, v in nb.items() if k not in FSDP2_ONLY}
        assert set(na) == set(nb), set(na) ^ set(nb)
        assert na["training/rollout_probs_diff_max"] < WEIGHTS_REACHED, a["step"]
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=REL, abs=ABS), (a["step"], k, na[k], nb[k])


@pytest.mark.slow  # resume through the same checkpoint path: tests/integration/test_megatron_resume.py
def test_colocated_ray_megatron_tp2_resume_reproduces_uninterrupted_run(tmp_path: Path):
    tp2 = ("actor.megatron.tensor_model_parallel_size=2", "trainer.save_freq=2")
    full = _run(_cfg(tmp_path / "full", "tiny:qwen3", "megatron", *tp2))
    part = tmp_path / "part"
    _run(_cfg(part, "tiny:qwen3", "megatron", *tp2, "trainer.total_steps=2"))  # "killed" after step 2's checkpoint
    ckpt = latest_checkpoint(part)
    assert ckpt is not None and ckpt.name == "step_000002" and (ckpt / "actor.pt").is_file()
    resumed = _run(_cfg(part, "tiny:qwen3", "megatron", *tp2))
    assert [ln["step"] for ln in resumed] == [ln["step"] for ln in full] == [1, 2, 3]
    for a, b in zip(full, resumed):
        na, nb = _numbers(a), _numbers(b)
        assert na.keys() == nb.keys(), a["step"]
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-6, abs=1e-9), (a["step"], k)


def test_fully_async_megatron_two_trainer_workers(tmp_path: Path):
    cfg = load_config("trainer/configs/grpo_tiny_arithmetic.yaml", [
        f"trainer.out_dir={tmp_path}", "model.path=tiny:qwen3", "actor.strategy=megatron",
        "actor.megatron.tensor_model_parallel_size=2", "trainer.mode=fully_async", "async.train_gpus=2",
        "async.staleness_threshold=0", "async.trigger_parameter_sync_step=1", "trainer.progress=false",
        "trainer.save_freq=0", "trainer.test_freq=0", "trainer.total_steps=3", "trainer.num_threads=1",
        "actor.lr=0.01", "actor.entropy_coeff=0.01"])
    rows = [ln["data"] for ln in _run(cfg)]
    assert len(rows) == 3
    assert [r["fully_async/count/current_param_version"] for r in rows] == [0.0, 1.0, 2.0]
    for r in rows:
        assert r["fully_async/staleness/max_version_lag"] == 0
        assert 0 < r["actor/grad_norm"] < 10 and 0 < r["actor/entropy"] < 10 and math.isfinite(r["actor/pg_loss"])
        # trained on what the rollout worker sampled under the weights broadcast after the previous step
        assert r["training/rollout_probs_diff_max"] < WEIGHTS_REACHED
