"""GPU machine, call 3 of 3: the `mini` profile of the DAPO fully-async suite in both modes on 2 GPUs.

    python3 tools/sm90/async_gpu_run.py --out $OUT --colocated-steps 15 --async-steps 60

- colocated: 2 Ray trainer workers (FSDP2 over NCCL), each with an hf engine on its own GPU;
  64 prompts x 8 per step (the profile's train_batch_size).
- fully_async: 1 rollout worker (GPU 0) + 1 trainer worker (GPU 1); one step = require_batches (1) x
  ppo_mini_batch_size (16) prompts; staleness 0.5, sync every 4 steps, partial rollout on.
Both runs see the same number of prompts (15 x 64 = 60 x 16 = 960). The engine is `hf` (the suite
names vLLM, which cannot run on that machine: see /work/shared/device/README.md). Writes each
mode's metrics.jsonl and a summary.json (tok/s/GPU, step time, accuracy) under --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SUITE = "suites/verl_dapo_qwen25_math_7b_fully_async_gfx942.yaml"
VAL_KEY = "val-core/synthetic/arithmetic/acc/mean@1"


def summarize(rows: list[dict], num_gpus: int, prompts_per_step: int, n: int = 8) -> dict:
    train = [r["data"] for r in rows if r["step"] > 0]
    steady = train[1:] if len(train) > 1 else train  # step 1 holds CUDA/NCCL warm-up
    step_s = [d["timing_s/step"] for d in steady]
    busy_s = [d["timing_s/step"] - d.get("timing_s/testing", 0.0) for d in steady]
    tokens = [d["perf/total_num_tokens"] for d in steady]
    resp_tokens = [d["response_length/mean"] * prompts_per_step * n for d in steady]
    vals = [(r["step"], r["data"][VAL_KEY]) for r in rows if VAL_KEY in r["data"]]
    parts = {}
    for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                "timing_s/testing"):
        xs = [d.get(key, 0.0) for d in steady]
        parts[key] = sum(xs) / len(xs)
    out = {
        "steps": len(train), "prompts_per_step": prompts_per_step, "num_gpus": num_gpus,
        "median_step_s": statistics.median(step_s), "mean_step_s": statistics.mean(step_s),
        "tok_per_s_per_gpu": sum(tokens) / (sum(step_s) * num_gpus),
        "tok_per_s_per_gpu_excl_validation": sum(tokens) / (sum(busy_s) * num_gpus),
        "response_tok_per_s_per_gpu_excl_validation": sum(resp_tokens) / (sum(busy_s) * num_gpus),
        "median_perf_throughput": statistics.median(d["perf/throughput"] for d in steady),
        "s_per_prompt_excl_validation": sum(busy_s) / (prompts_per_step * len(steady)),
        "val_acc": vals, "val_acc_first": vals[0][1] if vals else None, "val_acc_last": vals[-1][1] if vals else None,
        "val_acc_peak": max(v for _, v in vals) if vals else None,
        "train_acc_last5": statistics.mean(d.get("critic/acc/mean", float("nan")) for d in train[-5:]),
        "score_first": train[0].get("critic/score/mean"), "score_last5": statistics.mean(
            d["critic/score/mean"] for d in train[-5:]),
        "mean_timing_partition_s": parts,
    }
    if "fully_async/count/current_param_version" in train[-1]:
        out["fully_async"] = {k: train[-1][k] for k in train[-1] if k.startswith("fully_async/count")}
        out["fully_async"]["max_version_lag"] = max(d["fully_async/staleness/max_version_lag"] for d in train)
        out["fully_async"]["partial_trajectories"] = sum(d["fully_async/partial/total_partial_num"] for d in train)
        out["fully_async"]["mean_trainer_idle_ratio"] = statistics.mean(d["fully_async/trainer/idle_ratio"] for d in steady)
        idle = [d["fully_async/rollouter/idle_ratio"] for d in train if "fully_async/rollouter/idle_ratio" in d]
        out["fully_async"]["mean_rollouter_idle_ratio"] = statistics.mean(idle) if idle else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--colocated-steps", type=int, default=15)
    ap.add_argument("--async-steps", type=int, default=60)
    ap.add_argument("--groups-per-call", type=int, default=32)
    ap.add_argument("--modes", default="colocated,fully_async")
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides (a CPU dry run: model.path=tiny:qwen2 ...)")
    args = ap.parse_args()

    from rlbench.suites.suite import load_suite
    from trainer.config import load_config
    from trainer.distributed.colocated_ray import train_colocated_ray
    from trainer.components.metrics import read_metrics
    from trainer.modes.fully_async import train_fully_async

    out = Path(args.out)
    suite = load_suite(SUITE)
    summary: dict = {"suite": SUITE, "profile": "mini", "engine": "hf", "runs": {}}
    for mode in args.modes.split(","):
        steps = args.colocated_steps if mode == "colocated" else args.async_steps
        over = ["rollout.engine=hf", "trainer.device=cuda", "trainer.progress=false", "trainer.save_freq=0",
                f"trainer.total_steps={steps}", f"trainer.out_dir=/tmp/runs/{mode}",
                f"trainer.test_freq={max(steps // 3, 1)}"]
        if mode == "fully_async":
            over.append(f"async.rollout_groups_per_call={args.groups_per_call}")
        over += args.extra
        cfg = load_config(suite.resolve_trainer_config("mini", mode), over)
        prompts = (cfg.data.train_batch_size if mode == "colocated"
                   else cfg.async_.require_batches * cfg.actor.ppo_mini_batch_size)
        print(f"== {mode}: {steps} steps of {prompts} prompts x {cfg.rollout.n}", flush=True)
        t0 = time.time()
        try:
            path = train_colocated_ray(cfg) if mode == "colocated" else train_fully_async(cfg)
            rows = read_metrics(path)
            shutil.copy(path, out / f"{mode}_metrics.jsonl")
            summary["runs"][mode] = {"wall_s": time.time() - t0, "overrides": over,
                                     **summarize(rows, 2, prompts)}
        except Exception as e:  # keep the other mode's numbers
            traceback.print_exc()
            summary["runs"][mode] = {"error": f"{type(e).__name__}: {e}", "wall_s": time.time() - t0}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    runs = summary["runs"]
    if all("tok_per_s_per_gpu" in runs.get(m, {}) for m in ("colocated", "fully_async")):
        c, a = runs["colocated"], runs["fully_async"]
        summary["ratio_tok_per_s_per_gpu"] = a["tok_per_s_per_gpu"] / c["tok_per_s_per_gpu"]
        summary["ratio_tok_per_s_per_gpu_excl_validation"] = (a["tok_per_s_per_gpu_excl_validation"]
                                                              / c["tok_per_s_per_gpu_excl_validation"])
        summary["ratio_time_per_prompt"] = c["s_per_prompt_excl_validation"] / a["s_per_prompt_excl_validation"]
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({m: {k: v for k, v in r.items() if k not in ("val_acc", "overrides")} for m, r in runs.items()},
                     indent=1, default=str))
    print("ratios", {k: v for k, v in summary.items() if k.startswith("ratio")})


if __name__ == "__main__":
    main()
