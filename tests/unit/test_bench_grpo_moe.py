"""The GRPO bench step (`trainer/bench/grpo_step.py`) on a mixture of experts, on CPU.

- `shape:qwen3-30b-a3b-l4` / `-l8` are Qwen3-30B-A3B's config cut to 4 / 8 layers, the config the MoE
  backend bench builds (`trainer.bench.moe_backends.qwen3_30b_a3b`);
- the static engine decodes a tiny Qwen3-MoE and a tiny Mixtral as the hf engine does (fp32, greedy:
  the same tokens, log-probs within 1e-5);
- this trainer's step (`ours`) and, when TRL is installed, TRL's (`trl`) run on a tiny Qwen3-MoE
  registered as a shape for the test: every response has exactly `new_tokens` tokens, and at step 0 the
  bf16 engine's log-probs agree with the trainer's (an engine that skipped the MoE blocks gives
  probs_diff_max 0.15, Pearson 0.18 and ppo_kl 0.66 on this model; the right one 1.3-1.8e-3, 0.9998 and
  at most 4.3e-3).

Run: nice -n 10 env OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider tests/unit/test_bench_grpo_moe.py
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from trainer.bench import grpo_step
from trainer.bench.moe_backends import qwen3_30b_a3b
from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import SHAPES, eos_token_ids
from trainer.ops.flops import matmul_params
from trainer.rollout.base import SamplingParams
from trainer.rollout.hf import HFRolloutEngine
from trainer.rollout.static import StaticRolloutEngine

CPU = torch.device("cpu")
# 2 layers, 4 experts of 32 (top-2); a wide init so that the MoE blocks move the log-probs
TINY = (Qwen3MoeConfig, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                             num_experts_per_tok=2, norm_topk_prob=True, vocab_size=2304, max_position_embeddings=256,
                             tie_word_embeddings=False, router_aux_loss_coef=0.0, initializer_range=0.2))
STEP = dict(num_prompts=2, n=2, prompt_len=8, new_tokens=6, device=CPU, steps=2, warmup=1)


@pytest.fixture
def tiny_shape(monkeypatch) -> str:
    monkeypatch.setitem(SHAPES, "tiny-qwen3-moe", TINY)
    return "tiny-qwen3-moe"


@pytest.mark.parametrize(("layers", "params"), [(4, 3_114_814_464), (8, 5_607_297_024)])
def test_qwen3_30b_a3b_shapes(layers: int, params: int):
    cls, kw = SHAPES[f"qwen3-30b-a3b-l{layers}"]
    config = cls(**kw)
    assert config.to_dict() == qwen3_30b_a3b(layers).to_dict()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == params
    # active per token: attention, the top-8 of 128 experts and the router of each layer, and the LM head
    assert matmul_params(config) == layers * (18_874_368 + 8 * 3 * 2048 * 768 + 128 * 2048) + 151936 * 2048


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_static_engine_decodes_moe_as_hf(arch: str):
    model, tok = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}", dtype="float32",
                                                      override_config={"initializer_range": 0.2}), seed=3)
    eos = eos_token_ids(tok, model)
    prompts = [tok.encode(p) for p in ["12+30=", "hi", "a longer prompt, so the rows are left-padded: 9-4="]]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=12)
    ref = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos).generate(prompts, params)
    out = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, prompt_bucket=8
                              ).generate(prompts, params)
    assert len({t for r in out.response_ids for t in r}) > 4  # the model does not emit one token forever
    assert out.response_ids == ref.response_ids
    for a, b in zip(out.response_logprobs, ref.response_logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mixed_precision", ["bf16", "bf16_params"])
def test_ours_runs_a_moe_step(tiny_shape: str, mixed_precision: str):
    r = grpo_step.ours(tiny_shape, micro=4, chunk=64, mixed_precision=mixed_precision, **STEP)
    assert len(r["times_s"]) == STEP["steps"] and len(r["warmup_s"]) == STEP["warmup"]
    assert all(math.isfinite(t) and t > 0 for t in r["times_s"] + r["warmup_s"])
    for part in r["parts"]:
        assert part["completion_tokens"] == STEP["num_prompts"] * STEP["n"] * STEP["new_tokens"]
        assert all(math.isfinite(part[k]) and part[k] >= 0 for k in ("gen_s", "update_s", "sync_s"))
    assert r["completion_tok_s"] == pytest.approx(24 / r["median_step_s"])
    mm = r["step0_mismatch"]
    assert mm["training/rollout_probs_diff_max"] < 0.01
    assert mm["training/rollout_actor_probs_pearson_corr"] > 0.99
    assert abs(mm["actor/ppo_kl"]) < 0.02  # bf16 autocast on CPU: -4.3e-3; bf16_params: 3.8e-5; no MoE: 0.66
    assert r["params"] == 369_536 and r["active_matmul_params"] == 197_120  # 4 experts, 2 active
    assert r["graph_error"] is None and math.isnan(r["peak_mem_gib"])


def test_trl_runs_a_moe_step(tiny_shape: str):
    pytest.importorskip("trl")
    r = grpo_step.trl(tiny_shape, **{**STEP, "steps": 1})
    assert len(r["times_s"]) == 2 and all(math.isfinite(t) and t > 0 for t in r["times_s"])
    assert r["mean_completion_length"] == [STEP["new_tokens"]] * 2  # min_new_tokens: no response stops early
