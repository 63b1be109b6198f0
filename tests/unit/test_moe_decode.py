"""The fused MoE decode block (trainer/ops/moe_decode.py) against transformers' sparse MoE blocks.

The Triton kernels run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1): the module is
loaded as a private copy with the variable set, so nothing else in the process sees it. The same kernels
run compiled on the GPU in tools/sm90/moe_decode_bench.py.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from trainer.errors import ModelError

pytest.importorskip("triton")
tfm = pytest.importorskip("transformers")
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

_PATH = Path(__file__).resolve().parents[2] / "trainer" / "ops" / "moe_decode.py"


@pytest.fixture(scope="module")
def md():
    """trainer.ops.moe_decode with its kernels made by the interpreter (a copy of its own, not sys.modules')."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location("_moe_decode_interpreted", _PATH)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("_moe_decode_interpreted", None)
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _block(family: str, experts: int, top_k: int, norm: bool, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "qwen3_moe":  # I = 40: not a multiple of the interpreter's 16-wide blocks, so the masks count
        cfg = tfm.Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=40, num_experts=experts,
                                 num_experts_per_tok=top_k, norm_topk_prob=norm)
        blk = Qwen3MoeSparseMoeBlock(cfg)
    else:
        cfg = tfm.MixtralConfig(hidden_size=64, intermediate_size=40, num_local_experts=experts,
                                num_experts_per_tok=top_k)
        blk = MixtralSparseMoeBlock(cfg)
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.15)
    return blk.to(torch.bfloat16).eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# (family, experts, top-k, norm_topk_prob, rows): 40 rows on 4 experts give ~20 rows an expert, more than one
# 16-row tile, so the row loop inside an expert's program runs more than once.
CASES = [("qwen3_moe", 8, 2, True, 20), ("qwen3_moe", 4, 2, False, 40), ("mixtral", 8, 2, True, 24)]


@pytest.mark.parametrize("family,experts,top_k,norm,rows", CASES)
def test_fused_block_matches_transformers_block(md, family: str, experts: int, top_k: int, norm: bool,
                                                rows: int) -> None:
    blk = _block(family, experts, top_k, norm, seed=rows)
    assert md.unsupported_reason(blk) is None
    spec = md.spec_of(blk)
    assert spec.normalize == norm and spec.top_k == top_k
    x = torch.randn(2, rows // 2, 64).bfloat16()  # [B, T, H]
    with torch.no_grad():
        out = md.moe_decode(x, spec)
        ref_bf16 = blk(x)
        ref64 = copy.deepcopy(blk).double()(x.double())  # same bf16-valued weights and inputs, fp64 arithmetic
        # the fused router picks the experts fp64 picks (no near-tie at these seeds): errors below are the
        # experts' arithmetic, not a flipped choice
        idx, _ = md.route(x.reshape(-1, 64), spec)
        p64 = torch.softmax(x.reshape(-1, 64).double() @ blk.gate.weight.double().T, dim=-1)
        assert torch.equal(idx.sort(-1).values, p64.topk(top_k, dim=-1).indices.sort(-1).values)
    assert out.shape == x.shape and out.dtype == x.dtype and torch.isfinite(out).all()
    err, err_hf = _rel(out, ref64), _rel(ref_bf16, ref64)
    # bf16 operands with fp32 accumulation land between 1e-3 and 1e-2 relative (the result's bf16 rounding
    # alone is ~2e-3); the fused block rounds once where transformers' rounds five times, so it must not be
    # worse than transformers' own bf16 block by more than rounding noise
    assert err < 1e-2, err
    assert err <= 1.25 * err_hf + 1e-3, (err, err_hf)
    assert _rel(out, ref_bf16) < 1.5e-2


def test_unsupported_blocks_say_why(md) -> None:
    blk = _block("qwen3_moe", 4, 2, True, seed=0)
    assert "fp16" in md.unsupported_reason(copy.deepcopy(blk).float())
    assert "is not one of" in md.unsupported_reason(torch.nn.Linear(2, 2))


def _tiny_moe_lm() -> torch.nn.Module:
    cfg = tfm.Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    return tfm.Qwen3MoeForCausalLM(cfg).eval()


def test_static_engine_keeps_transformers_block_on_cpu_and_rejects_what_it_cannot_honour() -> None:
    from trainer.rollout.static import StaticRolloutEngine

    model = _tiny_moe_lm()
    eng = StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[])
    assert eng.moe_decode == "module" and all(lw.moe_fused is None for lw in eng.layers)
    with pytest.raises(ModelError, match="moe_decode=fused: the engine runs on cpu"):
        StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[], moe_decode="fused")
    with pytest.raises(ModelError, match="not one of fused, module"):
        StaticRolloutEngine(model, pad_token_id=0, eos_token_ids=[], moe_decode="triton")
