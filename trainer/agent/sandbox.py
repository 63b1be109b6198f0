"""The Python tool: run model-written code in a separate, resource-limited interpreter.

`run_python(code, timeout_s=..., memory_mb=...)` starts ``python3 -I -`` (isolated mode: no user
site-packages, no PYTHON* environment variables, no script directory on sys.path), feeds the code
on stdin, and returns a `ToolResult` with stdout and stderr. Limits, applied in the child before
it starts (`preexec_fn`):

- ``RLIMIT_CPU``: `timeout_s` CPU seconds (rounded up), so a busy loop is killed by the kernel;
- ``RLIMIT_AS``: `memory_mb` of address space, so a huge allocation raises MemoryError;
- ``RLIMIT_FSIZE``: files the code writes are capped at 1 MiB;
- ``RLIMIT_CORE``: 0 (no core dumps).

Wall-clock: the child runs in its own session and, past `timeout_s` (sleeping or blocked on I/O
included), its whole process group is killed; the result says ``timed out``. The working
directory is a fresh temporary folder, removed afterwards; the environment is reduced to PATH,
LANG and HOME (the temporary folder).

Not a security boundary: the child runs as the same user, can read what that user can read,
and can open network connections (network isolation needs namespaces or a container, which this
process cannot set up unprivileged). Use it for model-written arithmetic and small programs, as
the ReTool recipe does, not for untrusted users. POSIX only (``resource``, process groups).

`format_observation(result)` turns a result into the text the model sees: stdout, then stderr
when the program failed, then a timeout note; empty output reads as a short note so the model
can tell "ran, printed nothing" from a lost call.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

MAX_CAPTURE_CHARS = 16_384  # per stream, before token truncation by the caller
_FILE_LIMIT_BYTES = 1 << 20


@dataclass
class ToolResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when killed on the wall-clock timeout
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0


def _limits(cpu_s: int, memory_bytes: int) -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_LIMIT_BYTES, _FILE_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CAPTURE_CHARS else text[:MAX_CAPTURE_CHARS] + "\n...[truncated]"


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, python: str | None = None) -> ToolResult:
    """Run `code` in a fresh limited interpreter (see the module docstring)."""
    cpu_s = max(1, math.ceil(timeout_s))
    mem = int(memory_mb) * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="rlbench-tool-") as cwd:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": cwd}
        proc = subprocess.Popen([python or sys.executable, "-I", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True,
                                preexec_fn=lambda: _limits(cpu_s, mem))
        try:
            out, err = proc.communicate(code.encode("utf-8", "replace"), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            return ToolResult(_clip(out.decode("utf-8", "replace")), _clip(err.decode("utf-8", "replace")),
                              None, timed_out=True)
    return ToolResult(_clip(out.decode("utf-8", "replace")), _clip(err.decode("utf-8", "replace")), proc.returncode)


def format_observation(result: ToolResult, *, timeout_s: float) -> str:
    """The text the model sees for one run (see the module docstring)."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if not result.ok and result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"Error: timed out after {timeout_s:g} s")
    elif result.returncode is not None and result.returncode < 0:
        parts.append(f"Error: killed by signal {-result.returncode} (CPU or memory limit)")
    if not parts:
        return "(no output; use print() to see values)"
    return "\n".join(parts)
