"""MoE as a model kind: upcycled Llama == dense at step 0, tiny MoE configs, router statistics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.batches import unequal_lengths_batch
from trainer.config import ModelConfig
from trainer.errors import ModelError
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.moe import RouterRecorder, expert_load_metrics, is_moe, upcycle_to_mixtral
from trainer.ops.logprobs import response_hidden_states, response_logprobs


def _logp(model, batch, share_prompts=True):
    with torch.no_grad():
        return response_logprobs(model, batch, share_prompts=share_prompts)[0]


def _logp_exact(model, batch):
    """Log-probs in the model's own dtype (`response_logprobs` keeps fp32 softmax statistics, which would
    cap a float64 comparison at fp32's resolution)."""
    with torch.no_grad():
        z = F.linear(response_hidden_states(model, batch), model.get_output_embeddings().weight)
        return torch.log_softmax(z, -1).gather(-1, batch.responses[..., None])[..., 0]


def test_upcycled_tiny_llama_matches_dense():
    dense, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama"), seed=0)
    moe = upcycle_to_mixtral(dense, 4, 2, seed=1)
    assert type(moe).__name__ == "MixtralForCausalLM" and is_moe(moe.config) and not is_moe(dense.config)
    batch, _ = unequal_lengths_batch(0)
    ref, got = _logp(dense, batch), _logp(moe, batch)
    mask = batch.response_mask.bool()
    assert (got - ref)[mask].abs().max() < 1e-5
    # float64: the upcycling is exact up to the router's fp32 renormalization (transformers computes the
    # top-k weights in fp32, |w1 + w2 - 1| <= 1.2e-7): top-1 (weight exactly 1) is bitwise the dense model,
    # top-2 measured 2.2e-8
    dense64 = dense.double()
    ref64 = _logp_exact(dense64, batch)
    top1 = _logp_exact(upcycle_to_mixtral(dense64, 4, 1, seed=1, experts_implementation="eager"), batch)
    top2 = _logp_exact(upcycle_to_mixtral(dense64, 4, 2, seed=1, experts_implementation="eager"), batch)
    assert (top1 - ref64)[mask].abs().max() < 1e-12
    assert (top2 - ref64)[mask].abs().max() < 1e-6
    # the check is not vacuous: one expert perturbed changes the log-probs
    with torch.no_grad():
        moe.model.layers[0].mlp.experts.down_proj[1].mul_(3.0)
    assert (_logp(moe, batch) - ref)[mask].abs().max() > 1e-3


def test_upcycle_via_model_config_and_errors():
    moe, _ = load_model_and_tokenizer(ModelConfig(path="tiny:llama", upcycle_num_experts=3, upcycle_top_k=1), seed=0)
    assert moe.config.num_local_experts == 3 and moe.config.num_experts_per_tok == 1
    with pytest.raises(ModelError, match="upcycling maps a Llama into a Mixtral; this model is a 'qwen2'"):
        load_model_and_tokenizer(ModelConfig(path="tiny:qwen2", upcycle_num_experts=4), seed=0)
    with pytest.raises(ModelError, match="model.experts_implementation=eager: tiny:qwen2 is not a mixture-of-experts"):
        load_model_and_tokenizer(ModelConfig(path="tiny:qwen2", experts_implementation="eager"), seed=0)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_tiny_moe_experts_implementations_agree(arch):
    batch, _ = unequal_lengths_batch(1)
    outs = {}
    for impl in ("eager", "grouped_mm"):
        m, _ = load_model_and_tokenizer(ModelConfig(path=f"tiny:{arch}", experts_implementation=impl), seed=0)
        assert m.config._experts_implementation == impl
        outs[impl] = _logp(m, batch)
    assert is_moe(m.config)
    assert (outs["eager"] - outs["grouped_mm"]).abs().max() < 1e-5


def test_router_recorder_shared_and_full_forward_agree():
    """The recorder's statistics and loss are the same whether the prompt is shared or not (masks follow)."""
    m, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3_moe"), seed=0)
    with torch.no_grad():
        for r in m.modules():
            if type(r).__name__.endswith("TopKRouter"):
                r.weight.normal_(0, 0.5)
    rec = RouterRecorder(m)
    batch, _ = unequal_lengths_batch(2)
    p = batch.prompt_len
    batch.input_ids[1::2, :p] = batch.input_ids[::2, :p]  # the n=2 responses of a prompt share it
    res = []
    for share in (True, False):
        with rec.capture():
            _logp(m, batch, share_prompts=share)
        res.append(rec.pop())
    (l1, s1, c1), (l2, s2, c2) = res
    # shared prompts: each prompt's tokens are routed once per group instead of once per response
    assert c1.sum() < c2.sum()
    assert c2.sum() == batch.attention_mask.sum() * rec.top_k * rec.num_layers
    assert c1.sum() == (batch.attention_mask[::2, :p].sum() + batch.attention_mask[:, p:].sum()) * rec.top_k * 2
    for s in (s1, s2):
        assert 0 < s["actor/moe/router_entropy"] < torch.log(torch.tensor(4.0))
        assert s["actor/moe/load_balancing_loss"] > 0.5
    assert torch.isfinite(l1) and not l1.requires_grad  # no_grad forward: no graph
    assert abs(float(l2) / 2 - s2["actor/moe/load_balancing_loss"]) < 1e-6  # the loss sums the 2 layers


def test_router_loss_gradient_and_balance_metrics():
    m, _ = load_model_and_tokenizer(ModelConfig(path="tiny:mixtral"), seed=0)
    rec = RouterRecorder(m)
    batch, _ = unequal_lengths_batch(3)
    with rec.capture():
        response_logprobs(m, batch)
    loss, _, counts = rec.pop()
    loss.backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in rec.routers)
    bal = expert_load_metrics(torch.full((2, 4), 10.0), top_k=2)
    assert bal == {"actor/moe/expert_load/max": 1.0, "actor/moe/expert_load/min": 1.0, "actor/moe/expert_load/cv": 0.0}
    skew = expert_load_metrics(torch.tensor([[20.0, 0.0, 0.0, 0.0]]), top_k=1)
    assert skew["actor/moe/expert_load/max"] == 4.0 and skew["actor/moe/expert_load/min"] == 0.0
    assert counts.sum() > 0


@pytest.mark.slow
def test_upcycled_smollm2_matches_smollm2():
    """SmolLM2-135M upcycled into a 4-expert Mixtral computes SmolLM2's step-0 log-probs: exactly in float64,
    up to fp32's own rounding in fp32.

    Measured (2-core CPU, torch 2.13 + MKL 2024.2, transformers 5.19, 29 response tokens), max |dlogp|:
    - float64, eager experts (grouped_mm has no float64 kernel): top-1 0 (bitwise); top-2 1.85e-6, because
      transformers' Mixtral router computes the softmax and renormalizes the top-k weights in fp32 whatever
      the model dtype, so w1 + w2 = 1 only to 1.2e-7. Bounds: 1e-10 and 1e-5.
    - fp32 (the profiles' dtype), top-2 grouped_mm (the profiles' experts): 1.34e-5 through the trainer's
      log-prob head (this test), 1.24e-5 through a plain log_softmax; eager 1.34e-5; top-1 1.24e-5. SmolLM2 itself in fp32 is 2.39e-5 from its float64 log-probs, so the MoE is closer to dense
      fp32 than dense fp32 is to exact. Where it enters: the fused gate_up matmul is bitwise the separate
      gate and up matmuls, and a weight of 1.0 and index_add into zeros are exact; but an expert gets a
      subset of the tokens, and MKL's fp32 GEMM at these shapes (H 576, I 1536) gives 1-3, 5-7 or 9-11
      rows sums that differ from the same rows inside a larger batch by up to ~6e-7 of the output's scale
      (other row counts are bitwise equal; grouped_mm likewise on small groups). Bound: 3e-5.
    """
    dense, _ = load_model_and_tokenizer(ModelConfig(path="embedded:smollm2-135m-instruct"), seed=0)
    batch, _ = unequal_lengths_batch(4)
    mask = batch.response_mask.bool()
    ref = _logp(dense, batch)
    moe = upcycle_to_mixtral(dense, 4, 2, seed=0, experts_implementation="grouped_mm")
    diff32 = float((_logp(moe, batch) - ref)[mask].abs().max())
    del moe
    dense64 = dense.double()
    ref64 = _logp_exact(dense64, batch)
    diff64 = {}
    for k in (1, 2):
        moe64 = upcycle_to_mixtral(dense64, 4, k, seed=0, experts_implementation="eager")
        diff64[k] = float((_logp_exact(moe64, batch) - ref64)[mask].abs().max())
        del moe64
    print(f"smollm2 upcycled E=4 over {int(mask.sum())} tokens, max |dlogp|: fp32 top-2 grouped_mm {diff32:.2e}, "
          f"float64 top-1 {diff64[1]:.2e}, top-2 {diff64[2]:.2e}")
    assert diff64[1] < 1e-10
    assert diff64[2] < 1e-5
    assert diff32 < 3e-5


def test_flops_count_active_expert_parameters():
    from transformers import MixtralConfig, Qwen3MoeConfig

    from trainer.ops.flops import matmul_params

    q = Qwen3MoeConfig(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                       head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                       num_experts_per_tok=8, vocab_size=151936, decoder_sparse_step=1, mlp_only_layers=[])
    attn = 2048 * 4096 * 2 + 2048 * 512 * 2
    assert matmul_params(q) == 48 * (attn + 8 * 3 * 2048 * 768 + 2048 * 128) + 151936 * 2048  # ~3.0B: "A3B"
    half = q.__class__(**{**q.to_dict(), "mlp_only_layers": list(range(0, 48, 2))})
    assert matmul_params(half) == 48 * attn + 24 * (8 * 3 * 2048 * 768 + 2048 * 128) + 24 * 3 * 2048 * 6144 + 151936 * 2048
    m = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, vocab_size=100)
    assert matmul_params(m) == 2 * (64 * 64 * 2 + 64 * 32 * 2 + 2 * 3 * 64 * 128 + 64 * 4) + 100 * 64
