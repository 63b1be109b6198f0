"""The Megatron actor step's fixed-cost changes (`trainer/backends/megatron/gpu.py`) keep the numbers bitwise.

- `FirstWriteDDP` (the step's first gradient written into the fp32 main grad, no zeroing pass) gives the main
  grads of megatron's own DDP (zeroed buffer, add) bit for bit: bf16 parameters, two micro-batches (write, then
  add), a second step on other rows (so a stale value would show), and a step with no backward (every main
  grad zero, as megatron's zeroed buffer).
- `_scale_in_place` (the clip as one in-place `_foreach_mul_`) equals megatron's fallback `dst.copy_(src * s)`
  bit for bit, and falls back to it when source and destination differ.
On CPU (gloo, the backend's `cpu_shim`); the GPU run of the same code is the `--check` of
`trainer/bench/moe_backends.py` (reports/sm90).
"""

from __future__ import annotations

import pytest
import torch

from trainer.backends.strategy import megatron_missing

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")


def _actor(ddp_cls):
    from megatron.core.distributed import DistributedDataParallelConfig

    from trainer.backends.megatron.backend import MegatronActor
    from trainer.bench.moe_backends import _actor_cfg, _tiny_moe

    a = MegatronActor.from_hf(_tiny_moe(), _actor_cfg("adam"), temperature=1.0, max_response_length=6,
                              device=torch.device("cpu"), dtype=torch.bfloat16)
    ddp = ddp_cls(config=a.bridge.config, module=a.model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False))
    a.model = ddp
    return a, ddp


def _grads(a, ddp, batches) -> dict[str, torch.Tensor]:
    ddp.zero_grad_buffer()
    for i, micro in enumerate(batches):
        logp, entropy, _ = a._forward(micro)
        w = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp) * (i + 1)
        ((logp * w).sum() + 0.1 * entropy.sum()).backward()
    ddp.finish_grad_sync()
    return {k: p.main_grad.detach().clone() for k, p in a.gpt.named_parameters()}


def test_first_write_main_grads_bitwise_megatrons():
    from megatron.core.distributed import DistributedDataParallel

    from trainer.backends.megatron.gpu import first_write_ddp_class
    from trainer.bench.moe_backends import _batch

    b = _batch()
    micros = list(b.chunks(2))
    plain, plain_ddp = _actor(DistributedDataParallel)
    fast, fast_ddp = _actor(first_write_ddp_class())
    assert fast_ddp.first_write and not isinstance(plain_ddp, first_write_ddp_class())
    for step in ([micros[0], micros[1]], [micros[2]], [micros[1], micros[0]], []):
        want, got = _grads(plain, plain_ddp, step), _grads(fast, fast_ddp, step)
        assert want.keys() == got.keys()
        for k in want:
            assert torch.equal(want[k], got[k]), (k, len(step))
        if step:
            assert any(float(g.abs().max()) > 0 for g in got.values())
        else:  # no backward: every main grad zero, as megatron's zeroed buffer
            assert all(float(g.abs().max()) == 0 for g in got.values())


def test_scale_in_place_bitwise_megatrons_fallback():
    from megatron.core.utils import local_multi_tensor_scale

    from trainer.backends.megatron.gpu import _scale_in_place

    g = torch.Generator().manual_seed(0)
    shapes = [(7,), (33, 65), (1,), (4, 5, 129)]
    a = [torch.randn(s, generator=g) * 10.0 ** torch.randint(-6, 6, (), generator=g).item() for s in shapes]
    b = [t.clone() for t in a]
    scale = 0.1234567  # a clip coefficient (max_norm / (norm + 1e-6)) below 1
    local_multi_tensor_scale(2048 * 32, None, [a, a], scale)
    _scale_in_place(2048 * 32, None, [b, b], scale)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    src, dst = [t.clone() for t in b], [torch.empty_like(t) for t in b]
    _scale_in_place(2048 * 32, None, [src, dst], 2.0)  # different tensors: megatron's copy path
    assert all(torch.equal(d, s * 2.0) for s, d in zip(src, dst))
