"""Run untrusted, model-written Python programs (code-task rewards) in a contained subprocess.

Each job runs as ``python -I main.py``, under a supervisor (``_SUPERVISOR``, in its own session: namespaces,
wall-clock timeout) and the job's init (pid 1 of the job's pid namespace: builds the job's file system, starts
the program, reaps orphans; when it exits, on the program's exit or killed at the timeout, the kernel kills every
process left in the namespace, ``setsid`` daemons included).

Root mode (the caller is real root, as in CI and training):
  * processes: own pid namespace: the program sees and can signal only the job's processes (``kill(-1)`` too).
  * user: a throw-away uid from ``UID_BASE`` (one per running job, leased with ``flock`` across all callers on
    the machine), no supplementary groups, no capabilities, ``PR_SET_NO_NEW_PRIVS``.
  * file system: own mount namespace whose root (``pivot_root``) is a fresh tmpfs with read-only, nosuid binds of
    ``SYSTEM_DIRS`` and of the interpreter's installation, a minimal /dev, a fresh /proc, and size-limited tmpfs
    on /tmp and /dev/shm; cwd and HOME ``/tmp/sandbox`` (a copy of main.py). The caller's home, repository,
    data, /tmp, /run (sockets) do not exist there.
  * network, IPC, UTS: own namespaces; the network one is empty (a down loopback): 127.0.0.1 is unreachable.
  * environment: PATH, LANG and HOME only; ``-I``: no user site, no PYTHON*; the interpreter's installed packages
    import (read-only), as test harnesses such as EvalPlus's need numpy.
  * budget: a cgroup per job shared by the job's whole process tree: ``memory_mb`` (swap included where the
    kernel accounts it) and ``NPROC`` processes; cgroup v2 (memory.max, memory.swap.max, pids.max) when its
    root can delegate them, else v1 (memory.limit_in_bytes + memsw, pids.max). An OOM kill in it: "memory".
    Without a usable cgroup, the watchdog of the user-namespace mode. Per process, always: RLIMIT_CPU (timeout
    + 1 s), RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps, and RLIMIT_AS = ``memory_mb``, or 4x that
    under a memory cgroup: there the cgroup is the shared budget and the per-process cap only stops absurd
    reservations (address space is not memory: thread stacks and arenas would fail programs under 1x).
  * output: stdout/stderr capped at ``OUTPUT_CAP`` bytes each (more: killed, reason "output limit").
User-namespace mode (an ordinary user, or root inside a container's user namespace; needs unprivileged user
namespaces, i.e. ``unshare -U`` works; no helper binary): the same namespaces and file system, the program runs
as uid ``USERNS_UID`` inside (the caller's uid outside) without capabilities. The caller's files are out of reach
because they are not in the job's (read-only) view, its processes because of the pid namespace. Budget (no
cgroup: not delegable to a user): the job's init sums the anonymous resident memory of the job's processes every
10 ms and kills the whole job over ``memory_mb`` (reason "memory"; pages shared copy-on-write after fork count
in every process sharing them: the strict side; the two tmpfs are not counted, each is ``TMPFS_MB`` at most),
RLIMIT_AS = ``memory_mb`` per process, and RLIMIT_NPROC, which in a fresh user namespace counts only the job's
processes (Linux >= 5.14). Supplementary groups cannot be dropped.
Neither possible (e.g. a seccomp-restricted container): ``run`` raises ``SandboxUnavailable``, unless the caller
opts in to unsafe execution (``DARE_SANDBOX_UNSAFE=1`` or ``sandbox.ALLOW_UNSAFE = True``): no namespaces; the
throw-away uid and the cgroup only as root; the per-process rlimits; a socket-blocking prelude (ctypes or
``_socket`` get around it); cleanup of the supervisor's descendants. The program can then read (without root
also write and delete) whatever the caller can, and signal the caller's processes.
``CodeResult.isolation`` names what a job got: "root+cgroup-v1", "userns+watchdog", "unsafe+rlimit", ...
NOT isolated in any mode: reading world-readable system files and the interpreter's installation; CPU time (no
cpu controller: jobs compete with the caller); kernel keyrings; the kernel itself (no seccomp filter).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

OUTPUT_CAP = 1 << 20  # bytes kept (and allowed) per stream
UID_BASE, UID_COUNT = 3_000_000_000, 4096  # throw-away uids; nothing else on the machine should use them
LEASE_DIR = "/tmp/dare-sandbox-uids"  # fixed (not $TMPDIR): every caller on the machine must share it
USERNS_UID = 1000  # the program's uid inside a user namespace (not 0: no capabilities after exec)
NPROC, NOFILE, FSIZE_MB, TMPFS_MB = 64, 256, 64, 64
GRACE = 2.0  # seconds past the timeout before the caller force-kills the supervisor
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")  # read-only in the job
PYTHON = sys.executable  # the job's interpreter; its installation is bound read-only into the job
ALLOW_UNSAFE = False  # run without isolation when none is possible (also DARE_SANDBOX_UNSAFE=1)
log = logging.getLogger(__name__)


def _real_root() -> bool:
    """Root of the initial user namespace (not root inside a container's user namespace)."""
    try:
        with open("/proc/self/uid_map") as f:
            return os.geteuid() == 0 and f.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return False


IS_ROOT = _real_root()


class SandboxUnavailable(RuntimeError):
    """The program cannot be isolated here (and unsafe execution was not allowed)."""


@dataclass
class CodeJob:
    program: str  # model-written code (+ the test harness appended by the caller)
    timeout: float = 10.0  # wall seconds for the whole job
    memory_mb: int = 1024  # memory budget of the whole job (all its processes)
    stdin: str = ""


@dataclass
class CodeResult:
    passed: bool  # exit status 0 within limits
    reason: str  # "ok", "timeout", "memory", "output limit", "error: <last stderr line>", "signal: SIGSEGV"...
    stdout: str
    stderr: str
    seconds: float
    isolation: str = ""  # what the job got: "<root|userns|unsafe>+<cgroup-v2|cgroup-v1|watchdog|rlimit>"


# Runs as the caller's user in the job's session; argv[1] is a JSON config. Kept dependency-free.
_SUPERVISOR = r"""
import ctypes, json, os, resource, signal, sys, time
cfg = json.loads(sys.argv[1]); safe = not cfg["unsafe"]; uid = cfg["uid"]
log = os.open(cfg["status"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
def report(**kw): os.write(log, (json.dumps(kw) + "\n").encode())
libc = ctypes.CDLL(None, use_errno=True)
def ok(ret, what):
    if ret != 0:
        e = ctypes.get_errno(); raise OSError(e, "%s: %s" % (what, os.strerror(e)))
def mount(src, dst, fstype=None, flags=0, data=None):
    enc = lambda s: s and s.encode()
    ok(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + dst)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
def readonly(path, rec=False):
    attr = (ctypes.c_uint64 * 4)(RDONLY | NOSUID, 0, 0, 0)                     # MOUNT_ATTR_RDONLY | _NOSUID
    if libc.syscall(442, -100, path.encode(), 0x8000 if rec else 0, attr, 32) != 0:  # mount_setattr, Linux 5.12
        f = os.statvfs(path).f_flag                                            # else this mount only, keeping
        mount(None, path, None, REMOUNT | BIND | RDONLY | NOSUID | (f & 0xc0e) | (1 << 21 if f & 4096 else 0))
def build_root(R):                                      # in a new mount namespace, as (namespace) root
    os.umask(0o022)
    ok(libc.unshare(0x20000), "unshare(CLONE_NEWNS)"); mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", R, "tmpfs", NOSUID | NODEV, "mode=755,size=1m")
    for p in cfg["binds"]:
        os.makedirs(os.path.dirname(R + p), exist_ok=True)
        if os.path.islink(p): os.symlink(os.readlink(p), R + p)
        else: os.makedirs(R + p); mount(p, R + p, None, BIND | REC); readonly(R + p, rec=True)
    os.mkdir(R + "/dev"); mount("tmpfs", R + "/dev", "tmpfs", NOSUID | NOEXEC, "mode=755,size=64k")
    for d in ("null", "zero", "full", "random", "urandom"):
        open(R + "/dev/" + d, "w").close(); mount("/dev/" + d, R + "/dev/" + d, None, BIND)
    for i, d in enumerate(("stdin", "stdout", "stderr")): os.symlink("/proc/self/fd/%d" % i, R + "/dev/" + d)
    os.symlink("/proc/self/fd", R + "/dev/fd")
    tmpfs = "mode=1777,size=%dm" % cfg["tmpfs_mb"]
    for d in ("/dev/shm", "/tmp"): os.mkdir(R + d); mount("tmpfs", R + d, "tmpfs", NOSUID | NODEV, tmpfs)
    readonly(R + "/dev")
    os.mkdir(R + "/tmp/sandbox", 0o700); shutil_copy(cfg["work"] + "/main.py", R + "/tmp/sandbox/main.py")
    if cfg["real_root"]: os.chown(R + "/tmp/sandbox", uid, uid); os.chown(R + "/tmp/sandbox/main.py", uid, uid)
    os.mkdir(R + "/proc"); mount("proc", R + "/proc", "proc", NOSUID | NODEV | NOEXEC)  # we are pid 1
    os.chdir(R); ok(libc.pivot_root(b".", b"."), "pivot_root"); ok(libc.umount2(b".", 2), "umount old root")
    os.chdir("/"); readonly("/")
def shutil_copy(src, dst):
    with open(src, "rb") as f, open(dst, "wb") as g: g.write(f.read())
def anon_rss():                                         # bytes, all processes of the pid namespace but init
    total = 0
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and p != "1": f = open("/proc/%s/statm" % p).read().split(); total += int(f[1]) - int(f[2])
        except (OSError, IndexError, ValueError): pass
    return total * os.sysconf("SC_PAGE_SIZE")
def init():                                             # pid 1 of the job (a plain child when unsafe)
    try:
        for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT): signal.signal(s, signal.SIG_DFL)
        libc.prctl(1, 9, 0, 0, 0)                                              # PR_SET_PDEATHSIG = SIGKILL
        procs = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in cfg["cgroup_procs"]]
        if safe: build_root(cfg["root"])
    except BaseException as e:
        report(setup_error="%s: %s" % (type(e).__name__, e)); os._exit(1)
    exe, cwd = (cfg["python"], "/tmp/sandbox") if safe else (cfg["unsafe_python"], cfg["work"])
    argv = [exe, "-I", "main.py"] if safe else [exe, "-I", "-c", cfg["guard"]]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd}
    child = os.fork()
    if child == 0:
        try:
            for fd in procs: os.write(fd, b"%d" % os.getpid())                 # into the job's cgroup(s)
            R = resource
            for res, v in ((R.RLIMIT_AS, cfg["as_mb"] << 20), (R.RLIMIT_CPU, cfg["cpu"]), (R.RLIMIT_CORE, 0),
                           (R.RLIMIT_FSIZE, cfg["fsize_mb"] << 20), (R.RLIMIT_NOFILE, cfg["nofile"]),
                           (R.RLIMIT_NPROC, cfg["nproc"])):
                R.setrlimit(res, (v, v))
            if cfg["real_root"]: os.setgroups([]); os.setgid(uid); os.setuid(uid)
            libc.prctl(38, 1, 0, 0, 0)                                        # PR_SET_NO_NEW_PRIVS
            os.umask(0o077); os.chdir(cwd); os.execve(exe, argv, env)
        except BaseException as e:
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode()); os._exit(127)
    watchdog, status = safe and cfg["watchdog"], {}
    while True:
        pid, st = os.waitpid(-1, os.WNOHANG if watchdog else 0)
        if pid == child:
            status["exit"] = os.waitstatus_to_exitcode(st); break
        if pid == 0:
            if not status and anon_rss() > cfg["memory_mb"] << 20:
                status["memory"] = True; os.kill(-1, signal.SIGKILL)          # all of the job but us
            time.sleep(0.01)
    report(**status); os._exit(0)                       # as pid 1: the kernel kills whatever is left
mode = ("root" if cfg["real_root"] else "userns") if safe else "unsafe"
try:
    if safe and not cfg["real_root"]:
        maps = (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, os.geteuid())),
                ("gid_map", "%d %d 1" % (uid, os.getegid())))
        ok(libc.unshare(0x10000000), "unshare(CLONE_NEWUSER)")
        for f, s in maps:
            with open("/proc/self/" + f, "w") as fh: fh.write(s)
    if safe: ok(libc.unshare(0x40000000 | 0x20000000 | 0x08000000 | 0x04000000), "unshare(net, pid, ipc, uts)")
except OSError as e:
    report(setup_error=str(e)); sys.exit()
libc.prctl(36, 1, 0, 0, 0)                                                    # PR_SET_CHILD_SUBREAPER
def kill_descendants():                  # unsafe mode: kill our children (orphans reparent to us) till none
    for _ in range(10000):
        try: kids = open("/proc/self/task/%d/children" % os.getpid()).read().split()
        except OSError: kids = []
        if not kids: return
        for k in kids:
            try: os.kill(int(k), 9)
            except OSError: pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0: break
            except ChildProcessError: break
class Abort(Exception): pass
def on_signal(sig, frame): raise Abort(sig)
signal.signal(signal.SIGTERM, on_signal); signal.signal(signal.SIGALRM, on_signal)
status, child = {"mode": mode}, 0
try:
    signal.setitimer(signal.ITIMER_REAL, cfg["timeout"])
    child = os.fork()
    if child == 0:
        try: init()
        finally: os._exit(1)                            # never back into the supervisor's code
    while os.waitpid(-1, 0)[0] != child: pass
    child = 0
except Abort as e:
    status["abort"] = "timeout" if e.args[0] == signal.SIGALRM else "aborted"
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGALRM, signal.SIG_IGN)
if child:
    os.kill(child, signal.SIGKILL); os.waitpid(child, 0)
if not safe: kill_descendants()
report(**status)
"""

# Network guard of unsafe mode (no network namespace). Weak: ctypes or _socket get around it.
_GUARD = r"""
import socket, _socket, runpy, sys
def _no_net(*a, **k): raise PermissionError("network disabled in sandbox")
socket.socket = socket.create_connection = socket.socketpair = _socket.socket = _no_net
sys.argv = ["main.py"]; del socket, _socket
runpy.run_path("main.py", run_name="__main__")
"""


class _UidLease:
    """One throw-away uid per running job, exclusive across threads and processes (flock on a root-only dir)."""

    def __enter__(self) -> int:
        self.fd = None
        if not IS_ROOT:
            return USERNS_UID
        d = LEASE_DIR
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            raise RuntimeError(f"{d} must be a directory owned by root with mode 0700")
        start = random.randrange(UID_COUNT)
        for i in range(UID_COUNT):
            n = (start + i) % UID_COUNT
            fd = os.open(os.path.join(d, str(n)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd = fd
            return UID_BASE + n
        raise RuntimeError("all sandbox uids are busy")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """{"cgroup2" | "memory" | "pids": (mount point, this process's cgroup under it)}."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            own.update((c, path) for c in (ctrls.split(",") if ctrls else ["cgroup2"]))
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            (fstype, _, opts), (root, mnt) = right.split()[:3], left.split()[3:5]
            for c in ["cgroup2"] if fstype == "cgroup2" else opts.split(",") if fstype == "cgroup" else []:
                if c in ("cgroup2", "memory", "pids") and c in own and c not in found:
                    found[c] = (mnt, own[c][len(root):] if root != "/" and own[c].startswith(root) else own[c])
    return found


def _read(d: str, name: str) -> str:
    with open(os.path.join(d, name)) as f:
        return f.read()


def _write(d: str, name: str, value) -> None:
    with open(os.path.join(d, name), "w") as f:
        f.write(str(value))


class _Cgroup:
    """The job's memory + pids budget, shared by its whole process tree (root only): cgroup v2 if its root can
    delegate both controllers, else v1 (nested in this process's cgroups), else none (kind "")."""

    def __init__(self, name: str, memory: int, pids: int):
        self.dirs, self.kind, self.memory = [], "", False
        try:
            m = _cgroup_mounts() if IS_ROOT else {}
            top = m.get("cgroup2", ("/nonexistent",))[0]
            if os.path.exists(top) and {"memory", "pids"} <= set(_read(top, "cgroup.controllers").split()):
                for d in (top, os.path.join(top, "dare-sandbox")):  # no processes in these: may delegate
                    os.makedirs(d, exist_ok=True)
                    _write(d, "cgroup.subtree_control", "+memory +pids")
                d = self._make(os.path.join(top, "dare-sandbox", name))
                limits = {"memory.max": memory, "memory.swap.max": 0, "pids.max": pids}
                self.kind = "cgroup-v2"
            else:
                limits, self.kind = {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory,
                                     "pids.max": pids}, "cgroup-v1"
                for ctrl in ("memory", "pids"):
                    if ctrl in m:
                        self._make(m[ctrl][0] + m[ctrl][1].rstrip("/") + "/" + name)
            for d in self.dirs:  # memory.limit_in_bytes before memsw (memsw >= limit); memsw only with swap accounting
                for f, v in limits.items():
                    if os.path.exists(os.path.join(d, f)):
                        _write(d, f, v)
                        self.memory |= f.startswith("memory.")
        except (OSError, ValueError):
            self.remove()
        if not self.dirs:
            self.kind, self.memory = "", False

    def _make(self, d: str) -> str:
        self._empty(d)  # a stale one of a crashed caller
        os.mkdir(d)
        self.dirs.append(d)
        return d

    @property
    def procs(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for f in ("memory.events", "memory.oom_control"):  # v2, v1 (Linux >= 4.13)
                if os.path.exists(os.path.join(d, f)):
                    if int(dict(ln.split() for ln in _read(d, f).splitlines()).get("oom_kill", 0)) > 0:
                        return True
        return False

    @staticmethod
    def _empty(d: str) -> None:
        """Kill what is still in cgroup ``d`` and remove it (normally empty already: the pid namespace died)."""
        for _ in range(200):
            try:
                if os.path.exists(os.path.join(d, "cgroup.kill")):
                    _write(d, "cgroup.kill", 1)
                for p in _read(d, "cgroup.procs").split():
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except OSError:
                        pass
                os.rmdir(d)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)

    def remove(self) -> None:
        for d in reversed(self.dirs):
            self._empty(d)
        self.dirs = []


def _unsafe_python() -> str:
    """Unsafe mode as root runs the throw-away uid in the caller's view of the file system: a python it can use."""
    def usable(path: str) -> bool:
        parts = os.path.realpath(path).split(os.sep)
        return all(os.stat(os.sep.join(parts[:i]) or "/").st_mode & stat.S_IXOTH for i in range(1, len(parts) + 1))
    return next((p for p in (PYTHON, "/usr/bin/python3", "/usr/local/bin/python3")
                 if os.path.exists(p) and (not IS_ROOT or usable(p))), PYTHON)


def _binds(python: str) -> list[str]:
    """What the job's file system holds: the system directories and the interpreter's installation."""
    out = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    prefixes = [os.path.dirname(os.path.dirname(python))]
    if python == os.path.realpath(sys.executable):  # a venv made with --copies needs its base installation too
        prefixes += [os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)]
    for prefix in sorted(set(prefixes)):
        if prefix != "/" and not any(prefix == d or prefix.startswith(d + "/") for d in out):
            out.append(prefix)
    return out


def _reason(status: dict, stderr: str, oom: bool) -> str:
    if status.get("memory") or oom:
        return "memory"
    if "abort" in status:
        return status["abort"]
    code = status.get("exit")
    if code is None:
        return "error: sandbox supervisor failed"
    if code == 0:
        return "ok"
    if code < 0:
        sig = signal.Signals(-code)
        return {signal.SIGXCPU: "timeout", signal.SIGXFSZ: "file size limit"}.get(sig, f"signal: {sig.name}")
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else f"exit code {code}"
    return "memory" if last.startswith("MemoryError") else f"error: {last}"


_warned: set[str] = set()


def run(job: CodeJob) -> CodeResult:
    result = _run(job, unsafe=False)
    if isinstance(result, CodeResult):
        return result
    if not (ALLOW_UNSAFE or os.environ.get("DARE_SANDBOX_UNSAFE") == "1"):
        raise SandboxUnavailable(
            f"cannot isolate the program ({result}); the sandbox needs root or unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, or a container that allows "
            "unshare). Set DARE_SANDBOX_UNSAFE=1 (or dare.rewards.sandbox.ALLOW_UNSAFE = True) to run "
            "model-written code WITHOUT isolation.")
    if "unsafe" not in _warned:
        _warned.add("unsafe")
        log.warning("sandbox: no isolation possible (%s); running model-written code UNSAFELY (opted in)", result)
    return _run(job, unsafe=True)


def _run(job: CodeJob, unsafe: bool) -> CodeResult | str:
    """The job's result, or the reason isolation failed (a string) before the program ran."""
    t0 = time.monotonic()
    base = tempfile.mkdtemp(prefix="dare-sbx-")
    try:
        with _UidLease() as uid:
            os.chmod(base, 0o711)  # traversable, not listable (unsafe mode as root runs in work/)
            work = os.path.join(base, "work")
            os.mkdir(work, 0o700)
            os.mkdir(os.path.join(base, "root"))
            with open(os.path.join(work, "main.py"), "w") as f:
                f.write(job.program)
            if IS_ROOT and unsafe:
                os.chown(work, uid, uid)
            python, status_path = os.path.realpath(PYTHON), os.path.join(base, "status")
            open(status_path, "w").close()
            cg = _Cgroup(f"dare-sbx-{uid}", job.memory_mb << 20, NPROC)
            try:
                cfg = dict(uid=uid, real_root=IS_ROOT, unsafe=unsafe, python=python, binds=_binds(python),
                           unsafe_python=unsafe and _unsafe_python(), root=os.path.join(base, "root"), work=work,
                           guard=_GUARD, status=status_path, timeout=job.timeout, cpu=int(job.timeout) + 1,
                           memory_mb=job.memory_mb, as_mb=job.memory_mb * (4 if cg.memory else 1),
                           watchdog=not cg.memory, cgroup_procs=cg.procs, fsize_mb=FSIZE_MB, nofile=NOFILE,
                           nproc=NPROC, tmpfs_mb=TMPFS_MB)
                with tempfile.TemporaryFile(dir=base) as fin:
                    fin.write(job.stdin.encode())
                    fin.seek(0)
                    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _SUPERVISOR, json.dumps(cfg)],
                                            stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=base,
                                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                            start_new_session=True)
                out, over, forced = _collect(proc, t0 + job.timeout + GRACE)
                oom = cg.oom_killed()
            finally:
                cg.remove()
            status = {}
            with open(status_path) as f:
                for line in f:
                    try:
                        status.update(json.loads(line))
                    except ValueError:
                        pass  # cut short by a forced kill
        if "setup_error" in status:
            return status["setup_error"]
        stdout, stderr = (b"".join(out[k]).decode(errors="replace") for k in ("out", "err"))
        reason = "output limit" if over else "timeout" if forced else _reason(status, stderr, oom)
        budget = cg.kind or ("rlimit" if unsafe else "watchdog")
        return CodeResult(reason == "ok", reason, stdout, stderr, time.monotonic() - t0,
                          f"{status.get('mode', 'unsafe' if unsafe else '?')}+{budget}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _collect(proc: subprocess.Popen, deadline: float) -> tuple[dict, bool, bool]:
    """Read both pipes until EOF, keeping OUTPUT_CAP bytes each; abort on overflow, force-kill past deadline."""
    out, size, over, forced = {"out": [], "err": []}, {"out": 0, "err": 0}, False, False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                forced = True
                for p in (-proc.pid, proc.pid):  # the supervisor's group (its init too), then the supervisor
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                break
            for key, _ in sel.select(min(left, 1.0)):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                keep = max(0, OUTPUT_CAP - size[key.data])
                out[key.data].append(data[:keep])
                size[key.data] += len(data)
                if size[key.data] > OUTPUT_CAP and not over:
                    over = True
                    proc.send_signal(signal.SIGTERM)  # supervisor kills the job and exits
    proc.stdout.close()
    proc.stderr.close()
    proc.wait()
    return out, over, forced


def run_batch(jobs: list[CodeJob], max_workers: int | None = None) -> list[CodeResult]:
    """Run jobs in parallel (threads driving subprocesses); results in the order of ``jobs``."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers or min(len(jobs), max(2, os.cpu_count() or 2))) as ex:
        return list(ex.map(run, jobs))
