"""GPU checks of the Megatron actor's fixed-cost changes (`trainer/backends/megatron/gpu.py`), on CUDA:

1. `_scale_in_place` (the clip as one `_foreach_mul_`) against megatron's fallback `dst.copy_(src * s)`: bitwise,
   on fp32 tensors of the MoE's shapes and odd sizes.
2. `FirstWriteDDP` against megatron's DDP on the tiny Qwen3-MoE (bf16 params, fp32 main grads, two micro-batches,
   then a step on other rows, then one with no backward): max |main grad difference| per step, beside the
   difference of megatron's DDP against itself (CUDA backward is not bitwise repeatable: atomics in the
   dispatcher's index_add_ backward), so that only a difference above that floor would be the change's.

    PYTHONPATH=/tmp/site:$PWD python3 tools/sm90/fixed_cost_gpu_check.py --out res.json
"""

from __future__ import annotations

import argparse
import json
import os

import torch

DEV = os.environ.get("CHECK_DEVICE", "cuda")  # cpu: a smoke test of the script on a machine without CUDA


def scale_check() -> dict:
    from megatron.core.utils import local_multi_tensor_scale

    from trainer.backends.megatron.gpu import _scale_in_place

    g = torch.Generator(device=DEV).manual_seed(0)
    shapes = ([(128, 1536, 2048), (151936, 2048)] if DEV == "cuda" else []) + [(2048,), (7,), (33, 65), (4097,)]
    out = {}
    for scale in (0.2887, 0.999999, 1e-3):
        a = [torch.randn(s, generator=g, device=DEV) * 1e-3 for s in shapes]
        b = [t.clone() for t in a]
        local_multi_tensor_scale(2048 * 32, None, [a, a], scale)
        _scale_in_place(2048 * 32, None, [b, b], scale)
        out[str(scale)] = all(torch.equal(x, y) for x, y in zip(a, b))
        del a, b
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return {"bitwise_equal_per_scale": out, "pass": all(out.values())}


def _actor(ddp_cls):
    from megatron.core.distributed import DistributedDataParallelConfig

    from trainer.backends.megatron.backend import MegatronActor
    from trainer.bench.moe_backends import _actor_cfg, _tiny_moe

    cfg = _actor_cfg("adam")  # megatron.optimizer=torch: the DDP under test is built here
    a = MegatronActor.from_hf(_tiny_moe(), cfg, temperature=1.0, max_response_length=6,
                              device=torch.device(DEV), dtype=torch.bfloat16)
    ddp = ddp_cls(config=a.bridge.config, module=a.model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False))
    a.model = ddp
    return a, ddp


def _grads(a, ddp, micros) -> dict[str, torch.Tensor]:
    ddp.zero_grad_buffer()
    for i, micro in enumerate(micros):
        micro = micro.to(a.device)
        logp, entropy, _ = a._forward(micro)
        w = torch.linspace(-1.0, 2.0, logp.numel(), device=logp.device).view_as(logp) * (i + 1)
        ((logp * w).sum() + 0.1 * entropy.sum()).backward()
    ddp.finish_grad_sync()
    return {k: p.main_grad.detach().float().cpu().clone() for k, p in a.gpt.named_parameters()}


def ddp_check() -> dict:
    from megatron.core.distributed import DistributedDataParallel

    from trainer.backends.megatron.gpu import first_write_ddp_class
    from trainer.bench.moe_backends import _batch

    micros = list(_batch().chunks(2))
    runs = {"megatron": _actor(DistributedDataParallel), "megatron_again": _actor(DistributedDataParallel),
            "first_write": _actor(first_write_ddp_class())}
    steps = {"two_micro": [micros[0], micros[1]], "other_rows": [micros[2]], "again": [micros[1], micros[0]],
             "no_backward": []}
    out = {"first_write_on": runs["first_write"][1].first_write}
    for name, ms in steps.items():
        g = {k: _grads(*runs[k], ms) for k in runs}
        ref = g["megatron"]

        def diff(other, ref=ref):
            return max(float((other[k] - ref[k]).abs().max()) for k in ref)

        out[name] = {"max_abs_megatron_vs_itself": diff(g["megatron_again"]),
                     "max_abs_first_write_vs_megatron": diff(g["first_write"]),
                     "bitwise_equal": all(torch.equal(g["first_write"][k], ref[k]) for k in ref),
                     "max_abs_grad": max(float(v.abs().max()) for v in ref.values())}
    out["pass"] = all(v["max_abs_first_write_vs_megatron"] <= v["max_abs_megatron_vs_itself"]
                      for k, v in out.items() if isinstance(v, dict))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    res = {}
    for name, fn in (("scale_in_place", scale_check), ("first_write_ddp", ddp_check)):
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported
            import traceback

            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(res[name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
