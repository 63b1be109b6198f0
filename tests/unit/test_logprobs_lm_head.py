"""The chunked LM-head autograd function (`trainer.ops.logprobs.lm_head_logprobs`): values and closed-form
gradients against the plain autograd definition, a hand-computed two-token case, and the chunk
boundaries (chunk sizes that do and do not divide the token count)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.ops.logprobs import lm_head_logprobs


def _reference(h, head, t, temperature):
    la = torch.log_softmax(F.linear(h, head.weight, head.bias) / temperature, dim=-1)  # [M, V]
    return la.gather(-1, t[:, None]).squeeze(-1), -(la.exp() * la).sum(-1)


def test_two_token_vocabulary_by_hand():
    # identity head: logits = hidden = [0, ln 3] -> p = [1/4, 3/4]
    head = torch.nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(torch.eye(2))
    h = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64, requires_grad=True)
    lp, ent = lm_head_logprobs(h, head, torch.tensor([1]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    (g,) = torch.autograd.grad(lp.sum(), h)
    assert g.tolist()[0] == pytest.approx([-0.25, 0.25], abs=1e-6)  # onehot(t) - p
    # dH/dz_k = -p_k (logp_k + H); H = 0.5623...
    (g,) = torch.autograd.grad(lm_head_logprobs(h, head, torch.tensor([1]), with_entropy=True)[1].sum(), h)
    hh = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert g.tolist()[0] == pytest.approx([-0.25 * (math.log(0.25) + hh), -0.75 * (math.log(0.75) + hh)], abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("chunk", [8, 37, 100])
def test_matches_autograd_definition(temperature: float, entropy_grad: bool, chunk: int):
    g = torch.Generator().manual_seed(chunk)
    m, hdim, v = 37, 16, 50
    h = torch.randn(m, hdim, dtype=torch.float64, generator=g).requires_grad_(True)
    head = torch.nn.Linear(hdim, v, bias=True).double()
    t = torch.randint(0, v, (m,), generator=g)
    a, b = torch.randn(m, dtype=torch.float64, generator=g), torch.randn(m, dtype=torch.float64, generator=g)
    lp, ent = lm_head_logprobs(h, head, t, temperature=temperature, chunk_size=chunk, with_entropy=True)
    lp_ref, ent_ref = _reference(h, head, t, temperature)
    torch.testing.assert_close(lp.double(), lp_ref, rtol=0, atol=1e-5)  # fp32 softmax statistics
    torch.testing.assert_close(ent.double(), ent_ref, rtol=0, atol=1e-5)
    loss = (lp * a).sum() + ((ent * b).sum() if entropy_grad else 0.0)
    loss_ref = (lp_ref * a).sum() + ((ent_ref * b).sum() if entropy_grad else 0.0)
    got = torch.autograd.grad(loss, [h, head.weight, head.bias])
    want = torch.autograd.grad(loss_ref, [h, head.weight, head.bias])
    for x, y in zip(got, want):
        assert x.dtype == y.dtype
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_without_entropy_returns_zeros_and_logprobs_only():
    head = torch.nn.Linear(4, 9, bias=False)
    h = torch.randn(5, 4)
    t = torch.tensor([0, 3, 8, 1, 1])
    lp, ent = lm_head_logprobs(h, head, t, chunk_size=2)
    assert torch.equal(ent, torch.zeros(5))
    torch.testing.assert_close(lp, torch.log_softmax(head(h), -1)[torch.arange(5), t])


def test_bf16_weights_give_fp32_statistics_and_bf16_grads():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 64, bias=False)
    h = torch.randn(3, 10, 16)
    t = torch.randint(0, 64, (3, 10))
    lp_ref, _ = _reference(h.reshape(-1, 16).double(), head.double(), t.reshape(-1), 1.0)
    head = head.to(torch.bfloat16)
    hb = h.to(torch.bfloat16).requires_grad_(True)
    lp, ent = lm_head_logprobs(hb, head, t, chunk_size=7, with_entropy=True)
    assert lp.shape == (3, 10) and lp.dtype == torch.float32 and ent.dtype == torch.float32
    rel = (lp.double().reshape(-1) - lp_ref).norm() / lp_ref.norm()
    assert rel < 1e-2  # bf16 operands (METHOD: 1e-3 .. 1e-2)
    lp.sum().backward()
    assert hb.grad.dtype == torch.bfloat16 and head.weight.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_kept_logits_give_the_recomputed_gradients(dtype, backend):
    """`keep_logits` (`actor.lm_head_keep_logits`): the backward reads the forward's logits instead of recomputing
    them; same values, gradients bitwise equal, at a temperature (fp32 logits must not be scaled in place) and
    with a ragged last chunk (padded in the compiled mode). A kept chunk handed to the wrong position fails."""
    g = torch.Generator().manual_seed(3)
    m, hdim, v = 45, 16, 50
    head = torch.nn.Linear(hdim, v, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, hdim, generator=g))
    h = torch.randn(m, hdim, generator=g).to(dtype)
    t = torch.randint(0, v, (m,), generator=g)
    a, b = torch.randn(m, generator=g), torch.randn(m, generator=g)

    def run(keep: bool):
        hh = h.clone().requires_grad_(True)
        head.weight.grad = None
        lp, ent = lm_head_logprobs(hh, head, t, temperature=0.7, chunk_size=16, with_entropy=True,
                                   compile_backend=backend, keep_logits=keep)
        ((lp * a).sum() + (ent * b).sum()).backward()
        return lp.detach(), ent.detach(), hh.grad, head.weight.grad.clone()

    recomputed, kept = run(False), run(True)
    for x, y in zip(kept, recomputed):
        assert torch.equal(x, y)
    # the same comparison sees a kept chunk read at the wrong position
    import trainer.ops.logprobs as lpmod

    real = lpmod._LMHeadLogprobs.backward

    def swapped(ctx, *grads):
        if ctx.kept:
            ctx.kept[0], ctx.kept[1] = ctx.kept[1], ctx.kept[0]
        return real(ctx, *grads)

    lpmod._LMHeadLogprobs.backward = staticmethod(swapped)
    try:
        broken = run(True)
    finally:
        lpmod._LMHeadLogprobs.backward = staticmethod(real)
    assert not torch.equal(broken[2], recomputed[2]) and not torch.equal(broken[3], recomputed[3])
