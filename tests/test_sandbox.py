"""Containment tests for dare.rewards.sandbox (hostile programs must fail cleanly and change nothing outside)."""
from __future__ import annotations

import os
import socket
import tempfile
import time

import pytest

from dare.rewards import sandbox
from dare.rewards.sandbox import CodeJob, run, run_batch

root_only = pytest.mark.skipif(
    not sandbox.IS_ROOT, reason="uid drop, RLIMIT_NPROC and namespaces need root; non-root mode is best effort only")


def go(program: str, timeout: float = 3.0, **kw):
    return run(CodeJob(program, timeout=timeout, **kw))


def sandbox_procs() -> list[int]:
    """Pids of processes running as a sandbox uid (or nobody)."""
    uids = set(range(sandbox.UID_BASE, sandbox.UID_BASE + sandbox.UID_COUNT)) | {65534}
    pids = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and os.stat(f"/proc/{p}").st_uid in uids:
                pids.append(int(p))
        except FileNotFoundError:
            pass
    return pids


@pytest.fixture(params=["repo", "tmp"])
def private_dir(request):
    """A 0700 directory of the test user (root), like the caller's checkpoints or data. Under /tmp the job
    does not even see it (own tmpfs); next to the tests it sees it, so the uid drop is what protects it."""
    where = os.path.dirname(os.path.abspath(__file__)) if request.param == "repo" else None
    with tempfile.TemporaryDirectory(dir=where, prefix=".sandbox-test-") as d:
        os.chmod(d, 0o700)
        yield d


def denied(r, path: str) -> bool:
    """Failed, and for a visible path (not under the job's private /tmp) with PermissionError."""
    hidden = path.startswith(tempfile.gettempdir() + "/")
    return not r.passed and ("PermissionError" in r.reason or (hidden and "FileNotFoundError" in r.reason))


def test_pass_and_stdin():
    r = go("import sys\nprint('got', sys.stdin.read().strip())", stdin="hello\n")
    assert r.passed and r.reason == "ok" and r.stdout == "got hello\n", r


def test_failing_assert():
    r = go("assert 1 + 1 == 3, 'wrong'")
    assert not r.passed and "AssertionError" in r.reason and "wrong" in r.reason, r


def test_infinite_loop_times_out():
    t = time.monotonic()
    r = go("while True: pass", timeout=2)
    assert not r.passed and r.reason == "timeout", r
    assert time.monotonic() - t < 2 + 2


def test_sleeping_loop_times_out():  # wall clock, not only RLIMIT_CPU
    t = time.monotonic()
    r = go("import time\nwhile True: time.sleep(1)", timeout=2)
    assert r.reason == "timeout" and time.monotonic() - t < 4, r


@root_only
def test_fork_bomb_contained():
    t = time.monotonic()
    r = go("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=2)
    assert not r.passed and time.monotonic() - t < 6, r
    assert sandbox_procs() == []
    assert go("print(1)").passed  # the machine (and the uid pool) is still usable


@root_only
def test_escaped_daemon_is_killed():
    prog = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    r = go(prog)
    assert r.passed, r
    assert sandbox_procs() == []


def test_memory_bomb():
    r = go("x = bytearray(4 << 30)", memory_mb=256)
    assert not r.passed and r.reason in ("memory", "error: MemoryError"), r
    r = go("x = []\nwhile True: x.append(' ' * 10**7)", memory_mb=256)
    assert not r.passed and r.reason == "memory", r


@root_only
def test_cannot_write_outside(private_dir):
    target = os.path.join(private_dir, "pwned")
    r = go(f"open({target!r}, 'w').write('x')")
    assert denied(r, target), r
    assert not os.path.exists(target)


@root_only
def test_world_writable_tmp_is_private():
    name = f"/tmp/dare-sbx-junk-{os.getpid()}"
    r = go(f"open({name!r}, 'w').write('x')\nimport os\nassert os.path.exists({name!r})")
    assert r.passed, r  # writable inside the job (its own tmpfs) ...
    assert not os.path.exists(name)  # ... but nothing appears on the host


@root_only
def test_cannot_delete_caller_file(private_dir):
    victim = os.path.join(private_dir, "keep.txt")
    with open(victim, "w") as f:
        f.write("precious")
    os.chmod(victim, 0o644)
    r = go(f"import os, shutil\nos.remove({victim!r})")
    assert denied(r, victim), r
    r = go(f"import shutil\nshutil.rmtree({private_dir!r})")
    assert denied(r, victim), r
    assert open(victim).read() == "precious"


@root_only
def test_cannot_read_secret_file(private_dir):
    secret = os.path.join(os.path.dirname(os.path.abspath(__file__)), f".dare-secret-{os.getpid()}")  # o+x dir
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"TOPSECRET")
        os.close(fd)
        tmp_secret = os.path.join(private_dir, "key")  # and one under a 0700 dir
        with open(tmp_secret, "w") as f:
            f.write("TOPSECRET")
        for path in (secret, tmp_secret):
            r = go(f"print(open({path!r}).read())")
            assert denied(r, path) and "TOPSECRET" not in r.stdout, r
        assert go("print(open('/etc/hostname').read())").passed  # world-readable system files are fine
    finally:
        os.unlink(secret)


def test_environment_not_visible(monkeypatch):
    monkeypatch.setenv("DARE_TEST_SECRET", "hunter2")
    r = go("import os\nprint(sorted(os.environ))\nprint('hunter2' in repr(os.environ))")
    assert r.passed, r
    assert "DARE_TEST_SECRET" not in r.stdout and r.stdout.splitlines()[-1] == "False"


def test_no_network_to_local_listener():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        r = go(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')")
        assert not r.passed and "CONNECTED" not in r.stdout, r
        srv.settimeout(0.2)
        with pytest.raises(OSError):  # nothing ever reached the listener
            srv.accept()


@root_only
def test_network_namespace_is_empty():
    r = go("import socket\nprint(sorted(n for _, n in socket.if_nameindex()))")
    assert r.passed and r.stdout.strip() == "['lo']", r


def test_killing_parent_does_not_kill_caller():
    r = go("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')")
    assert isinstance(r.seconds, float)  # we are here: the caller survived and got a result
    if sandbox.IS_ROOT:
        assert not r.passed and "PermissionError" in r.reason, r
    r = go("import os, signal\nos.kill(-1, signal.SIGKILL)")  # "kill everything I may" (never the caller)
    assert isinstance(r.seconds, float)


def test_huge_output_bounded():
    t = time.monotonic()
    r = go("while True: print('x' * 10**8)", timeout=10)
    assert not r.passed and r.reason == "output limit", r
    assert len(r.stdout) <= sandbox.OUTPUT_CAP and time.monotonic() - t < 10


def test_batch_parallel_and_ordered():
    jobs = [CodeJob(f"print({i})", timeout=2) for i in range(6)]
    jobs.insert(2, CodeJob("while True: pass", timeout=2))
    jobs.insert(5, CodeJob("import time\ntime.sleep(100)", timeout=2))
    jobs.append(CodeJob("assert False", timeout=2))
    t = time.monotonic()
    rs = run_batch(jobs, max_workers=4)
    assert time.monotonic() - t < 8, "not parallel"
    reasons = [r.reason for r in rs]
    assert reasons[2] == reasons[5] == "timeout" and reasons[-1] == "error: AssertionError", reasons
    assert [r.stdout.strip() for i, r in enumerate(rs) if i not in (2, 5, 8)] == [str(i) for i in range(6)]
