"""`python -m trainer.bench [sections...] --out DIR`: run benchmark sections, print tables, write JSON.

Sections: ceilings, rollout, train, sync, grpo (this trainer vs TRL's GRPOTrainer, same run).
Each section writes `DIR/<section>.json` as soon as it finishes; a section that fails records its
error and the others still run. Every file carries the machine, versions and commit.
The defaults compare the eager and the compiled variants side by side: the static engine with and
without `compile_decode`, training with and without `actor.compile` (`bf16_params`, LM-head chunk
4096), and the GRPO step in the `bf16` and the fully compiled configuration against TRL
(reports/sm90/README.md, run 5). On a GPU machine: `bash tests/gpu/run_all.sh`.
The GRPO step on a mixture of experts, each side in a process of its own:
`python -m trainer.bench grpo --grpo-shape qwen3-30b-a3b-l4 --grpo-modes bf16_params --no-trl` and
`... --no-rlbench` (tools/sm90/moe_grpo_call.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigError
from trainer.platform.env import collect_env, peak_bf16_tflops

SECTIONS = ("ceilings", "rollout", "train", "sync", "grpo")


def provenance() -> dict[str, Any]:
    info: dict[str, Any] = {"date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "argv": sys.argv, "torch": torch.__version__}
    try:
        info["env"] = collect_env(repo_root=Path(__file__).resolve().parents[2])
    except Exception as e:  # provenance must never stop a benchmark
        info["env_error"] = repr(e)
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    cells = [keys] + [[fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(keys))) for c in cells)


def parse_mode(mode: str, flag: str, allowed: set[str]) -> tuple[str, list[str]]:
    """`bf16_params+compile` -> ("bf16_params", ["compile"]); a one-line ConfigError naming the flag otherwise."""
    prec, *extras = mode.split("+")
    if prec not in ("bf16", "bf16_params", "none") or not set(extras) <= allowed:
        raise ConfigError(f"trainer.bench {flag}: unknown mode {mode!r} (fix: bf16, bf16_params or none, optionally "
                          f"followed by {' and/or '.join('+' + a for a in sorted(allowed))})")
    return prec, extras


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__)
    ap.add_argument("sections", nargs="*", default=list(SECTIONS), help=f"any of {', '.join(SECTIONS)}")
    ap.add_argument("--out", default="outputs/bench", help="folder for the JSON files")
    ap.add_argument("--rollout-shape", default="qwen2.5-0.5b")
    ap.add_argument("--batches", default="16,64,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hf-generate", action="store_true", help="also time transformers' generate (slow)")
    ap.add_argument("--train-shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--train-seqs", type=int, default=16)
    ap.add_argument("--train-len", type=int, default=1024)
    ap.add_argument("--train-micro", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--train-chunks", default="4096", help="actor.logprob_chunk_size values to compare")
    ap.add_argument("--train-modes", default="bf16_params,bf16_params+compile", help=(
        "actor.mixed_precision values to compare (bf16, bf16_params, none); '+compile' after one also "
        "sets actor.compile (compiled decoder layers and LM-head chunks), e.g. bf16,bf16_params,bf16_params+compile"))
    ap.add_argument("--profile", action="store_true", help="kernel-time table of one training step")
    ap.add_argument("--grpo-steps", type=int, default=4)
    ap.add_argument("--grpo-modes", default="bf16,bf16_params+compile+compile_decode", help=(
        "this trainer's variants in the grpo section, comma-separated: bf16, bf16_params or none, optionally "
        "followed by +compile (actor.compile), +compile_decode (static engine option) and/or +hf_moe (the engine's "
        "moe_decode=module: transformers' MoE block in the decode step instead of the fused Triton one)"))
    ap.add_argument("--grpo-chunk", type=int, default=4096, help="actor.logprob_chunk_size in the grpo section")
    ap.add_argument("--grpo-shape", default=None, help="model of the grpo section (default: --rollout-shape), "
                    "e.g. qwen3-30b-a3b-l4 (Qwen3-30B-A3B's width, 4 layers)")
    ap.add_argument("--no-trl", action="store_true", help="grpo section without TRL's side")
    ap.add_argument("--no-rlbench", action="store_true", help="grpo section without this trainer's side")
    ap.add_argument("--decode-modes", default="eager,compiled", help=(
        "rollout section: the static engine without (eager) and/or with (compiled) its compile_decode option"))
    ap.add_argument("--peak-tflops", type=float, default=None, help="vendor bf16 peak override")
    args = ap.parse_args(argv)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        raise ConfigError(f"trainer.bench: unknown section(s) {bad} (fix: choose from {', '.join(SECTIONS)})")
    train_modes = [parse_mode(m, "--train-modes", {"compile"}) for m in args.train_modes.split(",")]
    grpo_modes = [parse_mode(m, "--grpo-modes", {"compile", "compile_decode", "hf_moe"})
                  for m in args.grpo_modes.split(",")]
    decode_modes = tuple(args.decode_modes.split(","))
    if not set(decode_modes) <= {"eager", "compiled"}:
        raise ConfigError(f"trainer.bench --decode-modes: {args.decode_modes!r} (fix: eager, compiled or eager,compiled)")
    if not torch.cuda.is_available():
        raise ConfigError("trainer.bench needs a CUDA or ROCm device (fix: run it on a GPU machine)")
    from trainer.bench import grpo_step, perf

    dev = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    try:
        vendor = peak_bf16_tflops(torch.cuda.get_device_name(), args.peak_tflops)
    except ConfigError:
        vendor = float("nan")
    ceil = {"copy_gbps": float("nan"), "bf16_matmul_tflops": float("nan")}
    summary: list[str] = []

    def run(name: str, fn) -> Any:
        t0 = time.perf_counter()
        try:
            res = fn()
            err = None
        except Exception as e:
            res, err = None, "".join(traceback.format_exception(e))[-4000:]
            print(f"[{name}] FAILED\n{err}", flush=True)
        (out / f"{name}.json").write_text(json.dumps({"provenance": prov, "section": name, "result": res,
                                                      "error": err, "wall_s": time.perf_counter() - t0}, indent=1))
        return res

    if "ceilings" in args.sections:
        ceil = run("ceilings", lambda: perf.ceilings(dev)) or ceil
        summary.append(f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, bf16 matmul {ceil['bf16_matmul_tflops']:.0f} "
                       f"TFLOP/s (vendor {vendor})")
    if "rollout" in args.sections:
        engines = ("static", "hf_generate") if args.hf_generate else ("static",)
        rows = run("rollout", lambda: perf.bench_rollout(
            args.rollout_shape, [int(b) for b in args.batches.split(",")], prompt_len=args.prompt_len,
            new_tokens=args.new_tokens, copy_gbps=ceil["copy_gbps"], device=dev, engines=engines,
            decode_modes=decode_modes))
        if rows:
            summary.append(table(rows, ["engine", "decode", "batch", "tok_s", "roofline_tok_s",
                                        "frac_roofline", "graph_capture_s", "first_call_s"]))
    if "train" in args.sections:
        rows = []
        variants = [(shape, int(c), m) for shape in args.train_shapes.split(",")
                    for m in train_modes for c in args.train_chunks.split(",")]
        for shape, chunk, (prec, extras) in variants:
            tag = "_".join([prec, *extras])
            r = run(f"train_{shape}_{tag}_c{chunk}", lambda: perf.bench_training(
                shape, num_seqs=args.train_seqs, seq_len=args.train_len, prompt_len=32, micro=args.train_micro,
                device=dev, matmul_tflops=ceil["bf16_matmul_tflops"], vendor_tflops=vendor, steps=args.steps,
                chunk=chunk, profile=args.profile, mixed_precision=prec, compile_layers="compile" in extras))
            if r:
                rows.append(r)
                for k in r.get("profile_top_kernels", [])[:12]:
                    print(f"  {k['device_ms']:9.1f} ms  x{k['count']:<5} {k['name']}", flush=True)
        if rows:
            summary.append(table(rows, ["shape", "mixed_precision", "compile_layers", "logprob_chunk_size", "tok_s",
                                        "mfu_vs_measured_6n", "mfu_vs_measured", "mfu_vs_vendor",
                                        "actor_metric_mfu", "peak_mem_gib", "compile_s", "weights_finite"]))
            summary.append(table(rows, ["mixed_precision", "compile_layers", "min_s", "median_s", "max_s",
                                        "first_step_s", "dynamo_graphs_after_warmup", "dynamo_graphs_end",
                                        "dynamo_graph_breaks", "profile_kernel_total_ms", "last_grad_norm"]))
    if "sync" in args.sections:
        for prec in ("bf16", "bf16_params"):
            r = run(f"sync_{prec}", lambda: perf.bench_weight_sync(args.rollout_shape, dev, mixed_precision=prec))
            if r:
                summary.append(f"weight sync {r['shape']} ({prec}): {r['median_ms']:.2f} ms "
                               f"(weights match: {r['weights_match']})")
    if "grpo" in args.sections:
        shape = args.grpo_shape or args.rollout_shape
        kw = dict(num_prompts=8, n=8, prompt_len=args.prompt_len, new_tokens=args.new_tokens, device=dev,
                  steps=args.grpo_steps)
        ours = []
        for prec, extras in [] if args.no_rlbench else grpo_modes:
            tag = grpo_step.mode_tag(prec, "compile" in extras, "compile_decode" in extras, "hf_moe" in extras)
            r = run(f"grpo_rlbench_{tag.replace('+', '_')}", lambda: grpo_step.ours(
                shape, mixed_precision=prec, chunk=args.grpo_chunk, compile_actor="compile" in extras,
                compile_decode="compile_decode" in extras, moe_decode="module" if "hf_moe" in extras else None,
                **kw))
            if r:
                ours.append(r)
        b = None if args.no_trl else run("grpo_trl", lambda: grpo_step.trl(shape, **kw))
        rows = ours + [b] if b else ours
        if rows:
            summary.append(table(rows, ["side", "mode", "median_step_s", "completion_tok_s", "gen_s", "update_s",
                                        "sync_s", "mfu_actor", "peak_mem_gib"]))
        for a in ours:
            if b:
                summary.append(f"completion tok/s ratio rlbench ({a['mode']}) / trl: "
                               f"{a['completion_tok_s'] / b['completion_tok_s']:.2f}")
            summary.append(f"step-0 mismatch ({a['mode']}): {json.dumps(a['step0_mismatch'])}")
    print("\n\n".join(summary), flush=True)
    (out / "summary.txt").write_text("\n\n".join(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
