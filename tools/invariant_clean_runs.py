"""Mechanics invariants on clean runs: each suite's cpu profile, its first N steps per (mode, seed), and the
suite's `training/*` invariant checks evaluated on it: how many passed, and any false alarm.

    python tools/invariant_clean_runs.py --suite miles_grpo_qwen3_30b_a3b_gfx942 --seeds 3 --steps 2
    python tools/invariant_clean_runs.py --suite verl_geo3k_qwen35_35b_a3b_moe_gfx950 --mode fully_async --seeds 3

The runs are `rlbench run SUITE --profile cpu --mode MODE --seeds K --set trainer.total_steps=N` (the profile's
first K seeds) in a folder under --work; the rows (one per run) are appended to --table (markdown) with the machine,
so that runs made on different days read as what they are. An invariant is an `each` check on every step, so a
prefix of the run settles it exactly as the whole run would; the learning and golden checks are not read.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_seeds(suite_id: str, mode: str, seeds: int, steps: int, work: Path, evaluate_only: bool) -> list[dict]:
    from rlbench.checks.evaluate import evaluate
    from rlbench.ingest.load import load_metrics
    from rlbench.run.runner import find_suite, resolved_config, seed_list, train_dir
    from rlbench.selftest.run import prefix_checks

    out = work / f"{suite_id}.{mode}"
    t0 = time.perf_counter()
    if not evaluate_only:
        cmd = [sys.executable, "-m", "rlbench", "run", suite_id, "--profile", "cpu", "--mode", mode, "--arch", "cpu",
               "--seeds", str(seeds), "--out", str(out), "--set", f"trainer.total_steps={steps}"]
        proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.log").write_text(proc.stdout + proc.stderr)
    wall = (time.perf_counter() - t0) / seeds
    suite = find_suite(suite_id)
    checked = prefix_checks(suite, steps)  # the references the first `steps` steps settle as the whole run would
    rows = []
    for seed in seed_list(suite, "cpu", seeds):  # the seeds `rlbench run --seeds K` trained, in their folders
        log = train_dir(out / suite_id / "cpu", mode, seed, seeds > 1) / "metrics.jsonl"
        if not log.is_file():
            rows.append({"suite": suite_id, "mode": mode, "seed": seed, "crashed": f"no {log}", "wall_s": wall})
            continue
        engine = str((resolved_config(suite, "cpu", mode, seed, log.parent, []).get("rollout") or {}).get("engine") or "hf")
        frame = load_metrics(log).frame
        results = evaluate(checked, "cpu", {mode: frame}, arch="cpu", device_name="cpu", steps=steps,
                           engines={mode: engine})
        inv = [r for r in results if r.metric.startswith("training/") and r.verdict != "skip" and r.run == mode]
        worst = {m: float(frame[m].max()) if m in frame else None
                 for m in ("training/optimizer_update_err", "training/loss_witness_err")}
        rows.append({"suite": suite_id, "mode": mode, "seed": seed, "crashed": None, "wall_s": wall,
                     "passed": sum(r.verdict == "pass" for r in inv),
                     "false_alarms": [f"{r.check_id} ({r.verdict})" for r in inv if r.verdict != "pass"],
                     "worst": worst})
    return rows


def row(r: dict) -> str:
    if r["crashed"]:
        return f"| {r['suite']} | {r['mode']} | {r['seed']} | - | CRASHED ({r['crashed']}) | - | - | {r['wall_s']:.0f} |"
    worst = ["-" if v is None else f"{v:.3g}" for v in r["worst"].values()]
    alarms = ", ".join(r["false_alarms"]) or "0"
    return (f"| {r['suite']} | {r['mode']} | {r['seed']} | {r['passed']} | {alarms} | {worst[0]} | {worst[1]} | "
            f"{r['wall_s']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--mode", default="colocated")
    ap.add_argument("--seeds", type=int, default=3, help="the profile's first K seeds")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--work", default="runs/invariant_clean")
    ap.add_argument("--table", default=None, help="markdown file to append the rows to")
    ap.add_argument("--evaluate-only", action="store_true", help="train nothing; evaluate the runs in --work")
    args = ap.parse_args(argv)
    from trainer.platform.env import collect_env

    env = collect_env()
    rows = run_seeds(args.suite, args.mode, args.seeds, args.steps, Path(args.work), args.evaluate_only)
    print("\n".join(map(row, rows)), flush=True)
    if args.table:
        stamp = (f"<!-- {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {env.get('hostname')}, "
                 f"{env.get('cpu_count')} CPUs, torch {env['versions'].get('torch')}, commit "
                 f"{(env.get('git') or {}).get('commit', '?')[:10]}, first {args.steps} steps -->")
        with open(args.table, "a") as f:
            f.write("\n".join([stamp, *map(row, rows)]) + "\n")
    return 1 if any(r["crashed"] or r["false_alarms"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
