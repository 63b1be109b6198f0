"""Overhead of one tool call through the sandbox: median wall-clock of a trivial program.

    python3 tests/benchmarks/bench_sandbox.py            # 100 calls with the layers in force
    python3 tests/benchmarks/bench_sandbox.py --calls 50 --compare

Prints the layers in force, the median / p90 wall-clock of ``print(1)`` as the caller sees it
(pipes, request, fork of the pre-forked pair, confinement, run, tree kill, clean-up, result),
the supervisor's own share, the confinement layers' cost inside the worker, and the machine's
load average (on a busy machine the wake-ups between the four processes dominate). `--compare`
adds the start-up of a fresh ``python3 -I -c pass`` (what a call cost before the zygote).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from trainer.agent.sandbox import Sandbox


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1000:.2f} ms, p90 {xs[int(0.9 * (len(xs) - 1))] * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compare", action="store_true", help="also time a fresh interpreter start")
    args = ap.parse_args(argv)
    if args.calls < 1:
        print("bench_sandbox: --calls must be >= 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    box = Sandbox()
    start_s = time.monotonic() - t0
    try:
        print(f"layers in force: {box.layers['details']}")
        if box.layers["not_in_force"]:
            print(f"not in force: {box.layers['not_in_force']}")
        print(f"start-up (zygote + self-test): {start_s:.2f} s")
        for _ in range(args.warmup):
            box.run("print(1)")
        wall, sup, layers = [], [], []
        for _ in range(args.calls):
            r = box.run("print(1)")
            if not r.ok or r.stdout != "1\n":
                print(f"bench_sandbox: a call failed: {r}", file=sys.stderr)
                return 1
            wall.append(r.seconds)
            sup.append(r.info["seconds"])
            layers.append(sum(r.info.get("worker_ms", {}).values()) / 1000)
        print(f"per call over {args.calls} calls (caller's wall-clock): {_ms(wall)}")
        print(f"  supervisor (request to result):                 {_ms(sup)}")
        print(f"  confinement layers inside the worker:           {_ms(layers)}")
        if args.compare:
            fresh = []
            for _ in range(min(args.calls, 20)):
                t = time.monotonic()
                subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
                fresh.append(time.monotonic() - t)
            print(f"fresh `python3 -I -c pass` for comparison:      {_ms(fresh)}")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    finally:
        box.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
