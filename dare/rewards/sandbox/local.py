"""The ``local`` executor: each job runs as ``python -I main.py`` on this machine, under ``supervisor.py`` (its own
session, namespaces, wall-clock timeout) and the job's init; what each mode isolates is in ``__init__.py``."""

import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

from . import cgroups
from .job import CodeJob, CodeResult, SandboxUnavailable, register_executor
from .uids import IS_ROOT, UidLease

OUTPUT_CAP = 1 << 20  # bytes kept (and allowed) per stream
NPROC, NOFILE, FSIZE_MB, TMPFS_MB = 64, 256, 64, 64
GRACE = 2.0  # seconds past the timeout before the caller force-kills the supervisor
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")  # read-only in the job
PYTHON = sys.executable  # the job's interpreter; its installation is bound read-only into the job
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
log = logging.getLogger(__name__)


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


@register_executor("local")
def run(job: CodeJob, allow_unsafe: bool = False) -> CodeResult:
    """The job isolated as this machine allows; without isolation only with ``allow_unsafe``."""
    result = execute(job, unsafe=False)
    if isinstance(result, CodeResult):
        return result
    if not allow_unsafe:
        raise SandboxUnavailable(
            f"cannot isolate the program ({result}); the sandbox needs root or unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, or a container that allows "
            "unshare). Set DARE_SANDBOX_UNSAFE=1 (or dare.rewards.sandbox.ALLOW_UNSAFE = True) to run "
            "model-written code WITHOUT isolation.")
    if "unsafe" not in _warned:
        _warned.add("unsafe")
        log.warning("sandbox: no isolation possible (%s); running model-written code UNSAFELY (opted in)", result)
    return execute(job, unsafe=True)


def execute(job: CodeJob, unsafe: bool) -> CodeResult | str:
    """The job's result, or the reason isolation failed (a string) before the program ran."""
    t0 = time.monotonic()
    base = tempfile.mkdtemp(prefix="dare-sbx-")
    try:
        with UidLease() as uid:
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
            cg = cgroups.Cgroup(f"dare-sbx-{uid}", job.memory_mb << 20, NPROC)
            try:
                cfg = dict(uid=uid, real_root=IS_ROOT, unsafe=unsafe, python=python, binds=_binds(python),
                           unsafe_python=unsafe and _unsafe_python(), root=os.path.join(base, "root"), work=work,
                           status=status_path, timeout=job.timeout, cpu=int(job.timeout) + 1,
                           memory_mb=job.memory_mb, as_mb=job.memory_mb * (4 if cg.memory else 1),
                           watchdog=not cg.memory, cgroup_procs=cg.procs, fsize_mb=FSIZE_MB, nofile=NOFILE,
                           nproc=NPROC, tmpfs_mb=TMPFS_MB)
                with tempfile.TemporaryFile(dir=base) as fin:
                    fin.write(job.stdin.encode())
                    fin.seek(0)
                    proc = subprocess.Popen([sys.executable, "-I", "-S", SUPERVISOR, json.dumps(cfg)],
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
