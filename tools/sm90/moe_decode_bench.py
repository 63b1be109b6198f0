"""One MoE layer's decode step: the fused Triton block (trainer/ops/moe_decode.py) against transformers' block.

    python tools/sm90/moe_decode_bench.py --out DIR      # on a CUDA machine; ~1 min; writes DIR/moe_decode_bench.json

Shape: the GRPO bench's decode step on Qwen3-30B-A3B's width (64 rows, hidden 2048, 128 experts of 768, top-8,
norm_topk_prob, bf16, random weights). Each variant is captured as a CUDA graph of `--reps` calls and timed by
its replays (device events, median of `--iters`), as the static engine replays it. Correctness: on fresh random
inputs, each variant against an fp64 evaluation of the same block (same bf16 weights and inputs): relative L2
error of the output. The floor: the bytes of the experts the rows chose (each read once) plus the router, over
the device-to-device copy rate measured in the same process. Then a sweep of the two kernels' block sizes
(RLBENCH_MOE_DECODE_BLOCKS), each kernel's variants with the other at its default; the last line prints the
best combination as `best_blocks=...` for the caller to export.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from pathlib import Path

import torch

from trainer.ops import moe_decode as md

GATE_UP = [(64, 128, 4, 4), (32, 128, 4, 4), (64, 64, 4, 4), (32, 256, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3),
           (16, 256, 4, 4), (32, 64, 2, 5)]
DOWN = [(64, 128, 4, 4), (32, 128, 4, 4), (128, 64, 4, 4), (64, 64, 4, 4), (32, 256, 4, 3), (128, 128, 8, 3),
        (16, 256, 4, 4), (64, 256, 8, 3)]


def copy_gbs() -> float:
    """Device-to-device copy rate, GB/s counting bytes read plus written (1 GiB buffers)."""
    a = torch.empty(2 ** 29, dtype=torch.int16, device="cuda").random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() * 2 / statistics.median(ts) / 1e9


def graph_ms(fn, x: torch.Tensor, reps: int, iters: int) -> float:
    """Median ms of one call of fn(x), from replays of a CUDA graph of `reps` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn(x)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / reps)
    del g
    return statistics.median(ts)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                         norm_topk_prob=True)
    cfg._experts_implementation = "grouped_mm"  # what the GRPO bench's model runs
    blk = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.02)
    blk = blk.to("cuda", torch.bfloat16).eval()
    impl = blk.experts.config._experts_implementation
    print("experts implementation:", impl, flush=True)
    spec = md.spec_of(blk)
    assert md.unsupported_reason(blk) is None
    e, _, h = spec.gate_up.shape
    x = torch.randn(args.rows, 1, h, device="cuda").bfloat16()  # [B, T=1, H] as the decode step calls it

    # correctness on fresh inputs, each against fp64 of the same block
    b64 = copy.deepcopy(blk).double()  # its own copy of the config:
    b64.experts.config._experts_implementation = "eager"  # grouped_mm takes no fp64
    checks = []
    for seed in range(3):
        torch.manual_seed(100 + seed)
        xc = torch.randn(args.rows, 1, h, device="cuda").bfloat16()
        with torch.no_grad():
            ref = b64(xc.double())
            fused, hf = md.moe_decode(xc, spec), blk(xc)
        checks.append({"seed": 100 + seed, "fused_vs_fp64": rel(fused, ref), "hf_vs_fp64": rel(hf, ref),
                       "fused_vs_hf": rel(fused, hf), "finite": bool(torch.isfinite(fused).all())})
        print("check", checks[-1], flush=True)
    del b64

    with torch.no_grad():
        idx, _ = md.route(x.reshape(-1, h), spec)
    touched = int(torch.unique(idx).numel())
    bytes_step = touched * (spec.gate_up[0].numel() + spec.down[0].numel()) * 2 + spec.router.numel() * 2
    gbs = copy_gbs()
    floor_ms = bytes_step / gbs / 1e6
    print(f"copy {gbs:.0f} GB/s; experts touched {touched}/{e}; bytes {bytes_step / 1e9:.3f} GB; "
          f"floor {floor_ms:.3f} ms", flush=True)

    res: dict = {"rows": args.rows, "experts_touched": touched, "bytes": bytes_step, "copy_gbs": gbs,
                 "floor_ms": floor_ms, "checks": checks, "device": torch.cuda.get_device_name(),
                 "experts_implementation": impl}
    with torch.no_grad():
        res["hf_graph_ms"] = graph_ms(blk, x, args.reps, args.iters)
        res["fused_graph_ms"] = graph_ms(lambda t: md.moe_decode(t, spec), x, args.reps, args.iters)
        print(f"transformers block {res['hf_graph_ms']:.3f} ms ({floor_ms / res['hf_graph_ms']:.0%} of floor), "
              f"fused {res['fused_graph_ms']:.3f} ms ({floor_ms / res['fused_graph_ms']:.0%})", flush=True)
        default = md._BLOCKS_CUDA
        sweep = []
        for which, cands in (("gate_up", GATE_UP), ("down", DOWN)):
            best = None
            for c in cands:
                blocks = (*c, *default[4:]) if which == "gate_up" else (*default[:4], *c)
                os.environ["RLBENCH_MOE_DECODE_BLOCKS"] = ",".join(map(str, blocks))
                try:
                    ms = graph_ms(lambda t: md.moe_decode(t, spec), x, args.reps, args.iters)
                    err = rel(md.moe_decode(x, spec), blk(x))
                except Exception as ex:  # noqa: BLE001 -- a config that does not compile (shared memory): skip it
                    print(which, c, "failed:", type(ex).__name__, str(ex).splitlines()[0][:120], flush=True)
                    continue
                sweep.append({"kernel": which, "blocks": c, "ms": ms, "fused_vs_hf": err})
                print(f"{which} {c}: {ms:.3f} ms ({floor_ms / ms:.0%} of floor), vs hf {err:.2e}", flush=True)
                if best is None or ms < best[1]:
                    best = (c, ms)
            res[f"best_{which}"] = best[0]
        best_blocks = (*res["best_gate_up"], *res["best_down"])
        os.environ["RLBENCH_MOE_DECODE_BLOCKS"] = ",".join(map(str, best_blocks))
        res["best_ms"] = graph_ms(lambda t: md.moe_decode(t, spec), x, args.reps, args.iters)
        res["best_fused_vs_hf"] = rel(md.moe_decode(x, spec), blk(x))
        os.environ.pop("RLBENCH_MOE_DECODE_BLOCKS")
        res["sweep"] = sweep
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "moe_decode_bench.json").write_text(json.dumps(res, indent=1))
    print(f"best {best_blocks}: {res['best_ms']:.3f} ms ({floor_ms / res['best_ms']:.0%} of floor), "
          f"transformers block {res['hf_graph_ms']:.3f} ms, default fused {res['fused_graph_ms']:.3f} ms")
    print("best_blocks=" + ",".join(map(str, best_blocks)), flush=True)


if __name__ == "__main__":
    main()
