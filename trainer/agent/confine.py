"""The sandbox's confinement layers, applied by a tool-call process to itself before the code runs.

Loaded by the zygote (`trainer/agent/zygote.py`) from its file path, so it imports only the
standard library and, for seccomp, `pyseccomp` (a maintained ctypes binding of libseccomp with
the API of libseccomp's own Python module). Each layer is a function that raises `OSError` (or
`ImportError`) when the kernel or the process cannot apply it; the zygote records which layers
applied, and a call that must apply a layer that fails does not run its code.

    rlimits   RLIMIT_CPU, AS, FSIZE, NOFILE, NPROC, CORE with soft = hard (code cannot raise them)
    uid       setgroups([]), setresgid, setresuid to a dedicated unprivileged id (root only);
              optionally CAP_DAC_READ_SEARCH kept (see `drop_to`)
    landlock  the Linux Landlock LSM through its three syscalls (ctypes; no maintained package):
              all file access denied except the call's folder (read/write) and read-only system
              paths (Python's prefix, /usr, /lib*, /bin, a few /etc files); TCP bind/connect denied
              (ABI >= 4); signals and abstract unix sockets scoped to the call (ABI >= 6)
    seccomp   a libseccomp filter (compiled to BPF once, installed with one prctl per call): socket() denied (socketpair(AF_UNIX) allowed), no ptrace,
              process_vm_*, pidfd_getfd, kcmp, namespaces, mounts, bpf, io_uring, keyrings,
              modules; kill(-1, ...) denied
    cgroup    per-call pids + memory cgroups (v1 hierarchies or a v2 tree with both controllers)

Reference: the Landlock userspace API (include/uapi/linux/landlock.h, Documentation/userspace-api/
landlock.rst); libseccomp's seccomp_rule_add(3).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource

# ----------------------------------------------------------------------------- rlimits


def apply_rlimits(*, cpu_s: int, memory_bytes: int, file_bytes: int, nofile: int, nproc: int) -> None:
    """Soft = hard for every limit, so the code cannot raise a soft limit back up to the hard one."""
    for res, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                       (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_NOFILE, nofile),
                       (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


# ----------------------------------------------------------------------------- uid


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_KEEPCAPS = 8
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
CAP_DAC_READ_SEARCH = 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_to(uid: int, gid: int, *, keep_read_search: bool = False) -> None:
    """Leave root for `uid`/`gid` for good (real, effective and saved ids; no supplementary groups).

    `keep_read_search` keeps CAP_DAC_READ_SEARCH alone (no other capability): used only together
    with Landlock, when Python's prefix sits below a folder the uid cannot traverse (a pyenv under
    /root). Landlock still limits every path the process can open; open_by_handle_at, the one call
    that capability adds, is denied by the seccomp filter.
    """
    if keep_read_search:
        prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(errno.EPERM, "setresuid did not take")
    if keep_read_search:
        prctl(PR_SET_KEEPCAPS, 0)
        bit = 1 << CAP_DAC_READ_SEARCH
        data = (_CapData * 2)(_CapData(bit, bit, 0), _CapData(0, 0, 0))
        if _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"capset: {os.strerror(e)}")


def prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl({option}): {os.strerror(e)}")


def no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_subreaper() -> None:
    """Orphaned descendants are re-parented to this process (so it can find and kill them)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


# ----------------------------------------------------------------------------- landlock

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # rights a file rule may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    v = _libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                      ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(v), 0)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock {what}: {os.strerror(e)}")
    return ret


def landlock_restrict(*, rw_dirs: list[str], ro_paths: list[str], rw_files: list[str], abi: int) -> dict[str, bool]:
    """Restrict this process (and its future children) to the given paths; no TCP; scoped signals.

    Paths that do not exist are skipped. Returns which parts are in force: `fs`, `net`, `scope`.
    """
    if abi < 1:
        raise OSError(errno.EOPNOTSUPP, "landlock is not available")
    fs_all = _FS_BY_ABI.get(abi, _FS_BY_ABI[5])
    attr = _RulesetAttr(fs_all, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    rfd = _check(_libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                               ctypes.c_uint32(0)), "create_ruleset")
    try:
        ro = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
        for paths, access in ((rw_dirs, fs_all), (ro_paths, ro), (rw_files, FS_READ_FILE | FS_WRITE_FILE)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    rights = access & fs_all
                    if not os.path.isdir(path):
                        rights &= _FILE_ONLY
                    rule = _PathBeneath(rights, fd)
                    _check(_libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(rfd),
                                         ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)),
                           f"add_rule {path}")
                finally:
                    os.close(fd)
        _check(_libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(rfd), ctypes.c_uint32(0)),
               "restrict_self")
    finally:
        os.close(rfd)
    return {"fs": True, "net": abi >= 4, "scope": abi >= 6}


# ----------------------------------------------------------------------------- seccomp

_DENY = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "socket",
         "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open",
         "userfaultfd", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
         "io_uring_register", "init_module", "finit_module", "delete_module", "kexec_load",
         "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "open_by_handle_at",
         "name_to_handle_at", "quotactl", "syslog", "fanotify_init", "mount_setattr", "open_tree",
         "move_mount", "fsopen", "fsmount", "fspick")
_CLONE_NS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME


def build_seccomp_filter():  # -> pyseccomp.SyscallFilter
    """The filter (built once in the zygote; each call process only loads it)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in _DENY:
        try:
            f.add_rule(eperm, name)
        except (OSError, RuntimeError, ValueError):
            pass  # not a syscall on this architecture
    f.add_rule(eperm, "socketpair", sc.Arg(0, sc.NE, 1))  # AF_UNIX only
    for sig_call in ("kill", "tkill", "tgkill"):
        f.add_rule(eperm, sig_call, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, 0xFFFFFFFF))  # pid -1: everyone
    for flag in _CLONE_NS:
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    try:
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags live in a struct: make libc fall back to clone
    except (OSError, RuntimeError, ValueError):
        pass
    return f


def export_bpf(f) -> bytes:
    """libseccomp's compiled BPF program of filter `f` (compiled once; loading it is then one prctl)."""
    fd = os.memfd_create("rlbench-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb") as fh:
            f.export_bpf(fh)
        return os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def load_bpf(program: bytes) -> None:
    """Install a compiled seccomp program on this process (needs no_new_privs or CAP_SYS_ADMIN)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog),
                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"seccomp: {os.strerror(e)}")


# ----------------------------------------------------------------------------- cgroup


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _remove_stale(parent: str, prefix: str) -> None:
    """Remove `<parent>/<prefix><pid>` trees left by zygotes that died without cleaning up."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):]
        if not name.startswith(prefix) or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        base = os.path.join(parent, name)
        for sub in os.listdir(base) if os.path.isdir(base) else []:
            if sub.startswith("call-"):
                try:
                    os.rmdir(os.path.join(base, sub))
                except OSError:
                    pass  # a process is still inside: leave it
        try:
            os.rmdir(base)
        except OSError:
            pass


class CallCgroups:
    """Where per-call pids and memory cgroups go: `create(name)` -> directories, `limit`, `move`, `remove`."""

    def __init__(self, base_name: str) -> None:
        prefix = base_name.rsplit("-", 1)[0] + "-"
        own = _own_cgroups()
        self.kind = ""
        self.bases: list[str] = []
        v1 = [("/sys/fs/cgroup/pids", own.get("pids")), ("/sys/fs/cgroup/memory", own.get("memory"))]
        if all(p is not None and os.path.isdir(root) for root, p in v1):
            bases = [os.path.join(root, p.lstrip("/"), base_name) for root, p in v1]
            for b in bases:
                _remove_stale(os.path.dirname(b), prefix)
                os.makedirs(b, exist_ok=True)
            self.kind, self.bases = "v1", bases
            return
        if "" in own and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            base = os.path.join("/sys/fs/cgroup", own[""].lstrip("/"), base_name)
            _remove_stale(os.path.dirname(base), prefix)
            os.makedirs(base, exist_ok=True)
            with open(os.path.join(base, "cgroup.controllers")) as fh:
                have = fh.read().split()
            if not {"pids", "memory"} <= set(have):
                os.rmdir(base)
                raise OSError(errno.EOPNOTSUPP, "cgroup v2: pids/memory controllers not delegated")
            _write(os.path.join(base, "cgroup.subtree_control"), "+pids +memory")
            self.kind, self.bases = "v2", [base]
            return
        raise OSError(errno.EOPNOTSUPP, "no writable pids+memory cgroup")

    def create(self, name: str) -> list[str]:
        """Per-call directories (no limits yet; a spare worker is moved in before its call arrives:
        moving a process is the slow part, tens of ms on a busy machine, and stays off the call)."""
        dirs = [os.path.join(b, name) for b in self.bases]
        for d in dirs:
            os.mkdir(d)
        return dirs

    def limit(self, dirs: list[str], *, max_procs: int, memory_bytes: int) -> None:
        if self.kind == "v1":
            _write(os.path.join(dirs[0], "pids.max"), str(max_procs))
            _write(os.path.join(dirs[1], "memory.limit_in_bytes"), str(memory_bytes))
            try:
                _write(os.path.join(dirs[1], "memory.memsw.limit_in_bytes"), str(memory_bytes))
            except OSError:
                pass  # no swap accounting
        else:
            _write(os.path.join(dirs[0], "pids.max"), str(max_procs))
            _write(os.path.join(dirs[0], "memory.max"), str(memory_bytes))
            try:
                _write(os.path.join(dirs[0], "memory.swap.max"), "0")
            except OSError:
                pass

    @staticmethod
    def move(dirs: list[str], pid: int) -> None:
        for d in dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    @staticmethod
    def member(dirs: list[str]) -> bool:
        """Whether this process is in every one of `dirs` (read from /proc/self/cgroup)."""
        with open("/proc/self/cgroup") as fh:
            text = fh.read()
        return all("/" + os.path.basename(d) + "\n" in text for d in dirs)

    @staticmethod
    def pids(dirs: list[str]) -> list[int]:
        try:
            with open(os.path.join(dirs[0], "cgroup.procs")) as fh:
                return [int(x) for x in fh.read().split()]
        except OSError:
            return []

    @staticmethod
    def remove(dirs: list[str]) -> None:
        for d in dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass

    def close(self) -> None:
        self.remove(self.bases)
