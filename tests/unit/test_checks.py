"""Statistics, comparisons, ratio checks, scopes and messages of rlbench.checks.metric and rlbench.checks.evaluate, on hand-computed series."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlbench.checks.evaluate import device_matches, evaluate
from rlbench.checks.metric import compare, compute_stat
from rlbench.suites.suite import Suite, load_suite

NAN = float("nan")
SUITES = Path(__file__).resolve().parents[2] / "suites"


def frame(**cols: list[float]) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    df = pd.DataFrame(cols, index=pd.Index(range(n), name="step"))
    return df


X = frame(x=[0.1, 0.4, NAN, 0.3, 0.9, 0.7])  # steps 0..5, step 2 lacks the metric


@pytest.mark.parametrize("stat,kw,value,steps", [
    ("peak", {}, 0.9, [0, 1, 3, 4, 5]),
    ("max", {"window": (1, 3)}, 0.4, [1, 3]),
    ("min", {}, 0.1, [0, 1, 3, 4, 5]),
    ("final", {}, 0.7, [5]),
    ("first", {}, 0.1, [0]),
    ("first", {"window": (2, 5)}, 0.3, [3]),
    ("mean", {}, 0.48, [0, 1, 3, 4, 5]),          # 2.4 / 5
    ("mean", {"window": (1, 3)}, 0.35, [1, 3]),
    ("median", {}, 0.4, [0, 1, 3, 4, 5]),         # sorted 0.1 0.3 0.4 0.7 0.9
    ("median", {"window": (3, 5)}, 0.7, [3, 4, 5]),
    ("mean_last", {"n": 2}, 0.8, [4, 5]),
    ("mean_first", {"n": 2}, 0.25, [0, 1]),
    ("delta", {"n": 2}, 0.55, [0, 1, 3, 4, 5]),   # 0.8 - 0.25
    ("steps_to_reach", {"threshold": 0.5}, 4.0, [0, 1, 3, 4]),
])
def test_statistics(stat: str, kw: dict, value: float, steps: list[int]) -> None:
    sv = compute_stat(X, "x", stat, **kw)
    assert sv.value == pytest.approx(value)
    assert sv.steps.tolist() == steps


def test_slope_is_least_squares() -> None:
    # t = 0..3, y = 1 2 2 5: sum((t-1.5)(y-2.5)) = 6, sum((t-1.5)^2) = 5 -> 1.2
    assert compute_stat(frame(y=[1, 2, 2, 5]), "y", "slope").value == pytest.approx(1.2)
    assert compute_stat(frame(y=[3.0 - 0.5 * t for t in range(50)]), "y", "slope").value == pytest.approx(-0.5)
    assert compute_stat(frame(y=[1.0, NAN]), "y", "slope").value is None  # one point has no trend


def test_steps_to_reach_never_and_empty_window() -> None:
    sv = compute_stat(X, "x", "steps_to_reach", threshold=1.0)
    assert sv.value is None and "never reached 1" in sv.note
    assert compute_stat(X, "x", "peak", window=(100, 200)).value is None


def test_no_nan_counts_from_the_first_logged_step() -> None:
    f = frame(loss=[NAN, 1.0, 2.0, math.inf, 3.0, NAN])  # step 0 is the validation-only step
    sv = compute_stat(f, "loss", "no_nan")
    assert sv.value == 2 and sv.steps.tolist() == [1, 2, 3, 4, 5] and "step 3" in sv.note
    assert compute_stat(frame(loss=[NAN, 1.0, 2.0]), "loss", "no_nan").value == 0


def test_compare() -> None:
    assert compare(0.93, ">=", 0.956, 0.03, False) == (True, ">= 0.926", "0.956 - tol 0.03")
    assert compare(0.90, ">=", 0.956, 0.03, False)[0] is False
    assert compare(0.0021, "<=", 0.002, 0.0, False) == (False, "<= 0.002", "")
    ok, bound, _ = compare(250, "approx", 219, 0.15, True)  # 219 +- 32.85
    assert ok and bound == "219 +- 32.85"
    assert compare(252, "approx", 219, 0.15, True)[0] is False
    assert compare(-0.9, "approx", -0.98, 0.1, False)[0] is True


def test_device_matching_is_by_token() -> None:
    assert device_matches("MI300X", "AMD Instinct MI300X")
    assert device_matches("mi355x", "AMD Instinct MI355X OAM")
    assert not device_matches("MI300X", "AMD Instinct MI300A")
    assert not device_matches("H20", "NVIDIA H200")
    assert device_matches("H200", "NVIDIA H200")


def toy_suite(references: list[dict], modes: dict | None = None, profile_modes: list[str] | None = None,
              steps: int = 10) -> Suite:
    modes = modes or {"colocated": {"gpus": 8}, "fully_async": {"rollout_gpus": 4, "train_gpus": 4,
                                                                 "staleness_threshold": 0.5,
                                                                 "trigger_parameter_sync_step": 4}}
    pm = profile_modes or list(modes)
    prof = {"modes": pm, "steps": steps}
    return Suite.model_validate({
        "id": "toy", "title": "t", "description": "d",
        "source": [{"doc": "000_af77aeb111e0721a.txt", "where": "w"}],
        "published_on": {"arch": "gfx950", "device": "MI350X", "gpus": 8},
        "trainer": {}, "modes": modes, "profiles": {"full": prof, "mini": prof, "cpu": prof},
        "references": [{"source": "000_af77aeb111e0721a.txt: s", "why": "w", **r} for r in references],
    })


def test_failure_message_names_metric_expectation_source_actual_steps() -> None:
    s = toy_suite([{"metric": "val-core/openai/gsm8k/acc/mean@1", "stat": "peak", "window": [0, 200], "op": ">=",
                    "value": 0.956, "tol": 0.03, "source": "000_af77aeb111e0721a.txt: GSM8K peak 0.956"}],
                  modes={"colocated": {"gpus": 8}})
    steps = list(range(0, 201, 5))
    acc = [0.82 + 0.08 * min(t, 100) / 100 for t in steps]  # rises to 0.90, then holds
    run = pd.DataFrame({"val-core/openai/gsm8k/acc/mean@1": acc}, index=pd.Index(steps, name="step"))
    (r,) = evaluate(s, "full", {"colocated": run}, arch="gfx950", device_name="AMD Instinct MI355X")
    assert r.verdict == "fail" and r.actual == pytest.approx(0.90)
    assert r.message.startswith(
        "val-core/openai/gsm8k/acc/mean@1 peak over steps 0-200 = 0.900 (at step 100), expected >= 0.926 "
        "(0.956 - tol 0.03; 000_af77aeb111e0721a.txt: GSM8K peak 0.956): FAIL")
    assert "\n" not in r.message and r.ref_value == 0.956 and r.steps == steps
    run2 = run.assign(**{"val-core/openai/gsm8k/acc/mean@1": [a + 0.04 for a in acc]})
    (r2,) = evaluate(s, "full", {"colocated": run2}, arch="gfx950", device_name="MI350X")
    assert r2.verdict == "pass" and r2.message.endswith(": PASS")


def test_band_reports_the_first_offending_step() -> None:
    s = toy_suite([{"metric": "actor/ppo_kl", "op": "band", "lo": -0.001, "hi": 0.001, "window": [1, 5]}],
                  modes={"colocated": {"gpus": 8}})
    run = frame(**{"actor/ppo_kl": [NAN, 1e-4, 2e-4, 5e-3, -3e-3, 1e-4, 9.0]})  # step 6 is outside the window
    (r,) = evaluate(s, "full", {"colocated": run}, arch="gfx950", device_name="MI350X")
    assert r.verdict == "fail" and r.actual == 2
    assert "2 of 5 steps outside, first step 3 = 0.005" in r.message and r.ref_band == (-0.001, 0.001)
    run.loc[3, "actor/ppo_kl"] = 0.0
    run.loc[4, "actor/ppo_kl"] = 0.0
    assert evaluate(s, "full", {"colocated": run}, arch="gfx950", device_name="MI350X")[0].verdict == "pass"


def test_ratio_between_modes() -> None:
    s = toy_suite([{"kind": "ratio", "metric": "timing_s/step", "stat": "median", "window": [1, 64],
                    "num": "colocated", "den": "fully_async", "op": ">=", "value": 1.8, "tol": 0.3,
                    "scope": "device", "device": "MI300X"}])
    steps = pd.Index(range(1, 101), name="step")
    colo = pd.DataFrame({"timing_s/step": np.where(steps <= 64, 394.0, 1000.0)}, index=steps)
    fa = pd.DataFrame({"timing_s/step": np.where(steps <= 64, 219.0, 1.0)}, index=steps)
    runs = {"colocated": colo, "fully_async": fa}
    (r,) = evaluate(s, "full", runs, arch="gfx942", device_name="AMD Instinct MI300X")
    assert r.verdict == "pass" and r.actual == pytest.approx(394 / 219)  # the window excludes steps > 64
    assert "(394/219)" in r.message and r.run == "colocated/fully_async"
    fa2 = pd.DataFrame({"timing_s/step": 300.0}, index=steps)  # 1.31 < 1.5
    (r2,) = evaluate(s, "full", {"colocated": colo, "fully_async": fa2}, arch="gfx942", device_name="MI300X")
    assert r2.verdict == "fail" and "expected >= 1.5 (1.8 - tol 0.3;" in r2.message
    (r3,) = evaluate(s, "full", {"colocated": colo}, arch="gfx942", device_name="MI300X")
    assert r3.verdict == "error" and "no run for mode fully_async" in r3.message


def test_scopes_skip_with_reasons() -> None:
    refs = [
        {"id": "num", "metric": "m", "stat": "final", "op": ">=", "value": 0.5, "tol": 0.1},
        {"id": "num_cross", "metric": "m", "stat": "final", "op": ">=", "value": 0.5, "tol": 0.0,
         "cross_arch_tol": 0.2},
        {"id": "dev", "metric": "m", "stat": "final", "op": ">=", "value": 0.5, "scope": "device",
         "device": "MI300X"},
        {"id": "cpu_only", "metric": "m", "stat": "final", "op": ">=", "value": 0.5, "profiles": ["cpu"]},
    ]
    s = toy_suite(refs, modes={"colocated": {"gpus": 8}}, steps=1)
    run = {"colocated": frame(m=[0.1, 0.35])}
    res = {r.check_id: r for r in evaluate(s, "full", run, arch="gfx942", device_name="AMD Instinct MI300X")}
    assert res["num"].verdict == "skip" and "numerics reference for gfx950 without cross_arch_tol" in res["num"].message
    assert res["num_cross"].verdict == "pass"  # 0.35 >= 0.5 - 0.2 with the cross-arch tolerance
    assert "cross-arch tol for gfx942" in res["num_cross"].expected
    assert res["dev"].verdict == "fail"  # applies on MI300X: 0.35 < 0.5
    assert res["cpu_only"].verdict == "skip" and "applies to profile cpu" in res["cpu_only"].message
    res = {r.check_id: r for r in evaluate(s, "full", run, arch="gfx950", device_name="AMD Instinct MI355X")}
    assert res["num"].verdict == "fail" and res["num_cross"].verdict == "fail"  # own arch: tol 0.1 / 0.0
    assert res["dev"].verdict == "skip" and "device-scoped to MI300X" in res["dev"].message
    # on mini/cpu, numerics references default to any arch
    res = {r.check_id: r for r in evaluate(s, "cpu", run, arch="cpu", device_name="cpu")}
    assert res["cpu_only"].verdict == "fail" and res["num"].verdict == "skip"


def test_modes_expand_and_missing_metric_lists_nearest() -> None:
    s = toy_suite([{"metric": "actor/ppo_k1", "stat": "max", "op": "<=", "value": 0.01},
                   {"metric": "actor/ppo_kl", "stat": "max", "op": "<=", "value": 0.01, "modes": ["fully_async"]}],
                  profile_modes=["colocated", "fully_async"], steps=1)
    f = frame(**{"actor/ppo_kl": [0.001, 0.002], "actor/pg_loss": [1.0, 0.5], "critic/score/mean": [0.1, 0.2]})
    res = evaluate(s, "full", {"colocated": f, "fully_async": f}, arch="gfx950", device_name="MI350X")
    assert [(r.check_id, r.verdict) for r in res] == [
        ("actor/ppo_k1:max<=0.01@colocated", "not_evaluated"), ("actor/ppo_k1:max<=0.01@fully_async", "not_evaluated"),
        ("actor/ppo_kl:max<=0.01@fully_async", "pass")]
    assert "metric actor/ppo_k1 not in run 'colocated' (nearest: actor/ppo_kl" in res[0].message


def test_shipped_cpu_profile_passes_on_a_learning_run(tmp_path: Path) -> None:
    suite = load_suite(SUITES / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    steps = pd.Index(range(21), name="step")
    t = np.arange(21, dtype=float)
    run = pd.DataFrame({"critic/score/mean": np.where(t > 0, 0.2 + 0.02 * t, np.nan),
                        "actor/ppo_kl": np.where(t > 0, 1e-4, np.nan),
                        "actor/pg_loss": np.where(t > 0, -0.01, np.nan),
                        "response_length/mean": np.where(t > 0, 12.0, np.nan)}, index=steps)
    res = evaluate(suite, "cpu", {"colocated": run}, arch="cpu", device_name="cpu", golden_dir=tmp_path)
    verdicts = {r.check_id: r.verdict for r in res}
    assert verdicts["critic/score/mean:delta>=0.05"] == "pass"  # (0.58+...)/5 - (0.22+...)/5 = 0.3
    kl = next(r for r in suite.references if r.metric == "actor/ppo_kl" and r.stat == "first" and "cpu" in r.profiles)
    assert verdicts[kl.check_id()] == "pass"
    assert verdicts["actor/pg_loss:no_nan"] == "pass"
    assert verdicts["response_length/mean:each in [1,24]"] == "pass"
    other = {ref.check_id() for ref in suite.references if "cpu" not in ref.profiles}
    assert other and all(r.verdict == "skip" for r in res if r.check_id in other)  # references of full/mini
    flat = run.assign(**{"critic/score/mean": 0.3})
    res = evaluate(suite, "cpu", {"colocated": flat}, arch="cpu", device_name="cpu", golden_dir=tmp_path)
    assert {r.check_id: r.verdict for r in res}["critic/score/mean:delta>=0.05"] == "fail"


def test_evaluating_a_long_run_is_fast() -> None:
    rng = np.random.default_rng(0)
    n_steps, n_metrics = 10_000, 50
    names = [f"group{i % 5}/metric_{i}" for i in range(n_metrics)]
    run = pd.DataFrame(rng.random((n_steps, n_metrics)), columns=names, index=pd.Index(range(n_steps), name="step"))
    stats = ["peak", "mean_last", "median", "slope", "steps_to_reach", "no_nan", "delta", "mean", "first", "final"]
    refs = []
    for i, name in enumerate(names):
        st = stats[i % len(stats)]
        ref = {"metric": name, "stat": st, "op": ">=", "value": -1.0, "window": [100, 9000]}
        if st == "steps_to_reach":
            ref["threshold"] = 0.5
        if st == "no_nan":
            ref.update(op="<=", value=0.0)
        refs.append(ref)
    refs.append({"metric": names[0], "op": "band", "lo": 0.0, "hi": 1.0})
    s = toy_suite(refs, modes={"colocated": {"gpus": 8}})
    t0 = time.perf_counter()
    res = evaluate(s, "full", {"colocated": run}, arch="gfx950", device_name="MI350X")
    elapsed = time.perf_counter() - t0
    assert len(res) == 51 and all(r.verdict == "pass" for r in res), [r.message for r in res if r.verdict != "pass"]
    assert elapsed < 1.0, f"evaluate took {elapsed:.2f}s for 51 checks over 10k steps"


def test_engine_scoped_check_is_skipped_with_its_reason_on_another_engine() -> None:
    """A check that reads the engine's own parameters: evaluated (and able to fail) on hf, skipped with
    the reference's reason on vLLM, whether or not the vLLM log has the metric."""
    s = toy_suite([{"metric": "training/weight_sync_max_abs_diff", "op": "band", "lo": 0.0, "hi": 0.0,
                    "profiles": ["cpu"], "source": "rlbench: exact copy",
                    "engines": {"only": ["hf", "static"], "why": "vLLM keeps its weights in its own process"}}],
                  modes={"colocated": {"gpus": 1}})
    bad = frame(**{"training/weight_sync_max_abs_diff": [0.0, 0.0, 0.3]})
    (r,) = evaluate(s, "cpu", {"colocated": bad}, arch="cpu", device_name="cpu", steps=2)  # default engine: hf
    assert r.verdict == "fail"
    (r,) = evaluate(s, "cpu", {"colocated": bad}, arch="cpu", device_name="cpu", steps=2, engines={"colocated": "hf"})
    assert r.verdict == "fail"
    for run in (bad, frame(x=[0.0, 1.0, 2.0])):  # with or without the metric
        (r,) = evaluate(s, "cpu", {"colocated": run}, arch="cpu", device_name="cpu", steps=2,
                        engines={"colocated": "vllm"})
        assert r.verdict == "skip"
        assert r.message == ("training/weight_sync_max_abs_diff:each in [0,0]: SKIP (computed with rollout.engine "
                             "hf/static only; this run's engine is vllm: vLLM keeps its weights in its own process)")
    with pytest.raises(ValueError, match="'engines' applies to kind 'metric' only"):
        toy_suite([{"kind": "ratio", "metric": "timing_s/step", "stat": "median", "num": "colocated",
                    "den": "fully_async", "op": ">=", "value": 1.0,
                    "engines": {"only": ["hf"], "why": "w"}}])


def test_profile_engines_follow_the_overrides() -> None:
    from rlbench.checks.evaluate import profile_engines

    dapo = load_suite(SUITES / "verl_dapo_qwen25_math_7b_fully_async_gfx942.yaml")
    assert profile_engines(dapo, "cpu") == {"fully_async": "hf"}
    assert profile_engines(dapo, "cpu", ["rollout.engine=vllm"]) == {"fully_async": "vllm"}
    assert profile_engines(dapo, "cpu-vllm") == {"colocated": "vllm", "fully_async": "vllm"}


def test_logs_made_elsewhere_take_the_engine_of_the_config_beside_them(tmp_path: Path) -> None:
    from rlbench.run.runner import logged_engines

    for d, text in (("a", "rollout: {engine: vllm, n: 4}\n"), ("b", None), ("c", "rollout: [\n")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "metrics.jsonl").write_text("")
        if text is not None:
            (tmp_path / d / "config.yaml").write_text(text)
    logs = {m: str(tmp_path / d / "metrics.jsonl") for m, d in (("colocated", "a"), ("fully_async", "b"), ("x", "c"))}
    assert logged_engines(logs) == {"colocated": "vllm"}  # no config, or an unreadable one: the profile's engine
