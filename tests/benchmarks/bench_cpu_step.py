"""Step time of the README's main job on CPU: SmolLM2-135M-Instruct, GRPO, 8 prompts x 8 samples x 24 new tokens.

    python tests/benchmarks/bench_cpu_step.py                 # 6 steps, prints the table, writes reports/cpu/
    python tests/benchmarks/bench_cpu_step.py --steps 10 --set actor.lr=2e-5

Prints the median of each `timing_s/*` phase over the steps after the first (the first pays
allocator warm-up), and writes the numbers with machine, versions and commit to
`reports/cpu/step_time_<date>.json`. A benchmark, not a test: it asserts nothing; the target
(<= 25 s per step on 2 cores) is compared in the printed table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from trainer.api import train
from trainer.components.metrics import read_metrics
from trainer.config import load_config
from trainer.platform.env import collect_env

TARGET_S = 25.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides")
    ap.add_argument("--out", default=str(ROOT / "reports" / "cpu"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(ROOT / "trainer/configs/grpo_smollm2_arithmetic.yaml",
                          [f"trainer.total_steps={args.steps}", "trainer.test_freq=0", "trainer.save_freq=0",
                           f"trainer.out_dir={tmp}", "trainer.resume=false", *args.set])
        lines = read_metrics(train(cfg))
    steps = [ln["data"] for ln in lines if ln["step"] >= 1]
    timed = steps[1:] if len(steps) > 1 else steps
    phases = sorted({k for d in timed for k in d if k.startswith("timing_s/")})
    medians = {k: statistics.median(d.get(k, 0.0) for d in timed) for k in phases}
    print(f"{'phase':32s} {'median s':>10s}")
    for k, v in sorted(medians.items(), key=lambda kv: -kv[1]):
        print(f"{k:32s} {v:10.2f}")
    step = medians["timing_s/step"]
    print(f"step time median {step:.2f} s over {len(timed)} steps (target <= {TARGET_S} s: "
          f"{'met' if step <= TARGET_S else 'NOT met'}); throughput "
          f"{statistics.median(d['perf/throughput'] for d in timed):.0f} tok/s")
    env = collect_env()
    record = {"benchmark": "cpu_grpo_step", "config": cfg.to_dict(), "steps_timed": len(timed),
              "median_s": medians, "per_step": [{k: d[k] for k in phases} for d in timed],
              "target_s": TARGET_S, "env": env}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step_time_{datetime.now(timezone.utc):%Y%m%d_%H%M}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
