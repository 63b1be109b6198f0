"""rlbench/selftest/run.py without training: which checks a truncated run settles, caught-by and false alarms."""

from __future__ import annotations

from pathlib import Path

from rlbench.run.runner import find_suite
from rlbench.selftest.mutations import MUTATIONS
from rlbench.selftest.run import DEFAULT_SUITE, Job, exit_code, markdown, prefix_checks, summarize


def test_prefix_checks_keep_only_what_the_first_steps_settle():
    suite = find_suite(DEFAULT_SUITE)
    kept = prefix_checks(suite, 2).references
    stats = {(r.metric, r.stat, r.op) for r in kept if r.kind == "metric"}
    assert ("training/rollout_probs_diff_max", None, "band") in stats  # every step seen holds the bound
    assert ("actor/kl_loss", "max", "<=") in stats  # a prefix's max is at most the run's
    assert not any(r.stat in ("delta", "mean_last", "mean", "slope", "peak") and r.window is None for r in kept)
    golden = [gs for r in kept if r.kind == "golden" for gs in r.stats]
    assert all(gs.stat != "mean_last" and not (gs.stat == "mean_first" and gs.n > 2) for gs in golden)
    assert prefix_checks(suite, None) is suite


def _job(name: str, seed: int, failed: list[str], passed: list[str]) -> Job:
    j = Job(name, seed, MUTATIONS.get(name), Path("x"))
    j.verdicts = {**{c: "fail" for c in failed}, **{c: "pass" for c in passed}}
    j.messages = {c: f"{c}: FAIL" for c in failed}
    return j


def test_a_check_failing_on_a_clean_seed_is_a_false_alarm_and_catches_nothing():
    suite = find_suite(DEFAULT_SUITE)
    jobs = [_job("clean", 5, [], ["a", "b"]), _job("clean", 6, ["b"], ["a"]),
            _job("weights_never_synced", 0, ["a", "b"], []), _job("reward_negated", 0, ["b"], ["a"])]
    result = summarize(suite, "cpu", jobs, tiny=False, sets=[], wall_s=1.0)
    rows = {r["mutation"]: r for r in result["mutations"]}
    assert rows["weights_never_synced"]["caught_by"] == ["a"] and rows["weights_never_synced"]["caught"]
    assert rows["reward_negated"]["caught_by"] == [] and not rows["reward_negated"]["caught"]
    assert result["summary"] == {"mutations": 2, "caught": 1, "clean_runs": 2, "clean_crashed": 0, "false_alarms": 1}
    assert exit_code(result) == 1
    text = markdown(result)
    assert "**NOT CAUGHT**" in text and "| 6 | 2 | `b` |" in text


def test_a_crashed_mutation_is_not_counted_as_caught():
    suite = find_suite(DEFAULT_SUITE)
    crashed = _job("grpo_no_group_mean", 0, [], [])
    crashed.crashed = "exit 1: Traceback"
    result = summarize(suite, "cpu", [_job("clean", 5, [], ["a"]), crashed], tiny=False, sets=[], wall_s=1.0)
    assert result["summary"]["caught"] == 0 and exit_code(result) == 1
    assert "run crashed: exit 1" in markdown(result)
