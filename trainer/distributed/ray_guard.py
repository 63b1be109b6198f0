"""Leave no Ray process behind: a guard that outlives a killed driver, and the clean-up of earlier leftovers.

When the trainer starts its own local Ray cluster (no `RAY_ADDRESS`), `guard_local_cluster(out_dir)`:

1. records the session in `<out_dir>/ray_session.json`: the driver's pid and start time and
   Ray's session folder (`/tmp/ray/session_...`);
2. starts a guard process in its own session (a kill of the driver's process group spares it)
   that holds the read end of a pipe from the driver. When the driver is gone (normal exit or
   kill -9: the pipe closes) or the session's raylet is (`ray.shutdown()`), the guard ends every
   process of that session -- those whose command line or open files name the session folder,
   which covers Ray's agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) and workers that
   would otherwise linger under PID 1 for a minute -- with SIGTERM, then SIGKILL after 3 s.

`clear_leftovers(out_dir)`, at the start of every Ray run, handles a guard that died too (e.g. a
machine-wide kill): a record whose driver is dead names a session whose remaining processes are
ended, with a message saying how many. Only processes of a session this trainer started are
touched; a cluster joined through `RAY_ADDRESS` is never guarded or cleared.

    python -m trainer.distributed.ray_guard SESSION_DIR RAYLET_PID DRIVER_PID   # the guard (the driver starts it)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

RECORD = "ray_session.json"
_GRACE_S = 3.0


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start: int | None) -> bool:
    now = _start_time(pid)
    return now is not None and (start is None or now == start)


def session_processes(session_dir: str, *, exclude: set[int] | None = None) -> list[int]:
    """Pids of the processes whose command line or open files name `session_dir` (Linux /proc)."""
    exclude = (exclude or set()) | {os.getpid()}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        pid = int(name)
        try:
            if session_dir in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session_dir):
                    found.append(pid)
                    break
        except OSError:  # gone, or not ours to read
            continue
    return found


def end_processes(pids: list[int]) -> int:
    """SIGTERM, then SIGKILL what is left after the grace period; the number that were alive."""
    starts = {p: _start_time(p) for p in pids}
    alive = [p for p, s in starts.items() if s is not None]
    for p in alive:
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline and any(_alive(p, starts[p]) for p in alive):
        time.sleep(0.1)
    for p in alive:
        if _alive(p, starts[p]):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    return len(alive)


def clear_leftovers(out_dir: str | Path) -> int:
    """End the processes of the Ray session recorded in `out_dir` when its driver is dead; how many."""
    record = Path(out_dir) / RECORD
    try:
        info = json.loads(record.read_text())
        pid, start, session = int(info["driver_pid"]), info.get("driver_start"), str(info["session_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    if pid == os.getpid() or _alive(pid, start):
        return 0
    n = end_processes(session_processes(session))
    if n:
        print(f"ended {n} Ray process(es) left by a killed earlier run in {out_dir} (session {session})",
              file=sys.stderr, flush=True)
    record.unlink(missing_ok=True)
    return n


def _raylet_pid(session_dir: str) -> int | None:
    for pid in session_processes(session_dir):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                return pid
        except OSError:
            continue
    return None


_GUARDS: dict[str, subprocess.Popen] = {}


def guard_local_cluster(out_dir: str | Path, *, started_here: bool) -> None:
    """Record this process's Ray session in `out_dir` and start (once per session) its guard;
    `started_here=False` (Ray was already up) records only a session this module guards."""
    if not sys.platform.startswith("linux"):
        return
    import ray

    session = ray._private.worker._global_node.get_session_dir_path()
    if not started_here and session not in _GUARDS:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).write_text(json.dumps({"driver_pid": os.getpid(), "driver_start": _start_time(os.getpid()),
                                          "session_dir": session}))
    if session in _GUARDS:
        return
    raylet = _raylet_pid(session)
    _GUARDS[session] = subprocess.Popen(
        [sys.executable, "-m", "trainer.distributed.ray_guard", session, str(raylet or 0), str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _guard(session_dir: str, raylet_pid: int, driver_pid: int) -> None:
    """Wait for the driver (stdin closes) or the raylet to end, then end the session's processes."""
    raylet_start = _start_time(raylet_pid) if raylet_pid else None
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready and os.read(fd, 1) == b"":
            break
        if raylet_pid and not _alive(raylet_pid, raylet_start):
            time.sleep(1.0)  # ray.shutdown() ends its own processes first
            break
    end_processes(session_processes(session_dir, exclude={driver_pid}))  # a driver still alive keeps running


if __name__ == "__main__":
    _guard(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
