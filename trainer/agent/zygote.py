"""The sandbox's zygote: a warm interpreter that forks one confined process per tool call.

Started by `trainer.agent.sandbox.Sandbox` as ``python -I zygote.py <config json> <socket fd>``
with a minimal environment; it imports only the standard library, `confine.py` (by file path) and
`pyseccomp`, pre-imports the modules tool code usually needs, then serves requests on a
SOCK_SEQPACKET socket: each message is a JSON request plus three descriptors (the write ends of
the call's stdout, stderr and result pipes, which the caller reads).

Per request the zygote forks a supervisor, which
  1. becomes a child subreaper (orphaned descendants of the call are re-parented to it),
  2. makes the call's folder (owned by the sandbox uid) and per-call cgroups,
  3. forks the worker, which joins the cgroups, applies the layers (`confine.py`: rlimits, uid,
     no_new_privs, Landlock, seccomp), closes every inherited descriptor, and runs the code in a
     fresh ``__main__`` (no new interpreter start: that is what keeps a call at a few ms),
  4. waits on a pidfd for the worker's exit or the deadline, polling the folder's disk use (and,
     where no memory cgroup is writable, the resident memory of the call's processes),
  5. kills whatever is left of the tree (the cgroup's processes, or the subreaper's descendants
     found in /proc), removes the folder and cgroups, and writes the result JSON.

The caller never waits for the output pipes to close: the result pipe says when the call is over.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
_PRELOAD = ("math", "cmath", "json", "re", "itertools", "functools", "collections", "fractions",
            "decimal", "statistics", "random", "string", "datetime", "heapq", "bisect", "operator",
            "textwrap", "typing", "dataclasses", "copy", "io", "struct", "hashlib", "base64", "time",
            "subprocess", "linecache", "types", "builtins", "numbers", "array", "enum", "pprint", "traceback")


def _load_confine():
    spec = importlib.util.spec_from_file_location("rlbench_sandbox_confine", os.path.join(_HERE, "confine.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


confine = _load_confine()


# ----------------------------------------------------------------------------- the worker

def _run_code(code: str, folder: str) -> int:
    import builtins
    import io
    import linecache
    import types

    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": folder, "TMPDIR": folder,
                       "PWD": folder})
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    sys.argv = ["-"]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    linecache.cache["<tool>"] = (len(code), None, code.splitlines(True), "<tool>")
    rc = 0
    try:
        exec(compile(code, "<tool>", "exec"), main.__dict__)  # noqa: S102 - running the tool's code is the point
    except SystemExit as e:
        if e.code is None:
            rc = 0
        elif isinstance(e.code, int):
            rc = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException as e:  # noqa: BLE001 - the program's own error: Python's traceback, without this frame
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (output bound) or a replaced stream
            stream.flush()
    return rc


def _worker(req: dict, cfg: dict, folder: str, cg_dirs: list[str], out_w: int, err_w: int, status_w: int) -> None:
    """Confine this process (the layers the request names), then run the code. Never returns."""
    applied: dict[str, object] = {}
    errors: dict[str, str] = {}
    want = set(req["layers"])
    strict = req.get("strict", True)

    phases: dict[str, float] = {}

    def layer(name: str, fn) -> None:
        if name not in want:
            return
        t = time.perf_counter()
        try:
            applied[name] = fn()
        except Exception as e:  # noqa: BLE001 - the reason goes to the caller
            errors[name] = f"{type(e).__name__}: {e}"
        phases[name] = round((time.perf_counter() - t) * 1000, 3)

    try:
        os.setsid()
        layer("cgroup", lambda: _CGROUPS.kind if cg_dirs and confine.CallCgroups.member(cg_dirs) else
              (_ for _ in ()).throw(OSError("not in the call's cgroups")))
        os.chdir(folder)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        uid, gid = cfg.get("uid"), cfg.get("gid")
        layer("rlimits", lambda: confine.apply_rlimits(
            cpu_s=int(req["cpu_s"]), memory_bytes=int(req["memory_bytes"]), file_bytes=int(req["file_bytes"]),
            nofile=int(req["nofile"]), nproc=int(req["nproc"])) or True)
        keep = bool(cfg.get("prefix_closed")) and "landlock" in want
        layer("uid", lambda: confine.drop_to(uid, gid, keep_read_search=keep) or uid if uid is not None else
              (_ for _ in ()).throw(OSError("not root: no uid to drop to")))
        confine.no_new_privs()
        ro = list(cfg["ro_paths"])
        layer("landlock", lambda: confine.landlock_restrict(rw_dirs=[folder], ro_paths=ro, rw_files=cfg["rw_files"],
                                                            abi=_LANDLOCK_ABI))
        layer("seccomp", lambda: confine.load_bpf(_SECCOMP) or True if _SECCOMP is not None else
              (_ for _ in ()).throw(OSError(_SECCOMP_ERROR)))
        os.write(status_w, json.dumps({"applied": applied, "errors": errors, "worker_ms": phases}).encode())
        os.closerange(3, 1 << 16)
        if strict and errors:
            os.write(2, f"sandbox setup failed: {errors}\n".encode())
            os._exit(126)
        rc = _run_code(req["code"], folder)
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
        os._exit(126)
    os._exit(rc)


# ----------------------------------------------------------------------------- the supervisor

def _descendants(root: int) -> list[int]:
    """Processes below `root`, from /proc (used when the call has no cgroup)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _tree_rss(root: int) -> int:
    """Resident bytes of the processes below `root` (the memory bound where no cgroup is writable)."""
    total = 0
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _kill_tree(cg_dirs: list[str]) -> int:
    """Kill and reap every remaining descendant (they are all this subreaper's children by now)."""
    killed = 0
    for _ in range(10_000):
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return killed
        if pid:
            continue
        victims = confine.CallCgroups.pids(cg_dirs) if cg_dirs else []
        victims = victims or _descendants(os.getpid())
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.0005)
    return killed


def _disk_use(folder: str) -> tuple[int, int]:
    """(bytes allocated, entries) under `folder` (symlinks not followed)."""
    total, count = 0, 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
            count += 1
    return total, count


def _spare(cfg: dict, conn: socket.socket) -> None:
    """A pre-forked supervisor with a pre-forked worker, waiting for one request. Never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    result: dict[str, object] = {"returncode": None, "timed_out": False, "error": None, "killed": 0}
    folder, cg_dirs, res_w = "", [], -1
    try:
        confine.set_subreaper()
        to_worker, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the worker: wait for the request, then confine and run
            to_worker.close()
            conn.close()
            msg, fds, _, _ = socket.recv_fds(worker_end, 1 << 20, 3)
            if not msg:
                os._exit(0)
            worker_end.close()
            job = json.loads(msg)
            _worker(job["req"], cfg, job["folder"], job["cg_dirs"], *fds)
        worker_end.close()
        pidfd = os.pidfd_open(pid)
        if _CGROUPS is not None:
            cg_dirs = _CGROUPS.create(f"call-{os.getpid()}")
            confine.CallCgroups.move(cg_dirs, pid)
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        conn.close()
        if not msg:  # the zygote went away (or closed this spare): clean up and leave
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            confine.CallCgroups.remove(cg_dirs)
            os._exit(0)
        t0 = time.monotonic()
        ms = {}

        def mark(k: str) -> None:
            ms[k] = round((time.monotonic() - t0) * 1000, 3)

        req = json.loads(msg)
        out_w, err_w, res_w = fds
        folder = tempfile.mkdtemp(prefix="rlbench-tool-", dir=cfg["base_dir"])
        if cfg.get("uid") is not None and "uid" in req["layers"]:
            os.chown(folder, cfg["uid"], cfg["gid"])
        if cg_dirs:
            _CGROUPS.limit(cg_dirs, max_procs=int(req["nproc"]), memory_bytes=int(req["memory_bytes"]))
        mark("prepared")
        status_r, status_w = os.pipe()
        socket.send_fds(to_worker, [json.dumps({"req": req, "folder": folder, "cg_dirs": cg_dirs}).encode()],
                        [out_w, err_w, status_w])
        to_worker.close()
        for fd in (status_w, out_w, err_w):
            os.close(fd)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        deadline = t0 + float(req["timeout_s"])
        disk_bytes, max_files, tick = int(req["disk_bytes"]), int(req["max_files"]), float(cfg["disk_poll_s"])
        exited = False
        while not exited:
            left = deadline - time.monotonic()
            if left <= 0:
                result["timed_out"] = True
                break
            exited = bool(poller.poll(max(1, int(min(left, tick) * 1000))))
            if exited:
                break
            used, n = _disk_use(folder)
            if used > disk_bytes or n > max_files:
                result["error"] = (f"disk limit exceeded ({used >> 10} KiB in {n} entries; the limit is "
                                   f"{disk_bytes >> 10} KiB and {max_files} entries)")
                break
            if not cg_dirs and "memwatch" in req["layers"]:  # no memory cgroup: the tree's RSS, polled
                rss = _tree_rss(os.getpid())
                if rss > int(req["memory_bytes"]):
                    result["error"] = (f"memory limit exceeded ({rss >> 20} MiB resident across the call's "
                                       f"processes; the limit is {int(req['memory_bytes']) >> 20} MiB)")
                    break
        mark("exited")
        if not exited:
            os.kill(pid, signal.SIGKILL)
        _, wstatus = os.waitpid(pid, 0)
        os.close(pidfd)
        if not result["timed_out"] and not result["error"]:
            result["returncode"] = os.waitstatus_to_exitcode(wstatus)
        result["killed"] = _kill_tree(cg_dirs)
        status = os.read(status_r, 1 << 16)
        os.close(status_r)
        result.update(json.loads(status) if status else {"applied": {}, "errors": {"setup": "no status"}})
        mark("reaped")
        result["supervisor_ms"] = ms
    except BaseException as e:  # noqa: BLE001
        result["error"] = f"sandbox supervisor failed: {type(e).__name__}: {e}"
        _kill_tree(cg_dirs)
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        if cg_dirs:
            confine.CallCgroups.remove(cg_dirs)
        if res_w >= 0:
            result["seconds"] = time.monotonic() - t0
        try:
            if res_w >= 0:
                os.write(res_w, json.dumps(result).encode())
        finally:
            os._exit(0)


# ----------------------------------------------------------------------------- the zygote

_SECCOMP = None
_SECCOMP_ERROR = ""
_CGROUPS = None
_LANDLOCK_ABI = 0


def main() -> None:
    global _SECCOMP, _SECCOMP_ERROR, _CGROUPS, _LANDLOCK_ABI
    cfg = json.loads(sys.argv[1])
    sock = socket.socket(fileno=int(sys.argv[2]))
    possible: dict[str, object] = {}
    if cfg.get("pyseccomp_dir"):
        sys.path.insert(0, cfg["pyseccomp_dir"])
    try:
        _SECCOMP = confine.export_bpf(confine.build_seccomp_filter())
        possible["seccomp"] = True
    except Exception as e:  # noqa: BLE001
        _SECCOMP_ERROR = possible["seccomp"] = f"{type(e).__name__}: {e}"
    if cfg.get("pyseccomp_dir"):
        sys.path.remove(cfg["pyseccomp_dir"])
    try:
        _CGROUPS = confine.CallCgroups(f"rlbench-sandbox-{os.getpid()}")
        possible["cgroup"] = _CGROUPS.kind
    except Exception as e:  # noqa: BLE001
        possible["cgroup"] = f"{type(e).__name__}: {e}"
    _LANDLOCK_ABI = possible["landlock_abi"] = confine.landlock_abi()
    for name in _PRELOAD:
        with contextlib.suppress(Exception):  # an optional module that is not installed
            __import__(name)
    sock.send(json.dumps({"ready": True, "possible": possible, "pid": os.getpid()}).encode())
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    spares: list[socket.socket] = []

    def fork_spare() -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if os.fork() == 0:
            for other in (sock, mine, *spares):
                other.close()
            _spare(cfg, theirs)
        theirs.close()
        spares.append(mine)

    try:
        while True:
            while len(spares) < int(cfg["spares"]):
                fork_spare()
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            except InterruptedError:
                continue
            if not msg:
                break  # the trainer went away
            while True:
                if not spares:
                    fork_spare()
                conn = spares.pop(0)
                try:
                    socket.send_fds(conn, [msg], fds)
                    break
                except OSError:
                    continue  # that spare died: the next one
                finally:
                    conn.close()
            for fd in fds:
                os.close(fd)
    finally:
        for conn in spares:
            conn.close()  # each spare removes its cgroups and exits
        if cfg.get("owns_base_dir"):
            shutil.rmtree(cfg["base_dir"], ignore_errors=True)
        if _CGROUPS is not None:
            for _ in range(100):
                _CGROUPS.close()
                if not any(os.path.isdir(b) for b in _CGROUPS.bases):
                    break
                time.sleep(0.01)


if __name__ == "__main__":
    main()
