"""Cost of a crash-consistent checkpoint (`trainer/components/checkpoint.py`) for a state of a given size.

    python tests/benchmarks/bench_checkpoint.py              # 1600 MB: SmolLM2-135M fp32 weights + AdamW moments
    python tests/benchmarks/bench_checkpoint.py --mb 200 --repeat 3

Prints seconds for the write to the temporary folder (torch.save), the commit (log copy, sha256
manifest, rename) and the resume-time verification (sha256 of every file, first time in a
process). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer.components.checkpoint import _VERIFIED, prepare_checkpoint, verify_checkpoint
from trainer.components.metrics import MetricsWriter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1600, help="state size in MB (float32 tensor)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    state = {"actor": torch.randn(args.mb * (1 << 20) // 4)}
    rows: dict[str, list[float]] = {"write": [], "commit": [], "verify": []}
    with tempfile.TemporaryDirectory(dir=".") as d:
        writer = MetricsWriter(Path(d) / "metrics.jsonl")
        for step in range(1, args.repeat + 1):
            t0 = time.perf_counter()
            pending = prepare_checkpoint(d, step, state, keep=1)
            t1 = time.perf_counter()
            writer.write(step, {"x": 1.0})
            final = pending.commit(writer.path)
            t2 = time.perf_counter()
            _VERIFIED.clear()
            assert verify_checkpoint(final) is None
            t3 = time.perf_counter()
            for k, v in zip(rows, (t1 - t0, t2 - t1, t3 - t2)):
                rows[k].append(v)
    print(f"state {args.mb} MB, {args.repeat} checkpoints, torch {torch.__version__}")
    for k, v in rows.items():
        print(f"  {k:7s} median {statistics.median(v):6.2f} s  ({', '.join(f'{x:.2f}' for x in v)})")


if __name__ == "__main__":
    main()
