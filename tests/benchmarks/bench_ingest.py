"""Time and peak memory of reading logs: a long wrapped verl console log, and the size guard on one
huge line (a 29 MB one-line log, a 25 MB JSON line), each in a fresh subprocess.

    python tests/benchmarks/bench_ingest.py            # prints one line per case

The size guard reads an over-long line in 1 MiB chunks and keeps none of it, so its time is the
disk read and its memory stays near the interpreter's own.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.verl_logs import verl_console_log, wrap

_PROBE = """
import resource, sys, time
from rlbench.ingest.load import load_metrics
t0 = time.perf_counter()
try:
    log = load_metrics(sys.argv[1])
    what = f"{len(log.frame)} steps, {len(log.warnings)} warnings"
except Exception as e:
    what = f"{type(e).__name__}: {str(e)[:70]}"
dt = time.perf_counter() - t0
print(f"{dt:.3f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB: {what}")
"""


def _case(name: str, path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    print(f"{name:44s} {path.stat().st_size / 1e6:7.1f} MB  {out.stdout.strip() or out.stderr.strip()[-200:]}")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plain = tmp / "plain.log"
        plain.write_text("\n".join(verl_console_log(range(1, 5001))) + "\n")
        _case("verl console, 5000 steps, one line each", plain)
        wrapped = tmp / "wrapped.log"
        wrapped.write_text("\n".join(wrap(verl_console_log(range(1, 5001)), 80)) + "\n")
        _case("verl console, 5000 steps, wrapped at 80", wrapped)
        one = tmp / "one.log"
        one.write_text("step:1 - a/x:" + "7" * 29_000_000)
        _case("one 29 MB line (console)", one)
        big = tmp / "big.jsonl"
        big.write_text('{"step": 1, "data": {"a/x": 1}}\n{"step": 2, "data": {"a/x": "' + "x" * 25_000_000 + '"}}\n')
        _case("JSONL with a 25 MB line", big)


if __name__ == "__main__":
    main()
