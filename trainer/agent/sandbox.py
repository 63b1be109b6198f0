"""The Python tool's sandbox: a warm zygote that forks one confined process per call.

    from trainer.agent.sandbox import run_python, sandbox_layers
    run_python("print(12 * 34)").stdout        # '408\\n'
    sandbox_layers()                            # {'in_force': [...], 'isolating': True, ...}

`Sandbox()` starts `zygote.py` (``python -I``, minimal environment) and runs a self-test through
it: each layer the machine might offer is tried, then probes check that it holds (the uid the
code sees, a TCP socket refused, a world-readable file outside the call's folder unreadable,
soft = hard limits). The layers that pass are in force and every later call must apply all of
them or does not run. The layers (see `confine.py` for each):

    rlimits    CPU seconds, address space, file size, open files, processes (soft = hard)
    uid        a dedicated unprivileged user (`rlbench-sandbox`, created when running as root;
               nobody/65534 if it cannot be created)
    landlock   no file access outside the call's folder except read-only system paths; no TCP;
               signals and abstract unix sockets scoped to the call
    seccomp    no sockets (socketpair(AF_UNIX) only), no ptrace / process_vm_* / namespaces / mounts
    cgroup     per-call process-count and total-memory bound (pids + memory controllers)
    memwatch   where no cgroup is writable: the call's resident memory summed over its processes,
               polled every `disk_poll_s`, the call killed past `memory_mb`
    subreaper  the call's whole process tree is killed at exit or deadline (daemons included)
    disk       the folder's total size and entry count, polled, the call killed past the bound

`isolating` is true when uid, landlock or seccomp is in force: the trainer refuses multi-turn
training without one unless `agent.sandbox_allow_unisolated=true`. The parent reads stdout and
stderr while the call runs (each bounded; past the bound the pipe is closed) and stops at the
supervisor's result, never waiting for end-of-file (a leftover process cannot hold a call open).

`run_python` uses one process-wide `Sandbox` (started on first use, restarted if its zygote dies).
`format_observation(result)` turns a result into the text the model sees.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import pwd
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_CAPTURE_CHARS = 16_384  # per stream, in the result text (before token truncation by the caller)
MAX_OUTPUT_BYTES = 64 << 10  # per stream, read from the pipe; past it the pipe is closed
MAX_CODE_BYTES = 256 << 10
SANDBOX_USER = "rlbench-sandbox"
ISOLATING = ("uid", "landlock", "seccomp")
_ZYGOTE = Path(__file__).with_name("zygote.py")
_RO_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
              "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/usr/share/zoneinfo")
_RW_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


@dataclass
class ToolResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when killed on the wall-clock timeout
    timed_out: bool = False
    error: str | None = None  # a sandbox limit the call hit (disk, output) or a sandbox failure
    seconds: float = 0.0  # wall-clock time of the call as the caller saw it
    info: dict[str, Any] = field(default_factory=dict)  # the supervisor's report (layers applied, ...)

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0 and self.error is None


def _clip(data: bytes, truncated: bool) -> str:
    text = data.decode("utf-8", "replace")
    if len(text) > MAX_CAPTURE_CHARS or truncated:
        text = text[:MAX_CAPTURE_CHARS] + "\n...[truncated]"
    return text


def _sandbox_ids(user: str) -> tuple[int, int] | None:
    """(uid, gid) of `user` when running as root (created if missing, else nobody); None otherwise."""
    if os.geteuid() != 0:
        return None
    for attempt in range(2):
        try:
            pw = pwd.getpwnam(user)
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            if attempt == 0 and shutil.which("useradd"):
                subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                                "--shell", "/usr/sbin/nologin", user], capture_output=True, check=False)
    return 65534, 65534


def _remove_stale_bases() -> None:
    """Folders of sandboxes whose process died without `close()` (named rlbench-sandbox-<pid>-*)."""
    root = Path(tempfile.gettempdir())
    for d in root.glob("rlbench-sandbox-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _closed_to_others(path: str) -> bool:
    """Whether a folder above `path` denies search to users other than its owner and group."""
    parts = Path(path).resolve().parents
    return any(not (p.stat().st_mode & 0o001) for p in parts)


def _prefixes() -> list[str]:
    out: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        p = os.path.realpath(p)
        if p not in out:
            out.append(p)
    return out


_PROBE = """
import json, os, resource, socket
r = {"uid": os.getuid()}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close(); r["socket"] = 0
except OSError as e:
    r["socket"] = e.errno
try:
    open(%r).read(1); r["outside"] = 0
except OSError as e:
    r["outside"] = e.errno
r["rlimits"] = [list(resource.getrlimit(x)) for x in (resource.RLIMIT_NPROC, resource.RLIMIT_AS)]
print(json.dumps(r))
"""


class Sandbox:
    """One zygote and the layers in force on this machine (module docstring)."""

    def __init__(self, *, user: str = SANDBOX_USER, base_dir: str | None = None, disk_poll_s: float = 0.02,
                 spares: int = 2) -> None:
        self.user = user
        self._base_owned = base_dir is None
        if base_dir is None:
            _remove_stale_bases()
        self.base_dir = base_dir or tempfile.mkdtemp(prefix=f"rlbench-sandbox-{os.getpid()}-")
        os.chmod(self.base_dir, 0o711)
        ids = _sandbox_ids(user)
        spec = importlib.util.find_spec("pyseccomp")
        self._cfg = {"uid": ids[0] if ids else None, "gid": ids[1] if ids else None, "base_dir": self.base_dir,
                     "prefixes": _prefixes(), "ro_paths": [*_prefixes(), *_RO_SYSTEM], "rw_files": list(_RW_FILES),
                     "pyseccomp_dir": os.path.dirname(spec.origin) if spec and spec.origin else None,
                     "disk_poll_s": disk_poll_s, "spares": spares, "owns_base_dir": self._base_owned,
                     "prefix_closed": any(_closed_to_others(p) for p in _prefixes())}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.possible: dict[str, Any] = {}
        self.layers: dict[str, Any] = {}
        self.in_force: list[str] = []
        self._start()
        self._self_test()

    # ------------------------------------------------------------ zygote
    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._proc = subprocess.Popen([sys.executable, "-I", str(_ZYGOTE), json.dumps(self._cfg), str(child.fileno())],
                                      pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, cwd="/", start_new_session=True)
        child.close()
        parent.settimeout(60)
        hello = parent.recv(1 << 16)
        parent.settimeout(None)
        if not hello:
            raise RuntimeError(f"the sandbox zygote ({_ZYGOTE}) exited at start-up (code {self._proc.wait()})")
        self.possible = json.loads(hello)["possible"]
        self._sock = parent

    def close(self) -> None:
        if self._proc is not None:
            self._sock.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
        if self._base_owned:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __del__(self) -> None:  # best effort; close() is the real clean-up
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------ self-test
    def _self_test(self) -> None:
        outside = os.path.join(self.base_dir, "probe-outside.txt")
        Path(outside).write_text("x")
        os.chmod(outside, 0o644)
        try_all = ["rlimits", "uid", "landlock", "seccomp", "cgroup"]
        res = self.run(_PROBE % outside, layers=try_all, strict=False, timeout_s=30)
        os.unlink(outside)
        applied = res.info.get("applied", {})
        try:
            probe = json.loads(res.stdout)
        except json.JSONDecodeError as e:
            raise RuntimeError(f"sandbox self-test failed: {res.stderr.strip() or res.error} ({e})") from None
        ok: dict[str, Any] = {}
        if "rlimits" in applied and all(soft == hard for soft, hard in probe["rlimits"]):
            ok["rlimits"] = True
        if "uid" in applied and probe["uid"] == self._cfg["uid"] and probe["uid"] != 0:
            ok["uid"] = probe["uid"]
        if "landlock" in applied and probe["outside"] != 0:
            ok["landlock"] = {"abi": self.possible.get("landlock_abi"), **applied["landlock"]}
        if "seccomp" in applied and probe["socket"] != 0:
            ok["seccomp"] = True
        if "cgroup" in applied:
            ok["cgroup"] = applied["cgroup"]
        ok["subreaper"] = True  # prctl failure fails the supervisor, so every answered call had one
        ok["disk"] = True
        if "cgroup" not in ok:  # the total-memory bound by polling instead (a 20 ms reaction time)
            ok["memwatch"] = True
        self.in_force = [k for k in [*try_all, "memwatch"] if k in ok]
        self.layers = {"in_force": list(ok), "isolating": any(k in ok for k in ISOLATING), "details": ok,
                       "not_in_force": {k: self._why_not(k, res.info) for k in try_all if k not in ok},
                       "user": self.user if ok.get("uid") not in (None, 65534) else ("nobody" if "uid" in ok else None)}

    def _why_not(self, layer: str, info: dict[str, Any]) -> str:
        possible = self.possible.get(layer)
        if isinstance(possible, str) and possible not in ("v1", "v2"):  # the zygote could not set it up at all
            return possible
        return str(info.get("errors", {}).get(layer, "applied, but the self-test probe got through"))

    # ------------------------------------------------------------ calls
    def run(self, code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, max_procs: int = 32,
            file_mb: int = 1, disk_mb: int = 16, max_files: int = 256, nofile: int = 64,
            max_output_bytes: int = MAX_OUTPUT_BYTES, layers: list[str] | None = None, strict: bool = True) -> ToolResult:
        """Run `code` in a confined process (the layers in force unless `layers` says otherwise)."""
        t0 = time.monotonic()
        data = code.encode("utf-8", "replace")
        if len(data) > MAX_CODE_BYTES:
            return ToolResult("", "", None, error=f"the program is {len(data)} bytes (the limit is {MAX_CODE_BYTES})")
        req = {"code": code, "timeout_s": timeout_s, "cpu_s": max(1, int(-(-timeout_s // 1))),
               "memory_bytes": memory_mb << 20, "file_bytes": file_mb << 20, "disk_bytes": disk_mb << 20,
               "max_files": max_files, "nofile": nofile, "nproc": max_procs,
               "layers": self.in_force if layers is None else layers, "strict": strict}
        pipes = [os.pipe() for _ in range(3)]
        try:
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                socket.send_fds(self._sock, [json.dumps(req).encode()], [w for _, w in pipes])
        finally:
            for _, w in pipes:
                os.close(w)
        return self._collect([r for r, _ in pipes], timeout_s, max_output_bytes, t0)

    def _collect(self, fds: list[int], timeout_s: float, limit: int, t0: float) -> ToolResult:
        bufs = [bytearray(), bytearray(), bytearray()]
        truncated = [False, False]
        sel = selectors.DefaultSelector()
        for i, fd in enumerate(fds):
            sel.register(fd, selectors.EVENT_READ, i)
        deadline = t0 + timeout_s + 10  # the supervisor answers by timeout_s; past this the zygote is gone
        open_fds = set(fds)
        try:
            while fds[2] in open_fds:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ToolResult("", "", None, error="the sandbox did not answer", seconds=time.monotonic() - t0)
                for key, _ in sel.select(left):
                    i = key.data
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    bufs[i] += chunk
                    if i < 2 and len(bufs[i]) > limit:  # bounded output: close the pipe (the writer gets EPIPE)
                        del bufs[i][limit:]
                        truncated[i] = True
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        open_fds.discard(key.fd)
            for i in (0, 1):  # what is already in the pipes, without waiting for end-of-file
                if fds[i] in open_fds:
                    os.set_blocking(fds[i], False)
                    try:
                        while len(bufs[i]) <= limit and (chunk := os.read(fds[i], 1 << 16)):
                            bufs[i] += chunk
                    except BlockingIOError:
                        pass
        finally:
            sel.close()
            for fd in open_fds:
                os.close(fd)
        info = json.loads(bufs[2]) if bufs[2] else {"error": "the sandbox supervisor died"}
        return ToolResult(_clip(bytes(bufs[0]), truncated[0]), _clip(bytes(bufs[1]), truncated[1]),
                          info.get("returncode"), timed_out=bool(info.get("timed_out")), error=info.get("error"),
                          seconds=time.monotonic() - t0, info=info)


_SHARED: Sandbox | None = None
_SHARED_LOCK = threading.Lock()


def get_sandbox(user: str = SANDBOX_USER) -> Sandbox:
    """The process-wide sandbox (started, and self-tested, on first use)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Sandbox(user=user)
            atexit.register(_SHARED.close)
        return _SHARED


def sandbox_layers() -> dict[str, Any]:
    """The layers in force on this machine (what env.json records as `sandbox`)."""
    return get_sandbox().layers


def check_isolation(cfg: Any, out_dir: str | Path | None = None) -> dict[str, Any]:
    """The layers in force for a run with agent config `cfg` (started with its `sandbox_user`);
    recorded as `sandbox` in `<out_dir>/env.json` when given. Raises ConfigError when no isolating
    layer is in force and `cfg.sandbox_allow_unisolated` is false."""
    from trainer.errors import ConfigError

    layers = get_sandbox(cfg.sandbox_user).layers
    if out_dir is not None:
        env_path = Path(out_dir) / "env.json"
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
        env["sandbox"] = layers
        env_path.parent.mkdir(parents=True, exist_ok=True)
        env_path.write_text(json.dumps(env, indent=2, default=str))
    if not layers["isolating"] and not cfg.sandbox_allow_unisolated:
        raise ConfigError(f"agent.enable=true: the tool sandbox has no isolating layer on this machine (in force: "
                          f"{layers['in_force']}; missing: {layers['not_in_force']}); fix: run as root or where "
                          f"Landlock/seccomp work (pip install pyseccomp), or set agent.sandbox_allow_unisolated=true")
    return layers


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, **limits: Any) -> ToolResult:
    """Run `code` in the shared sandbox (see `Sandbox.run` for the limits)."""
    return get_sandbox().run(code, timeout_s=timeout_s, memory_mb=memory_mb, **limits)


def format_observation(result: ToolResult, *, timeout_s: float) -> str:
    """The text the model sees: stdout, stderr when the program failed, then a limit note."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if not result.ok and result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"Error: timed out after {timeout_s:g} s")
    elif result.error:
        parts.append(f"Error: {result.error}")
    elif result.returncode is not None and result.returncode < 0:
        parts.append(f"Error: killed by signal {-result.returncode} (CPU or memory limit)")
    if not parts:
        return "(no output; use print() to see values)"
    return "\n".join(parts)
