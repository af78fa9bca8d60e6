"""Run untrusted, model-written Python programs (code-task rewards) in a contained subprocess.

Each job runs as ``python3 -I -S main.py`` in a fresh temporary directory that is deleted afterwards.
Between the caller and the program sits a small root supervisor (``_SUPERVISOR``, itself ``python -I -S``)
in its own session; it sets up the namespaces, forks the program with the limits and the dropped
privileges, enforces the wall-clock timeout, and, when the program ends or is aborted, kills and reaps
every process the program left behind (it is a child subreaper, so even ``setsid`` escapees are its
descendants) before it exits.

Isolated (when the caller runs as root, as in CI and training):
  * user: the program runs as a throw-away uid from ``UID_BASE`` (one uid per concurrently running job,
    allocated with ``flock`` so that concurrent callers on one machine never share one), no supplementary
    groups, ``PR_SET_NO_NEW_PRIVS`` (setuid binaries gain nothing). Hence it cannot write, delete or read
    the caller's non-world-accessible files, cannot signal the caller, the supervisor or other jobs, and
    ``RLIMIT_NPROC`` (which the kernel ignores for root) bounds fork bombs. Cleanup kills *every* process
    of that uid (``kill(-1, SIGKILL)`` from a helper with that uid), so nothing outlives the job.
  * network: own empty network namespace (``unshare(CLONE_NEWNET)``; only a down loopback), so no
    connection anywhere, 127.0.0.1 included.
  * filesystem: own mount namespace with fresh size-limited tmpfs on /tmp, /var/tmp and /dev/shm (so
    junk left there vanishes with the job); the work dir is bind-mounted at ``/tmp/sandbox`` (its cwd).
  * environment: empty except PATH, LANG and HOME (the work dir); ``-I -S``: no user site, no PYTHON*.
  * resources: RLIMIT_AS (``memory_mb``), RLIMIT_CPU (timeout + 1 s), RLIMIT_NPROC, RLIMIT_FSIZE,
    RLIMIT_NOFILE, no core dumps; wall-clock timeout; stdout/stderr read incrementally and capped at
    ``OUTPUT_CAP`` bytes each (a job that writes more is killed with reason "output limit").
NOT isolated:
  * world-readable files (system files, the interpreter, anything the caller left mode o+r) can be read;
    the rest of the file system stays visible (read-only for that uid except world-writable places
    other than the three tmpfs, e.g. /run/lock when present).
  * process list: no pid namespace, so /proc shows (but cannot touch) other processes.
  * CPU contention with the caller: no cgroups; limits are per-process (RLIMIT_AS counts each process).
  * the interpreter is ``sys.executable`` only when that is usable by other users; otherwise (e.g. pyenv
    under a 0700 /root) the first world-executable ``python3`` on a system path (``PYTHON``).
Not root (best effort, weaker): no uid drop and no namespaces; the program gets a socket-blocking prelude
(``socket.socket`` etc. replaced; ctypes or ``_socket`` still get around it), the limits except an
effective RLIMIT_NPROC (a fork bomb is bounded only by the wall timeout and the machine's limits), and
cleanup of the supervisor's descendants only (it is a subreaper; a process that double-forks *while* the
cleanup runs could in theory slip out).
"""
from __future__ import annotations

import fcntl
import json
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
NPROC, NOFILE, FSIZE_MB, TMPFS_MB = 64, 256, 64, 64
GRACE = 2.0  # seconds past the timeout before the caller force-kills the supervisor
IS_ROOT = os.geteuid() == 0


@dataclass
class CodeJob:
    program: str  # model-written code (+ the test harness appended by the caller)
    timeout: float = 10.0  # wall seconds for the whole job
    memory_mb: int = 1024  # address-space limit
    stdin: str = ""


@dataclass
class CodeResult:
    passed: bool  # exit status 0 within limits
    reason: str  # "ok", "timeout", "memory", "output limit", "error: <last stderr line>", "signal: SIGSEGV"...
    stdout: str
    stderr: str
    seconds: float


def _usable_by_others(path: str) -> bool:
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    dirs = [os.sep.join(parts[:i]) or "/" for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs) and os.stat(path).st_mode & stat.S_IXOTH != 0


def _pick_python() -> str:
    if not IS_ROOT or _usable_by_others(sys.executable):
        return sys.executable
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand) and _usable_by_others(cand):
            return cand
    raise RuntimeError("no python3 executable by an unprivileged user found; set sandbox.PYTHON")


PYTHON = _pick_python()

# Runs as the caller's user (root) in the job's session; argv[1] is a JSON config. Kept dependency-free.
_SUPERVISOR = r"""
import ctypes, json, os, resource, signal, sys, time
cfg = json.loads(sys.argv[1]); uid = cfg["uid"]; root = os.geteuid() == 0
status_file = open(cfg["status"], "w")                                        # before /tmp is hidden; CLOEXEC
libc = ctypes.CDLL(None, use_errno=True); UL = ctypes.c_ulong
def mount(src, dst, fstype, flags, data=None):
    return libc.mount(src, dst, fstype, UL(flags), data) == 0
net = root and libc.unshare(0x40000000) == 0                                  # CLONE_NEWNET
fs = root and libc.unshare(0x20000) == 0 and mount(b"none", b"/", None, 0x4000 | 0x40000)  # NEWNS; MS_REC|PRIVATE
if fs:
    opts = b"size=%dm,mode=1777" % cfg["tmpfs_mb"]
    for d in (b"/var/tmp", b"/dev/shm"):
        os.path.isdir(d) and mount(b"tmpfs", d, b"tmpfs", 6, opts)              # MS_NOSUID|MS_NODEV
    if mount(b"tmpfs", b"/tmp", b"tmpfs", 6, opts):
        os.mkdir("/tmp/sandbox")
        if mount(b".", b"/tmp/sandbox", None, 0x1000):                          # MS_BIND of the cwd
            os.chdir("/tmp/sandbox")
libc.prctl(36, 1, 0, 0, 0)                                                    # PR_SET_CHILD_SUBREAPER
def kill_all():                                                               # every process of the job uid
    if not root:                     # descendants only: kill our children (orphans reparent to us) till none
        for _ in range(10000):
            try: kids = open("/proc/self/task/%d/children" % os.getpid()).read().split()
            except OSError: kids = []
            if not kids: return
            for k in kids:
                try: os.kill(int(k), 9)
                except OSError: pass
            reap(False); time.sleep(0.001)
        return
    if os.fork() == 0:
        try:
            os.setgid(uid); os.setuid(uid)
            for _ in range(5):
                os.kill(-1, 9); time.sleep(0.002)
        except BaseException: pass
        os._exit(0)
def reap(block):
    while True:
        try:
            if os.waitpid(-1, 0 if block else os.WNOHANG)[0] == 0: return
        except ChildProcessError: return
child = 0
kill_all(); reap(True)                                                        # leftovers of a crashed caller
class Abort(Exception): pass
def on_signal(sig, frame): raise Abort(sig)
signal.signal(signal.SIGTERM, on_signal); signal.signal(signal.SIGALRM, on_signal)
status = {"net_isolated": net, "fs_isolated": fs}
exe = cfg["python"]
argv = [exe, "-I", "-S", "main.py"] if net else [exe, "-I", "-S", "-c", cfg["guard"]]
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.getcwd()}
try:
    signal.setitimer(signal.ITIMER_REAL, cfg["timeout"])
    child = os.fork()
    if child == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGALRM, signal.SIG_DFL)
            if not root: os.setpgid(0, 0)
            R = resource
            for res, v in ((R.RLIMIT_AS, cfg["memory_mb"] << 20), (R.RLIMIT_CPU, cfg["cpu"]), (R.RLIMIT_CORE, 0),
                           (R.RLIMIT_FSIZE, cfg["fsize_mb"] << 20), (R.RLIMIT_NOFILE, cfg["nofile"]),
                           (R.RLIMIT_NPROC, cfg["nproc"])):
                R.setrlimit(res, (v, v))
            if root:
                os.setgroups([]); os.setgid(uid); os.setuid(uid)
            libc.prctl(38, 1, 0, 0, 0)                                        # PR_SET_NO_NEW_PRIVS
            libc.prctl(1, 9, 0, 0, 0)                                         # PR_SET_PDEATHSIG = SIGKILL
            os.umask(0o077)
            os.execve(exe, argv, env)
        except BaseException as e:
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode()); os._exit(127)
    while True:
        pid, st = os.waitpid(-1, 0)
        if pid == child:
            status["exit"] = os.waitstatus_to_exitcode(st); break
except Abort as e:
    status["abort"] = "timeout" if e.args[0] == signal.SIGALRM else "aborted"
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGALRM, signal.SIG_IGN)
kill_all(); reap(root)
json.dump(status, status_file); status_file.close()
"""

# Best-effort network guard when no network namespace is available (not root). Weak: ctypes gets around it.
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
            return os.getuid()
        d = os.path.join(tempfile.gettempdir(), "dare-sandbox-uids")
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


def _kill_uid(uid: int) -> None:
    """Caller-side backstop if the supervisor itself had to be killed."""
    if IS_ROOT:
        code = ("import os,sys;u=int(sys.argv[1]);os.setgid(u);os.setuid(u)\n"
                "for _ in range(5):\n try: os.kill(-1,9)\n except OSError: break")
        subprocess.run([sys.executable, "-I", "-S", "-c", code, str(uid)], timeout=10, check=False)


def _reason(status: dict, stderr: str) -> str:
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


def run(job: CodeJob) -> CodeResult:
    t0 = time.monotonic()
    base = tempfile.mkdtemp(prefix="dare-sbx-")
    try:
        with _UidLease() as uid:
            os.chmod(base, 0o711)  # traversable, not listable: the status file stays private
            work = os.path.join(base, "work")
            os.mkdir(work, 0o700)
            with open(os.path.join(work, "main.py"), "w") as f:
                f.write(job.program)
            if IS_ROOT:
                os.chown(work, uid, uid)
            cfg = dict(uid=uid, python=PYTHON, guard=_GUARD, timeout=job.timeout, cpu=int(job.timeout) + 1,
                       memory_mb=job.memory_mb, fsize_mb=FSIZE_MB, nofile=NOFILE, nproc=NPROC, tmpfs_mb=TMPFS_MB,
                       status=os.path.join(base, "status"))
            with tempfile.TemporaryFile(dir=base) as fin:
                fin.write(job.stdin.encode())
                fin.seek(0)
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _SUPERVISOR, json.dumps(cfg)],
                                        stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                                        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True)
            out, over, forced = _collect(proc, t0 + job.timeout + GRACE)
            if forced:
                _kill_uid(uid)
            try:
                with open(cfg["status"]) as f:
                    status = json.load(f)
            except (OSError, ValueError):
                status = {}
        stdout, stderr = (b"".join(out[k]).decode(errors="replace") for k in ("out", "err"))
        reason = "output limit" if over else "timeout" if forced else _reason(status, stderr)
        return CodeResult(reason == "ok", reason, stdout, stderr, time.monotonic() - t0)
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
                for p in (-proc.pid, proc.pid):  # the supervisor's group, then the supervisor itself
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
