"""The rehearsal transform (rlbench/rehearse/transform.py): every difference from the profile is a recorded
change, and nothing else differs; the engine, backend, mode, algorithm and knobs stay as the profile says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbench.rehearse import mechanics
from rlbench.rehearse.run import rehearsal_status, write_table
from rlbench.rehearse.transform import SGLANG_NOTE, model_standin, rehearsal_config
from rlbench.suites.suite import discover_suites
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SUITES = discover_suites(ROOT / "suites")
CASES = [(s, p, m) for s in SUITES for p in ("full", "mini") for m in s.profile(p).modes]
_MISSING = object()


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


@pytest.mark.parametrize("suite,profile,mode", CASES, ids=[f"{s.id}-{p}-{m}" for s, p, m in CASES])
def test_every_change_is_recorded_and_nothing_else_changes(suite, profile, mode):
    plan = rehearsal_config(suite, profile, mode)
    before = _flatten(suite.resolve_trainer_config(profile, mode, expand=False))
    after = _flatten(plan.config)
    recorded = {c.field for c in plan.changes}
    for key in set(before) | set(after):
        b, a = before.get(key, _MISSING), after.get(key, _MISSING)
        if b == a:
            continue
        # a recorded change of a section covers its sub-keys (e.g. model.override_config baked into a folder)
        assert key in recorded or any(key.startswith(f + ".") for f in recorded), \
            f"{key}: {b!r} -> {a!r} is not recorded"
    for c in plan.changes:
        assert c.why and c.profile != c.rehearsal, c
    # kept as the profile says
    for key in ("rollout.engine", "actor.strategy", "trainer.mode", "algorithm.name", "algorithm.adv_estimator",
                "actor.use_kl_loss", "actor.kl_loss_coef", "actor.kl_loss_type", "actor.loss_agg_mode",
                "actor.clip_ratio_high", "actor.megatron.sequence_parallel", "async.staleness_threshold",
                "async.trigger_parameter_sync_step", "async.partial_rollout", "agent.enable", "agent.max_turns",
                "rollout.n", "rollout.temperature"):
        assert after.get(key, _MISSING) == before.get(key, _MISSING), key
    assert plan.config["trainer"]["device"] == "cpu"
    assert (plan.engine_note == SGLANG_NOTE) == (plan.config["rollout"]["engine"] == "sglang")
    load_config(plan.config)  # a valid trainer config


def test_layout_shape_kept_when_the_world_is_shrunk():
    miles = next(s for s in SUITES if s.id.startswith("miles_grpo"))
    plan = rehearsal_config(miles, "full", "colocated")
    meg = plan.config["actor"]["megatron"]
    assert plan.config["trainer"]["n_gpus_per_node"] == 4  # 8 ranks -> 4
    assert (meg["tensor_model_parallel_size"], meg["expert_model_parallel_size"]) == (2, 4)  # TP4/EP8 -> TP2/EP4
    dapo = next(s for s in SUITES if s.id.startswith("verl_dapo"))
    assert rehearsal_config(dapo, "full", "colocated").nodes == 4  # 4 nodes: Ray's multi-node test cluster


def test_model_standins_keep_the_architecture():
    assert model_standin("${MODEL_DIR}/Qwen3-30B-A3B")[0] == "tiny:qwen3_moe"
    assert model_standin("${MODEL_DIR}/Qwen3.5-35B-A3B")[0] == "tiny:qwen3.5-moe"
    assert model_standin("${MODEL_DIR}/Qwen3-8B")[0] == "tiny:qwen3"
    assert model_standin("${MODEL_DIR}/Qwen2.5-Math-7B")[0] == "tiny:qwen2"
    assert model_standin("${MODEL_DIR}/retool-sft-qwen2.5-32b-ins")[0] == "tiny:qwen2"
    assert model_standin("embedded:smollm2-135m-instruct")[0] == "tiny:llama"
    assert model_standin("/models/DeepSeek-V3") is None


def _rows(n: int, **over) -> dict[int, dict]:
    base = {"actor/pg_loss": 0.1, "training/rollout_probs_diff_max": 1e-7, "actor/ppo_kl_first_minibatch": 0.0,
            "actor/grad_norm": 0.5, "critic/score/max": 1.0, "critic/score/min": 0.0}
    return {s: {**base, **{k: v[s - 1] if isinstance(v, list) else v for k, v in over.items()}} for s in range(1, n + 1)}


def test_mechanics_pass_clean_and_fail_a_bad_sync_or_nan():
    ok = mechanics.evaluate_mechanics(_rows(3), total_steps=3, mode="colocated")
    assert all(c["result"] == "pass" for c in ok), ok
    bad_sync = mechanics.evaluate_mechanics(_rows(3, **{"training/rollout_probs_diff_max": [1e-7, 0.05, 0.04]}),
                                            total_steps=3, mode="colocated")
    assert {c["check"] for c in bad_sync if c["result"] == "fail"} == {"logprob_agreement", "weight_sync"}
    nan = mechanics.evaluate_mechanics(_rows(3, **{"actor/pg_loss": [0.1, "nan", 0.1]}), total_steps=3, mode="colocated")
    assert [c["check"] for c in nan if c["result"] == "fail"] == ["finite_losses"]
    flat = mechanics.evaluate_mechanics(_rows(3, **{"actor/grad_norm": 0.0, "critic/score/max": 0.0}), total_steps=3,
                                        mode="colocated")
    assert [c["result"] for c in flat if c["check"] == "update"] == ["not evaluated"]  # equal rewards: no gradient
    stuck = mechanics.evaluate_mechanics(_rows(3, **{"actor/grad_norm": 0.0}), total_steps=3, mode="colocated")
    assert [c["result"] for c in stuck if c["check"] == "update"] == ["fail"]  # rewards differ, no gradient
    short = mechanics.evaluate_mechanics(_rows(2), total_steps=3, mode="colocated")
    assert short[0] == {"check": "steps", "result": "fail", "detail": "2 of 3 training steps logged"}
    moe = mechanics.evaluate_mechanics(_rows(3, **{"actor/moe/router_entropy": 1.5, "actor/moe/expert_load/cv": 0.3}),
                                       total_steps=3, mode="colocated", moe_experts=4)
    assert [c["check"] for c in moe if c["result"] == "fail"] == ["moe_routing:router_entropy"]  # above ln 4


def test_list_lines_come_from_the_recorded_rehearsals(tmp_path: Path):
    rec = {"suite": "s", "profile": "full", "mode": "colocated", "fault": None, "outcome": "refused",
           "line": "actor.use_kl_loss: not built", "as_profile_says": False, "changes": [{}], "engine_note": "",
           "steps_run": 0, "steps_planned": 3, "checks_passed": 0, "checks_evaluated": 0, "wall_s": 1.0,
           "commit": "abc", "date": "2026-12-02T10:00:00+00:00"}
    (tmp_path / "s.full.colocated.json").write_text(json.dumps(rec))
    (tmp_path / "s.full.fully_async.json").write_text(json.dumps({**rec, "mode": "fully_async", "outcome": "pass",
                                                                  "line": ""}))
    assert rehearsal_status("s", "full", tmp_path) == [
        "cannot run anywhere yet: colocated: actor.use_kl_loss: not built (rehearsal abc 2026-12-02)"]
    assert rehearsal_status("s", "mini", tmp_path) == []
    write_table(tmp_path)
    assert "| s | full | colocated | refused: actor.use_kl_loss: not built |" in (tmp_path / "README.md").read_text()
