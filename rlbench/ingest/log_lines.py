"""A log file's lines read in bounded memory, and the warnings about its sequence of steps.

    from rlbench.ingest.log_lines import read_lines, step_order_warnings
    lines, oversize = read_lines(path)          # oversize: [(line number, bytes)] of skipped lines
    warnings = step_order_warnings(seen)        # seen: [(step, line[, family])] in file order

`read_lines` refuses a binary file (NUL bytes in its first 8 kB) and reads each line with at most
`MAX_LINE_BYTES + 1` bytes at a time: a longer line is skipped in 1 MiB chunks, kept as "" and
reported, so a 29 MB one-line file costs a disk read and no memory (tests/benchmarks/bench_ingest.py
measures it). `rlbench.ingest.load` refuses such a line in JSON logs and warns about it in console logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.errors import DataError

# A physical line longer than this is not a metrics line (a verl step line is a few kB).
MAX_LINE_BYTES = 1 << 20
_BINARY_PROBE = 8192


def read_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> tuple[list[str], list[tuple[int, int]]]:
    """The file's lines (UTF-8, undecodable bytes replaced) and (line number, bytes) of each line over
    `max_line_bytes`, which comes back as "" and is skipped unread (memory stays bounded)."""
    lines: list[str] = []
    oversize: list[tuple[int, int]] = []
    try:
        with path.open("rb") as f:
            head = f.read(_BINARY_PROBE)
            if head.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise DataError(f"{path}: is UTF-16 text; convert it to UTF-8 first "
                                f"(iconv -f UTF-16 -t UTF-8 {path.name} > {path.stem}.utf8{path.suffix})")
            if b"\0" in head:
                raise DataError(f"{path}: is a binary file (NUL bytes in its first {len(head)} bytes), not a "
                                "metrics log; pass the verl/Miles/rlbench log (text)")
            f.seek(0)
            while True:
                chunk = f.readline(max_line_bytes + 1)
                if not chunk:
                    break
                if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
                    size = len(chunk)
                    while chunk and not chunk.endswith(b"\n"):  # skip the rest of the line, 1 MiB at a time
                        chunk = f.readline(max_line_bytes)
                        size += len(chunk)
                    oversize.append((len(lines) + 1, size))
                    lines.append("")
                    continue
                text = chunk.decode("utf-8", errors="replace").rstrip("\r\n")
                lines.append(text.removeprefix("\ufeff") if not lines else text)  # a UTF-8 byte-order mark
    except OSError as exc:
        raise DataError(f"{path}: cannot read the metrics log ({exc.strerror}); check the path and its "
                        "permissions") from None
    return lines, oversize


def mb(n: int) -> str:
    """A size for a message: "25.0 MB", or bytes when small."""
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n} bytes"


def step_order_warnings(seen: list[tuple[int, int]] | list[tuple[int, int, str]]) -> list[str]:
    """Warnings for a step sequence (step, line[, family]) that goes back or repeats after other steps.

    Consecutive lines of one step are normal (verl's file logger may split a step); a step that
    comes again after another one (a resumed or concatenated run), or a step lower than the one
    before it, is named with its lines. Each family of step keys is its own sequence (Miles counts
    rollouts, optimizer steps and evaluations separately and interleaves their lines).
    """
    out: list[str] = []
    back: list[str] = []
    again: dict[int, list[int]] = {}
    first_line: dict[tuple[str, int], int] = {}
    prev: dict[str, int] = {}
    for item in seen:
        step, line = item[0], item[1]
        family = item[2] if len(item) > 2 else ""  # type: ignore[misc]
        before = prev.get(family)
        if step == before:
            continue
        if before is not None and step < before:
            back.append(f"step {step} at line {line} after step {before}")
        if (family, step) in first_line:
            again.setdefault(step, [first_line[(family, step)]]).append(line)
        else:
            first_line[(family, step)] = line
        prev[family] = step
    if back:
        more = f" and {len(back) - 4} more" if len(back) > 4 else ""
        out.append(f"steps go back: {'; '.join(back[:4])}{more} (a resumed or concatenated run?); "
                   "the table is sorted by step")
    if again:
        items = [f"{s} (lines {', '.join(map(str, ls[:4]))})" for s, ls in list(again.items())[:4]]
        out.append(f"steps logged again after other steps: {'; '.join(items)}"
                   f"{' and more' if len(again) > 4 else ''}; their metrics are merged, the later line wins")
    return out


def drop_negative_steps(rows: dict[int, dict[str, Any]], seen: list[Any], warnings: list[str]) -> None:
    """Remove steps below 0 from `rows` (no run has them), with one warning naming their lines."""
    neg = sorted({s for s in rows if s < 0})
    if neg:
        lines = [str(item[1]) for item in seen if item[0] < 0][:5]
        warnings.append(f"negative steps {', '.join(map(str, neg[:5]))} (line {', '.join(lines)}) are not steps "
                        "of a run; ignored")
        for s in neg:
            del rows[s]
