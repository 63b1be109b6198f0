"""One rehearsal end to end (rlbench/rehearse/): the Miles GRPO mini profile, as its config says but on CPU at
tiny scale: the Megatron backend (megatron-core through mbridge, gloo), the SGLang adapter against the tests'
engine double driven by a tiny random-init Llama (SmolLM2's architecture), 3 GRPO steps. ~25 s on 2 cores.
The planted fault (a Megatron weight export that skips the last TP rank's shards) needs 4 ranks: slow tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.backends.strategy import megatron_missing

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")


def test_miles_grpo_mini_rehearsal_passes_its_mechanics(tmp_path: Path):
    from rlbench.rehearse.run import rehearse
    from rlbench.rehearse.transform import SGLANG_NOTE

    rec = rehearse("miles_grpo_qwen3_30b_a3b_gfx942", "mini", "colocated", report_dir=tmp_path / "reports",
                   run_root=tmp_path / "runs", status=lambda line: None)
    assert rec["outcome"] == "pass", rec["line"]
    assert rec["steps_run"] == rec["steps_planned"] == 3
    checks = {c["check"]: c["result"] for c in rec["checks"]}
    for name in ("finite_losses", "logprob_agreement", "weight_sync", "on_policy_first_minibatch", "engine:sglang_double"):
        assert checks[name] == "pass", rec["checks"]
    assert rec["engine_note"] == SGLANG_NOTE
    assert rec["published_references"].endswith("not evaluated (rehearsal)")
    assert (tmp_path / "reports" / "README.md").is_file()


@pytest.mark.slow
def test_planted_tp_shard_fault_fails_the_rehearsal_that_passes_clean(tmp_path: Path):
    from rlbench.rehearse.run import rehearse

    kw = dict(report_dir=tmp_path / "reports", run_root=tmp_path / "runs", status=lambda line: None)
    clean = rehearse("miles_grpo_qwen3_30b_a3b_gfx942", "full", "colocated", **kw)
    assert clean["outcome"] == "pass", clean["line"]
    bad = rehearse("miles_grpo_qwen3_30b_a3b_gfx942", "full", "colocated", fault="tp_shard", **kw)
    failed = {c["check"] for c in bad["checks"] if c["result"] == "fail"}
    assert bad["outcome"] == "failed" and {"logprob_agreement", "weight_sync"} <= failed, bad["checks"]
