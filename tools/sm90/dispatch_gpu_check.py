"""GPU check of the local MoE token dispatcher (`trainer/backends/megatron/dispatch.py`) on one MoE layer of
Qwen3-30B-A3B's width (hidden 2048, 128 experts of 768, top-8), megatron-core's layer as the backend builds it:

1. host syncs: one forward + backward under `torch.cuda.set_sync_debug_mode("error")` with each dispatcher (the
   alltoall one is expected to raise: its token counts go to the host), and the CUDA runtime's synchronize calls
   of that step counted by the profiler;
2. error against fp32: the layer in bf16 with each dispatcher against the same weights in fp32 (alltoall),
   norm-wise relative error of the output and of the gradients (input, router, fc1, fc2), and bf16 local
   against bf16 alltoall;
3. time of the layer's forward + backward (CUDA events, median of 20 after 3 warm-ups) at 8 x 1024 and 8 x 4096
   tokens with each dispatcher.

    PYTHONPATH=/tmp/site:$PWD python3 tools/sm90/dispatch_gpu_check.py --out res.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def _layer(dispatcher: str, dtype: torch.dtype, state: dict | None = None):
    from trainer.backends.megatron.backend import build_bridge, build_gpt_model, init_parallel
    from trainer.bench.moe_backends import qwen3_30b_a3b

    init_parallel(1, 1, seed=0)
    bridge = build_bridge(qwen3_30b_a3b(1), dtype=dtype, use_cpu_initialization=False, token_dispatcher=dispatcher)
    gpt = build_gpt_model(bridge)
    moe = gpt.decoder.layers[0].mlp.cuda().to(dtype)
    del gpt
    if state is not None:
        moe.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return moe


def _step(moe, x: torch.Tensor, w: torch.Tensor) -> dict:
    x = x.detach().clone().requires_grad_()
    params = (moe.router.weight, moe.experts.fc1, moe.experts.fc2)
    for p in params:
        p.grad = None
    out = moe(x)[0]
    (out.float() * w).sum().backward()
    return {"out": out.detach().float(), "grads": [x.grad.float()] + [p.grad.float() for p in params]}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def errors(x: torch.Tensor, w: torch.Tensor) -> dict:
    ref_layer = _layer("alltoall", torch.float32)
    state = {k: v.detach().clone() for k, v in ref_layer.state_dict().items()}
    ref = _step(ref_layer, x.float(), w)
    del ref_layer
    got = {d: _step(_layer(d, torch.bfloat16, state), x, w) for d in ("alltoall", "local")}
    names = ("out", "grad_x", "grad_router", "grad_fc1", "grad_fc2")

    def table(a, b):
        return dict(zip(names, [_rel(a["out"], b["out"])] + [_rel(p, q) for p, q in zip(a["grads"], b["grads"])]))

    return {"bf16_alltoall_vs_fp32": table(got["alltoall"], ref), "bf16_local_vs_fp32": table(got["local"], ref),
            "bf16_local_vs_bf16_alltoall": table(got["local"], got["alltoall"])}


def syncs(x: torch.Tensor, w: torch.Tensor) -> dict:
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for d in ("alltoall", "local"):
        moe = _layer(d, torch.bfloat16)
        _step(moe, x, w)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            _step(moe, x, w)
            raised = None
        except RuntimeError as e:
            raised = str(e).splitlines()[0][:160]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _step(moe, x, w)
            torch.cuda.synchronize()
        calls = {e.key: e.count for e in prof.key_averages() if "Synchronize" in e.key or e.key == "cudaMemcpyAsync"}
        out[d] = {"sync_debug_error": raised, "runtime_calls": calls}
        del moe
        torch.cuda.empty_cache()
    return out


def timing(tokens: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(tokens // 8, 8, 2048, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(x.shape, generator=g, device="cuda")
    out = {}
    for d in ("alltoall", "local", "alltoall", "local"):  # each twice, interleaved
        moe = _layer(d, torch.bfloat16)
        for _ in range(3):
            _step(moe, x, w)
        ms = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _step(moe, x, w)
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        out.setdefault(d, []).append(statistics.median(ms))
        del moe
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1024, 8, 2048, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(x.shape, generator=g, device="cuda")
    res = {"syncs": syncs(x, w)}
    print("syncs:", json.dumps(res["syncs"]), flush=True)
    res["errors"] = errors(x, w)
    print("errors:", json.dumps(res["errors"]), flush=True)
    res["layer_fwd_bwd_ms"] = {str(t): timing(t) for t in (8192, 32768)}
    print("layer fwd+bwd ms (median of 20, two runs each):", json.dumps(res["layer_fwd_bwd_ms"]), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
