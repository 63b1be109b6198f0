"""Hostile programs through the tool sandbox: each one must be contained by the layers in force.

    python3 -m pytest -q tests/unit/test_sandbox_hostile.py -rA

The layers in force on the machine are printed in the run's output (terminal line "sandbox
layers in force"). Every program gets the sandbox's default limits unless its row says otherwise;
its check looks at the program's output and at the machine afterwards (files, processes, sockets).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from trainer.agent.sandbox import Sandbox, ToolResult

pytestmark = pytest.mark.timing  # time limits of a second or two: alone, not beside another worker

ROOT = Path(__file__).resolve().parents[2]
SECRET = "rlbench-secret-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def sb(request: pytest.FixtureRequest):
    box = Sandbox(spares=1)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    line = f"sandbox layers in force: {box.layers['details']} (missing: {box.layers['not_in_force'] or 'none'})"
    if reporter is not None:
        reporter.write_line(line)
    yield box
    box.close()


def _sandbox_pids(uid: int | None) -> list[int]:
    """Live processes running as the sandbox uid."""
    out = []
    if uid is None:
        return out
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) == uid:
                    out.append(int(name))
    return out


def _no_leftovers(sb: Sandbox) -> None:
    deadline = time.monotonic() + 2
    while _sandbox_pids(sb.layers["details"].get("uid")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_pids(sb.layers["details"].get("uid")) == []


def _blocked(res: ToolResult, n: int = 1) -> None:
    """The program printed 'blocked' for each attempt (it catches the error itself)."""
    assert res.stdout.count("blocked") == n and "LEAK" not in res.stdout, (res.stdout, res.stderr)


TRY = """
def attempt(fn):
    try:
        r = fn()
        print("LEAK", repr(r)[:200])
    except BaseException as e:
        print("blocked", type(e).__name__)
"""


def test_tcp_to_a_local_listener(sb: Sandbox) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(1.5)
    port = srv.getsockname()[1]
    res = sb.run(TRY + f"import socket\nattempt(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1))")
    with pytest.raises(TimeoutError):
        srv.accept()
    srv.close()
    _blocked(res)


def test_udp_and_dns(sb: Sandbox) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(1.0)
    port = rx.getsockname()[1]
    res = sb.run(TRY + "import socket\n"
                 f"attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port})))\n"
                 "attempt(lambda: socket.getaddrinfo('example.com', 80))\n"
                 "attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))\n"
                 "attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect('/run/docker.sock'))")
    with pytest.raises(TimeoutError):
        rx.recvfrom(16)
    rx.close()
    _blocked(res, 4)


def test_writes_outside_the_folder(sb: Sandbox) -> None:
    # new files only (an unconfined run must not damage the checkout): /tmp, the checkout, /dev/shm
    targets = [f"/tmp/rlbench-hostile-{uuid.uuid4().hex}", str(ROOT / f"hostile-{uuid.uuid4().hex}.txt"),
               f"/dev/shm/rlbench-hostile-{uuid.uuid4().hex}"]
    try:
        res = sb.run(TRY + "".join(f"attempt(lambda: open({t!r}, 'x').write('pwned'))\n" for t in targets))
        _blocked(res, len(targets))
        for t in targets:
            assert not os.path.exists(t)
    finally:
        for t in targets:
            Path(t).unlink(missing_ok=True)


def test_reads_of_secrets_and_the_checkout(sb: Sandbox) -> None:
    paths = ["/etc/shadow", f"/proc/{os.getpid()}/environ", str(ROOT / "trainer" / "agent" / "sandbox.py"),
             str(ROOT / "README.md"), os.path.expanduser("~/.bash_history"), "/proc/1/environ"]
    res = sb.run(TRY + "import os\n" + "".join(f"attempt(lambda: open({p!r}).read(100))\n" for p in paths)
                 + "attempt(lambda: open(f'/proc/{os.getppid()}/environ').read())\n")
    _blocked(res, len(paths) + 1)


def test_import_of_the_trainer(sb: Sandbox) -> None:
    res = sb.run(TRY + f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nattempt(lambda: __import__('trainer.agent.loop'))")
    _blocked(res)


def test_other_processes_environment(sb: Sandbox) -> None:
    os.environ["RLBENCH_HOSTILE_SECRET"] = SECRET
    try:
        res = sb.run("import os\nfound = []\ntry:\n    pids = os.listdir('/proc')\nexcept OSError:\n"
                     "    pids = [str(p) for p in range(1, 50000)]\nfor p in pids:\n"
                     "    try:\n        found.append(open(f'/proc/{p}/environ').read())\n    except Exception:\n        pass\n"
                     "print('scanned', len(found))\nprint(os.environ)", timeout_s=20)
    finally:
        del os.environ["RLBENCH_HOSTILE_SECRET"]
    assert SECRET not in res.stdout and "scanned 0" in res.stdout, res.stdout


def test_proc_and_sys_probing(sb: Sandbox) -> None:
    res = sb.run(TRY + "import os\nattempt(lambda: os.listdir('/proc'))\nattempt(lambda: open('/proc/1/cmdline').read())\n"
                 "attempt(lambda: os.listdir('/sys/class/net'))\nattempt(lambda: open('/proc/self/mountinfo').read())\n"
                 "attempt(lambda: open('/sys/fs/cgroup/pids/cgroup.procs', 'w').write(str(os.getpid())))")
    _blocked(res, 5)


def test_symlink_and_hardlink_tricks(sb: Sandbox) -> None:
    Path("/tmp/rlbench-hostile-link").unlink(missing_ok=True)
    res = sb.run(TRY + f"import os\nos.symlink('/etc/shadow', 's1')\nos.symlink({str(ROOT / 'README.md')!r}, 's2')\n"
                 "attempt(lambda: open('s1').read())\nattempt(lambda: open('s2').read())\n"
                 "attempt(lambda: os.link('/etc/passwd', 'h1'))\n"
                 "os.symlink('/tmp', 'd')\nattempt(lambda: open('d/rlbench-hostile-link', 'w').write('x'))")
    exists = os.path.exists("/tmp/rlbench-hostile-link")
    Path("/tmp/rlbench-hostile-link").unlink(missing_ok=True)
    _blocked(res, 4)
    assert not exists


def test_kill_the_parent_and_others(sb: Sandbox) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        res = sb.run(TRY + "import os, signal\n"
                     # signal 0 checks the same permission as a real signal, without harm if it leaks
                     f"attempt(lambda: os.kill({os.getpid()}, 0))\n"
                     f"attempt(lambda: os.kill({victim.pid}, signal.SIGTERM))\n"
                     "attempt(lambda: os.kill(os.getppid(), 0))\n"
                     "attempt(lambda: os.kill(-1, 0))\nattempt(lambda: os.kill(1, 0))")
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    _blocked(res, 5)
    assert sb.run("print(7)").stdout == "7\n"  # the zygote is alive


def test_ptrace_and_process_vm_read(sb: Sandbox) -> None:
    res = sb.run(TRY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "def attach(pid):\n    if libc.ptrace(16, pid, 0, 0) != 0:\n"
                 "        raise OSError(ctypes.get_errno(), 'ptrace')\n    return 'attached'\n"
                 f"attempt(lambda: attach({os.getpid()}))\nattempt(lambda: attach(os.getppid()))\n"
                 f"attempt(lambda: open('/proc/{os.getpid()}/mem', 'rb').read(1))")
    _blocked(res, 3)


def test_uid_of_a_shell(sb: Sandbox) -> None:
    res = sb.run("import os\nos.system('id -u')\nprint(os.getuid(), os.geteuid())")
    lines = res.stdout.split()
    assert lines and all(int(x) != 0 for x in lines), (res.stdout, res.stderr)
    assert int(lines[0]) == sb.layers["details"]["uid"]


def test_privilege_regain(sb: Sandbox) -> None:
    res = sb.run(TRY + "import os, resource\nattempt(lambda: os.setuid(0))\n"
                 "s, h = resource.getrlimit(resource.RLIMIT_NPROC)\n"
                 "attempt(lambda: resource.setrlimit(resource.RLIMIT_NPROC, (h + 100, h + 100)))\n"
                 "attempt(lambda: resource.setrlimit(resource.RLIMIT_AS, (-1, -1)))\nprint('soft==hard', s == h)")
    _blocked(res, 3)
    assert "soft==hard True" in res.stdout


def test_fork_bomb(sb: Sandbox) -> None:
    res = sb.run("import os, time\nn = 0\nfor _ in range(300):\n    try:\n        if os.fork() == 0:\n"
                 "            time.sleep(30); os._exit(0)\n        n += 1\n    except OSError:\n        pass\nprint('forked', n)",
                 timeout_s=5, max_procs=32)
    forked = int(res.stdout.split()[-1])
    assert forked < 32, res.stdout
    _no_leftovers(sb)


@pytest.mark.parametrize("bound", ["in force", "memwatch"])
def test_memory_across_children(sb: Sandbox, bound: str) -> None:
    layers = None if bound == "in force" else [x for x in sb.in_force if x != "cgroup"] + ["memwatch"]
    code = ("import os, time\npids = []\nfor i in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
            "        try:\n            b = b'x' * (400 << 20)\n            print('held', flush=True)\n            time.sleep(2)\n"
            "        except MemoryError:\n            pass\n        os._exit(0)\n    pids.append(pid)\n"
            "for p in pids:\n    os.waitpid(p, 0)\n")
    res = sb.run(code, memory_mb=512, timeout_s=10, layers=layers)
    assert res.stdout.count("held") < 3, res.stdout  # at most 512 MiB across the call's processes
    _no_leftovers(sb)


def test_double_forked_daemon(sb: Sandbox) -> None:
    marker = f"/tmp/rlbench-daemon-{uuid.uuid4().hex}"
    res = sb.run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(2)\n"
                 f"        open({marker!r}, 'w').write('alive')\n        os._exit(0)\n    os._exit(0)\nprint('parent done')")
    assert res.ok and res.stdout == "parent done\n"
    _no_leftovers(sb)
    time.sleep(2.5)
    assert not os.path.exists(marker)


def test_setsid_grandchild_holding_stdout(sb: Sandbox) -> None:
    t0 = time.monotonic()
    res = sb.run("import os, time, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                 "        time.sleep(20); print('late'); os._exit(0)\n    os._exit(0)\nprint('done')", timeout_s=3)
    assert time.monotonic() - t0 < 2.5 and res.stdout == "done\n", (res, time.monotonic() - t0)
    _no_leftovers(sb)


def test_many_files(sb: Sandbox) -> None:
    res = sb.run("n = 0\nfor i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20)); n += 1\nprint('wrote', n)",
                 disk_mb=16, timeout_s=10)
    assert not res.ok and (res.error or "").startswith("disk limit exceeded"), (res.error, res.stdout[-200:])


def test_big_file(sb: Sandbox) -> None:
    res = sb.run("open('big', 'wb').write(b'x' * (8 << 20))", file_mb=1)
    assert not res.ok and res.returncode not in (0, None)  # SIGXFSZ or OSError past RLIMIT_FSIZE


def test_fd_inheritance(sb: Sandbox) -> None:
    r, w = os.pipe()
    os.set_inheritable(r, True)
    try:
        res = sb.run("import os\nopen_fds = []\nfor fd in range(3, 256):\n    try:\n        os.fstat(fd); open_fds.append(fd)\n"
                     "    except OSError:\n        pass\nprint('open', open_fds)")
    finally:
        os.close(r)
        os.close(w)
    assert res.stdout == "open []\n", res.stdout


def test_other_calls_folders(sb: Sandbox) -> None:
    res = sb.run(TRY + f"import os\nattempt(lambda: os.listdir({sb.base_dir!r}))\nattempt(lambda: os.listdir('/tmp'))\n"
                 "attempt(lambda: os.listdir('..'))")
    _blocked(res, 3)


def test_busy_loop_sleep_allocation_and_flood(sb: Sandbox) -> None:
    busy = sb.run("while True: pass", timeout_s=1)
    assert not busy.ok and (busy.timed_out or busy.returncode == -signal.SIGXCPU)
    sleep = sb.run("import time; time.sleep(30)", timeout_s=0.5)
    assert sleep.timed_out
    alloc = sb.run("x = bytearray(2 << 30)", memory_mb=256)
    assert "MemoryError" in alloc.stderr
    t0 = time.monotonic()
    flood = sb.run("while True: print('y' * 1000)", timeout_s=3, max_output_bytes=1 << 16)
    assert flood.stdout.endswith("...[truncated]") and not flood.ok and time.monotonic() - t0 < 3.5


def test_concurrent_calls_are_contained_from_each_other(sb: Sandbox) -> None:
    out: dict[str, ToolResult] = {}
    sleeper = threading.Thread(target=lambda: out.__setitem__("a", sb.run(
        "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(1.5)\nprint('survived')", timeout_s=3)))
    sleeper.start()
    time.sleep(0.5)
    kill = sb.run(TRY + "import os, signal\n" + "".join(
        f"attempt(lambda: os.kill({pid}, 0))\n" for pid in _sandbox_pids(sb.layers["details"].get("uid"))))
    sleeper.join()
    assert "survived" in out["a"].stdout and "LEAK" not in kill.stdout, (out["a"], kill.stdout)
