"""`actor.mixed_precision: bf16_params` (bf16 module weights, fp32 masters / main grads / AdamW state)
against the fp32 path on a tiny Qwen2, on CPU (and on a GPU: `pytest -m gpu` on this file).

Tolerances (bf16 has 8 mantissa bits, relative rounding 2^-9 ~ 2e-3 per operation):
- gradients (fp32 main grads of the masters vs the fp32 model's grads): relative L2 error < 3e-2
  (measured 6e-3; the autocast `bf16` path measures 5e-3);
- one AdamW step: Adam's first step is ~lr * sign(g), so elements whose small gradient flips sign
  move by 2 lr; relative L2 error of the update < 0.15 (measured ~0.08; the autocast `bf16` path
  measures ~0.07 on the same batch) and cosine > 0.99.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.batches import N, R, tiny_qwen2
from tests.unit.test_fsdp_equivalence import _batch
from trainer.backends.actor import Actor
from trainer.config import ActorConfig

# the same checks on a GPU (fused AdamW, CUDA cast kernels): `pytest -m gpu tests/unit/test_actor_bf16_params.py`
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")])]


def _actor(mode: str, *, lr: float = 1e-3, micro: int = 8, device: str = "cpu") -> tuple[Actor, dict[str, torch.Tensor]]:
    model = tiny_qwen2().to(device)
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    cfg = ActorConfig(lr=lr, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=micro, grad_clip=1e9,
                      entropy_coeff=0.01, mixed_precision=mode)
    return Actor(model, cfg, temperature=1.0, max_response_length=R, device=torch.device(device)), w0


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float(((a[k].float() - b[k].float()) ** 2).sum()) for k in b)
    return (num / sum(float((b[k].float() ** 2).sum()) for k in b)) ** 0.5


def _grads(actor: Actor, micro: int) -> dict[str, torch.Tensor]:
    """Gradient of sum(logp * adv) over the batch, accumulated over micro-batches of `micro` rows."""
    batch = _batch()
    actor.model.train()
    for mb in batch.chunks(micro):
        mb = mb.to(actor.device)
        logp, _ = actor._logprobs(mb)
        (logp * mb.advantages).sum().backward()
    if actor.master is not None:
        return {n: m.grad for n, m in actor.master.named_masters()}
    return {n: p.grad for n, p in actor.model.named_parameters()}


@pytest.mark.parametrize("device", DEVICES)
def test_module_params_are_bf16_and_optimizer_owns_fp32_masters(device: str):
    actor, w0 = _actor("bf16_params", device=device)
    assert all(p.dtype == torch.bfloat16 for p in actor.model.parameters())
    opt_params = [p for g in actor.optimizer.param_groups for p in g["params"]]
    assert opt_params and all(p.dtype == torch.float32 for p in opt_params)
    assert not any(p is q for p in opt_params for q in actor.model.parameters())
    # masters start as the exact fp32 initial weights, not their bf16 rounding
    for name, m in actor.master.named_masters():
        assert torch.equal(m, w0[name]), name
    actor.update(_batch(), N)
    for st in actor.optimizer.state.values():
        assert st["exp_avg"].dtype == torch.float32 and st["exp_avg_sq"].dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_main_grads_match_fp32_grads_with_micro_batch_accumulation(device: str):
    ref, _ = _actor("none", device=device)
    want = _grads(ref, micro=8)
    for micro in (8, 2):  # one backward, and four accumulated into the fp32 main grads
        actor, _ = _actor("bf16_params", device=device)
        got = _grads(actor, micro)
        assert all(g.dtype == torch.float32 for g in got.values())
        assert all(p.grad is None for p in actor.model.parameters())  # bf16 grads handed over and freed
        assert _rel(got, want) < 3e-2, micro


@pytest.mark.parametrize("device", DEVICES)
def test_one_update_matches_fp32_within_bf16_tolerance(device: str):
    ref, w0 = _actor("none", device=device)
    m_ref = ref.update(_batch(), N)
    d_ref = {k: v.detach() - w0[k] for k, v in ref.model.named_parameters()}
    actor, _ = _actor("bf16_params", micro=2, device=device)
    m_got = actor.update(_batch(), N)
    d_got = {k: m.detach() - w0[k] for k, m in actor.master.named_masters()}
    assert _rel(d_got, d_ref) < 0.15
    dot = sum(float((d_got[k] * d_ref[k]).sum()) for k in d_ref)
    norm = (sum(float((d ** 2).sum()) for d in d_got.values()) * sum(float((d ** 2).sum()) for d in d_ref.values())) ** 0.5
    assert dot / norm > 0.99
    assert abs(m_got["actor/grad_norm"] - m_ref["actor/grad_norm"]) < 1e-2 * m_ref["actor/grad_norm"]
    # the module's bf16 weights are exactly the rounded masters after the step
    for name, m in actor.master.named_masters():
        assert torch.equal(dict(actor.model.named_parameters())[name], m.detach().to(torch.bfloat16)), name


@pytest.mark.parametrize("device", DEVICES)
def test_steps_below_bf16_resolution_accumulate_in_the_masters(device: str):
    # Adam's first step moves each weight by ~lr = 1e-6, far below bf16's spacing near |w| ~ 0.02 (~1.2e-4)
    actor, w0 = _actor("bf16_params", lr=1e-6, device=device)
    actor.update(_batch(), N)
    params = dict(actor.model.named_parameters())
    moved_master, moved_bf16, total = 0, 0, 0
    for name, m in actor.master.named_masters():
        moved_master += int((m.detach() != w0[name]).sum())
        moved_bf16 += int((params[name] != w0[name].to(torch.bfloat16)).sum())
        total += m.numel()
    assert moved_master > 0.5 * total  # the fp32 masters took the step
    assert moved_bf16 < 0.05 * total  # the bf16 copies mostly could not


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_holds_fp32_masters_and_resumes_identically(device: str):
    a, _ = _actor("bf16_params", device=device)
    a.update(_batch(), N)
    state = copy.deepcopy(a.state_dict())  # as saved to disk (state dicts hold live references)
    masters = dict(a.master.named_masters())
    for name, m in masters.items():
        assert state["model"][name].dtype == torch.float32 and torch.equal(state["model"][name], m), name
    b, _ = _actor("bf16_params", device=device)
    b.load_state_dict(state)
    for name, m in b.master.named_masters():
        assert torch.equal(m, masters[name]), name
    for (n1, p1), (_, p2) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p1, p2), n1
    a.update(_batch(), N)
    b.update(_batch(), N)
    for (name, m1), (_, m2) in zip(a.master.named_masters(), b.master.named_masters()):
        assert torch.equal(m1, m2), name


@pytest.mark.parametrize("device", DEVICES)
def test_weight_sync_sends_the_bf16_weights_in_place(device: str):
    from trainer.rollout.static import StaticRolloutEngine

    actor, _ = _actor("bf16_params", device=device)
    engine = StaticRolloutEngine(actor.model, pad_token_id=0, eos_token_ids=[], dtype=torch.bfloat16, device=device)
    actor.update(_batch(), N)
    assert all(bool(torch.isfinite(p).all()) for p in actor.model.parameters())
    ptrs = {n: p.data_ptr() for n, p in engine._params.items()}
    engine.update_weights(actor.named_weights())
    for name, p in actor.model.named_parameters():
        assert torch.equal(engine._params[name], p), name
        assert engine._params[name].data_ptr() == ptrs[name]  # copied in place
