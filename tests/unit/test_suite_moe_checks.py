"""The MoE suites' cpu-profile router checks: each one fails on a broken router the others miss.

- tied (zero-initialized) router: every expert ties, so top-2 sends every token to the same two
  experts (load 2.0 and 0.0 of the balanced share), while the softmax stays uniform and the switch
  load-balancing loss reads a balanced 1.0 -- only the expert-load variation sees it (cv 1.0; clean
  SmolLM2 runs 0.37-0.41).
- saturated router (logits x1000, one-hot routing): entropy 0.01 nats fails its band, while the
  expert load (cv 0.25) and the load-balancing loss (1.02) still look healthy.
- NaN router weights: the load-balancing loss is NaN (no_nan fails) and the entropy undefined.
The same tiny model with its random router passes all three; the clean side at scale is the
profiles' own runs (reports/golden/).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from rlbench.checks.metric import check_metric
from rlbench.run.runner import find_suite
from tests.helpers.batches import unequal_lengths_batch
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.moe import RouterRecorder, expert_load_metrics, upcycle_to_mixtral
from trainer.ops.logprobs import response_logprobs

SUITES = ["verl_geo3k_qwen35_35b_a3b_moe_gfx950", "miles_grpo_qwen3_30b_a3b_gfx942"]


def _router_metrics(break_router=None) -> dict[str, float]:
    dense, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama"), seed=0)
    moe = upcycle_to_mixtral(dense, 4, 2, seed=0)
    rec = RouterRecorder(moe)
    if break_router is not None:
        with torch.no_grad():
            for r in rec.routers:
                break_router(r.weight)
    batch, _ = unequal_lengths_batch(0)
    with rec.capture(), torch.no_grad():
        response_logprobs(moe, batch)
    _, stats, counts = rec.pop()
    return {**stats, **expert_load_metrics(counts, rec.top_k)}


def _verdicts(suite_id: str, got: dict[str, float]) -> dict[str, str]:
    frame = pd.DataFrame([got], index=pd.Index([1], name="step"))
    return {r.metric: check_metric(r, frame, tol=r.tol or 0.0).verdict for r in _moe_refs(suite_id)}


def _moe_refs(suite_id: str):
    suite = find_suite(f"suites/{suite_id}.yaml")
    refs = [r for r in suite.references if r.metric and r.metric.startswith("actor/moe/")
            and "cpu" in (r.profiles or [])]
    assert {r.metric for r in refs} == {"actor/moe/load_balancing_loss", "actor/moe/router_entropy",
                                        "actor/moe/expert_load/cv"}
    return refs


@pytest.mark.parametrize("suite_id", SUITES)
def test_collapsed_router_fails_the_expert_load_check(suite_id):
    got = _router_metrics(lambda w: w.zero_())
    assert got["actor/moe/expert_load/max"] == 2.0 and got["actor/moe/expert_load/min"] == 0.0
    assert abs(got["actor/moe/expert_load/cv"] - 1.0) < 1e-9
    assert abs(got["actor/moe/router_entropy"] - math.log(4)) < 1e-6  # uniform softmax: entropy is blind
    assert abs(got["actor/moe/load_balancing_loss"] - 1.0) < 1e-6  # and so is the switch loss
    assert _verdicts(suite_id, got) == {"actor/moe/load_balancing_loss": "pass", "actor/moe/router_entropy": "pass",
                                        "actor/moe/expert_load/cv": "fail"}


@pytest.mark.parametrize("suite_id", SUITES)
def test_clean_saturated_and_nan_routers(suite_id):
    clean = _router_metrics()
    assert set(_verdicts(suite_id, clean).values()) == {"pass"}
    saturated = _router_metrics(lambda w: w.mul_(1000.0))
    assert saturated["actor/moe/router_entropy"] < 0.1 and saturated["actor/moe/expert_load/cv"] < 0.7
    assert _verdicts(suite_id, saturated) == {"actor/moe/load_balancing_loss": "pass",
                                              "actor/moe/router_entropy": "fail", "actor/moe/expert_load/cv": "pass"}
    broken = _verdicts(suite_id, _router_metrics(lambda w: w.fill_(float("nan"))))
    assert broken["actor/moe/load_balancing_loss"] == "fail" and broken["actor/moe/router_entropy"] != "pass"
