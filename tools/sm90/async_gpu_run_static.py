"""GPU machine: the DAPO fully-async suite's `mini` profile in both modes on 2 GPUs, static engine.

    python3 tools/sm90/async_gpu_run_static.py --out $OUT              # both modes, ~8-9 min
    python3 tools/sm90/async_gpu_run_static.py --out $OUT --quick      # fewer steps, 256 tokens, ~3 min
    python3 tools/sm90/async_gpu_run_static.py --out /tmp/dry --device cpu   # CPU dry run, tiny model

Both modes use `rollout.engine: static` (static KV cache, CUDA-graph decode, bucketed batch
shapes), whose decode step costs nearly the same at 256 and 512 rows. That is what lets one
rollout GPU keep up with one training GPU (`async_mini_h200x2.md`: with the `hf` engine the
single rollout GPU produced half of what two colocated GPUs did, 0.85x).

- colocated: 2 Ray trainer workers (FSDP2 over NCCL), a static engine each; 64 prompts x 8 per
  step, 256 rows per GPU per generate call; then 4 PPO mini-batches of 16 prompts.
- fully_async: 1 rollout worker (GPU 0) + 1 trainer worker (GPU 1); a trainer step is one
  mini-batch of 16 prompts, a weight sync every 4 steps (64 prompts, the colocated batch),
  partial rollout on; the rollout worker samples `--groups-per-call` 64 prompts (512 rows) per
  call, twice the colocated per-GPU batch for about the same decode time.

Why staleness 1.0 by default: the rollouter may start `16 * (1 + s) * 4` groups per weight
version, counting the groups carried over a sync. To start the next 64-prompt call while the
trainer still consumes the previous 64 (the overlap fully-async exists for) it needs
`carried + 64 <= 64 (1 + s)`, i.e. s >= 1 when a whole call is carried; with s = 0.5 the
rollouter parks until the queue is drained and the two GPUs take turns. `--staleness 0.5` runs
that setting. With s = 1 a group still lags at most one version (one sync between its start and
its use), as the summary's `max_version_lag` shows.

Timing model (per 64 prompts): colocated = gen(256 rows) + train/2; fully-async = max(gen(512
rows), train). The summary reports the colocated partition and the ratio this model predicts
next to the measured one. Responses: `--max-response-length` 512 (SmolLM2 answers these
questions in ~40 tokens; some responses ramble to the cap, which gives the length spread and
the long tail a lock-step decode waits for). Runs of each mode can be split over two device
calls (`--modes colocated`, then `--modes fully_async` with the same --out: summaries merge).
Writes `<mode>_metrics.jsonl`, `<mode>_engine.json` and `summary.json` under --out.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_gpu_run import SUITE, summarize  # the summary of the hf-engine run, same fields


def overrides(args: argparse.Namespace, mode: str, steps: int) -> list[str]:
    """Trainer overrides on top of the suite's `mini` profile for `mode`."""
    over = ["rollout.engine=static", "rollout.engine_kwargs.free_on_sleep=false",
            f"rollout.engine_kwargs.max_slots={args.max_slots}", "trainer.progress=false", "trainer.save_freq=0",
            f"trainer.total_steps={steps}", f"trainer.out_dir={args.run_dir}/{mode}",
            f"trainer.test_freq={max(steps // args.val_times, 1) if args.val_times else 0}",
            f"data.max_response_length={args.max_response_length}",
            f"actor.ppo_micro_batch_size_per_gpu={args.micro_batch}"]
    if args.device == "cpu":  # dry run: tiny random model, small shapes, CPU workers
        over += ["trainer.device=cpu", "model.path=tiny:qwen2", "model.dtype=float32", "data.train_batch_size=8",
                 "data.num_val_samples=8", "actor.ppo_mini_batch_size=4", "rollout.n=4",
                 "algorithm.overlong_buffer.len=4"]
    else:
        over.append("trainer.device=cuda")
    if mode == "fully_async":
        over += [f"async.rollout_groups_per_call={args.groups_per_call}", f"async.staleness_threshold={args.staleness}",
                 f"async.trigger_parameter_sync_step={args.trigger}", "async.partial_rollout=true"]
    return over + list(args.extra)


def balance(colocated: dict, fully_async: dict | None) -> dict:
    """The colocated partition and the per-GPU ratio the timing model predicts for fully-async."""
    parts = colocated["mean_timing_partition_s"]
    gen = parts["timing_s/gen"]
    train_half = parts["timing_s/old_log_prob"] + parts["timing_s/update_actor"]  # each GPU trains half the batch
    out = {"colocated_gen_s": gen, "colocated_train_s_per_gpu": train_half,
           "model_ratio_if_gen_batch_insensitive": (gen + train_half) / max(gen, 2 * train_half)}
    if fully_async is not None:
        p = fully_async["mean_timing_partition_s"]
        out["fully_async_update_actor_s_per_step"] = p["timing_s/update_actor"]
        out["fully_async_trainer_wait_s_per_step"] = p["timing_s/gen"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="3 + 12 steps, 256-token responses, validation at the ends")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run on a tiny model")
    ap.add_argument("--modes", default="colocated,fully_async")
    ap.add_argument("--colocated-steps", type=int, default=None, help="default 8 (quick 3, cpu 2)")
    ap.add_argument("--async-steps", type=int, default=None, help="default 32 (quick 12, cpu 8): the same prompts")
    ap.add_argument("--max-response-length", type=int, default=None, help="default 512 (quick 256, cpu 16)")
    ap.add_argument("--groups-per-call", type=int, default=None, help="default 64 (cpu 8)")
    ap.add_argument("--staleness", type=float, default=1.0)
    ap.add_argument("--trigger", type=int, default=None, help="trainer steps per weight sync; default 4 (cpu 2)")
    ap.add_argument("--micro-batch", type=int, default=None, help="ppo_micro_batch_size_per_gpu; default 64 (cpu 8)")
    ap.add_argument("--max-slots", type=int, default=8, help="static engine: (batch, length) buffer sets kept")
    ap.add_argument("--val-times", type=int, default=None, help="validations after step 0; default 2 (quick 1)")
    ap.add_argument("--run-dir", default="/tmp/runs_static")
    ap.add_argument("--extra", nargs="*", default=[], help="more trainer overrides")
    args = ap.parse_args()
    cpu, quick = args.device == "cpu", args.quick
    pick = lambda v, full, q, c: v if v is not None else (c if cpu else q if quick else full)
    args.colocated_steps = pick(args.colocated_steps, 8, 3, 2)
    args.async_steps = pick(args.async_steps, 32, 12, 8)
    args.max_response_length = pick(args.max_response_length, 512, 256, 16)
    args.groups_per_call = pick(args.groups_per_call, 64, 64, 8)
    args.trigger = pick(args.trigger, 4, 4, 2)
    args.micro_batch = pick(args.micro_batch, 64, 64, 8)
    args.val_times = pick(args.val_times, 2, 1, 1)

    from rlbench.suites.suite import load_suite
    from trainer.config import load_config
    from trainer.distributed.colocated_ray import train_colocated_ray
    from trainer.components.metrics import read_metrics
    from trainer.modes.fully_async import train_fully_async

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary: dict = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update({"suite": SUITE, "profile": "mini", "engine": "static", "device": args.device})
    summary.setdefault("runs", {})
    suite = load_suite(SUITE)
    for mode in args.modes.split(","):
        steps = args.colocated_steps if mode == "colocated" else args.async_steps
        over = overrides(args, mode, steps)
        cfg = load_config(suite.resolve_trainer_config("mini", mode), over)
        prompts = (cfg.data.train_batch_size if mode == "colocated"
                   else cfg.async_.require_batches * cfg.actor.ppo_mini_batch_size)
        print(f"== {mode}: {steps} steps of {prompts} prompts x {cfg.rollout.n}, responses <= "
              f"{cfg.data.max_response_length} tokens, engine {cfg.rollout.engine}", flush=True)
        t0 = time.time()
        try:
            path = train_colocated_ray(cfg) if mode == "colocated" else train_fully_async(cfg)
            rows = read_metrics(path)
            shutil.copy(path, out / f"{mode}_metrics.jsonl")
            facts_path = path.parent / "engine.json"
            facts = json.loads(facts_path.read_text()) if facts_path.exists() else None
            if facts is not None:
                shutil.copy(facts_path, out / f"{mode}_engine.json")
            train = [r["data"] for r in rows if r["step"] > 0]
            summary["runs"][mode] = {"wall_s": time.time() - t0, "overrides": over, "engine": facts,
                                     "response_length_mean": statistics.mean(d["response_length/mean"] for d in train),
                                     "response_length_max": max(d["response_length/max"] for d in train),
                                     **summarize(rows, 2, prompts, cfg.rollout.n)}
        except Exception as e:  # noqa: BLE001 -- keep the other mode's numbers
            traceback.print_exc()
            summary["runs"][mode] = {"error": f"{type(e).__name__}: {e}", "wall_s": time.time() - t0,
                                     "overrides": over}
        summary_path.write_text(json.dumps(summary, indent=2, default=str))
    runs = summary["runs"]
    if "tok_per_s_per_gpu" in runs.get("colocated", {}):
        a = runs.get("fully_async") if "tok_per_s_per_gpu" in runs.get("fully_async", {}) else None
        summary["balance"] = balance(runs["colocated"], a)
        if a is not None:
            c = runs["colocated"]
            summary["ratio_tok_per_s_per_gpu"] = a["tok_per_s_per_gpu"] / c["tok_per_s_per_gpu"]
            summary["ratio_tok_per_s_per_gpu_excl_validation"] = (a["tok_per_s_per_gpu_excl_validation"]
                                                                  / c["tok_per_s_per_gpu_excl_validation"])
            summary["ratio_time_per_prompt"] = c["s_per_prompt_excl_validation"] / a["s_per_prompt_excl_validation"]
        summary_path.write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({m: {k: v for k, v in r.items() if k not in ("val_acc", "overrides")} for m, r in runs.items()},
                     indent=1, default=str))
    print("balance", json.dumps(summary.get("balance")), flush=True)
    print("ratios", {k: v for k, v in summary.items() if k.startswith("ratio")}, flush=True)


if __name__ == "__main__":
    main()
