"""The MoE suites' cpu-profile router checks fail on a collapsed router (a zero-initialized one).

A router upcycled with zero weights ties every expert, so top-2 sends every token to the same two
experts: per-expert load 2.0 and 0.0 of the balanced share, while the softmax stays uniform and
the switch load-balancing loss reads a balanced 1.0 -- only the expert-load variation (cv 1.0, clean runs 0.37-0.41) sees it.
The clean side (SmolLM2 upcycled with its random router passing every band) is the profiles' own
runs (reports/golden/).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from rlbench.checks import check_metric
from rlbench.runner import find_suite
from tests.helpers.batches import unequal_lengths_batch
from trainer.config import ModelConfig
from trainer.models import load_model_and_tokenizer
from trainer.models_moe import RouterRecorder, expert_load_metrics, upcycle_to_mixtral
from trainer.ops.logprobs import response_logprobs

SUITES = ["verl_geo3k_qwen35_35b_a3b_moe_gfx950", "miles_grpo_qwen3_30b_a3b_gfx942"]


def _router_metrics(zero_router: bool) -> dict[str, float]:
    dense, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama"), seed=0)
    moe = upcycle_to_mixtral(dense, 4, 2, seed=0)
    rec = RouterRecorder(moe)
    if zero_router:
        with torch.no_grad():
            for r in rec.routers:
                r.weight.zero_()
    batch, _ = unequal_lengths_batch(0)
    with rec.capture(), torch.no_grad():
        response_logprobs(moe, batch)
    _, stats, counts = rec.pop()
    return {**stats, **expert_load_metrics(counts, rec.top_k)}


def _moe_refs(suite_id: str):
    suite = find_suite(f"suites/{suite_id}.yaml")
    refs = [r for r in suite.references if r.metric and r.metric.startswith("actor/moe/")
            and "cpu" in (r.profiles or [])]
    assert {r.metric for r in refs} == {"actor/moe/load_balancing_loss", "actor/moe/router_entropy",
                                        "actor/moe/expert_load/cv"}
    return refs


@pytest.mark.parametrize("suite_id", SUITES)
def test_collapsed_router_fails_the_expert_load_check(suite_id):
    got = _router_metrics(zero_router=True)
    assert got["actor/moe/expert_load/max"] == 2.0 and got["actor/moe/expert_load/min"] == 0.0
    assert abs(got["actor/moe/expert_load/cv"] - 1.0) < 1e-9
    assert abs(got["actor/moe/router_entropy"] - math.log(4)) < 1e-6  # uniform softmax: entropy is blind
    assert abs(got["actor/moe/load_balancing_loss"] - 1.0) < 1e-6  # and so is the switch loss
    frame = pd.DataFrame([got], index=pd.Index([1], name="step"))
    verdicts = {r.metric: check_metric(r, frame, tol=r.tol or 0.0).verdict for r in _moe_refs(suite_id)}
    assert verdicts == {"actor/moe/load_balancing_loss": "pass", "actor/moe/router_entropy": "pass",
                        "actor/moe/expert_load/cv": "fail"}
