"""Containment tests for dare.rewards.sandbox (its local executor): hostile programs fail cleanly and change nothing
outside.

Every hostile program runs in two modes: as the current user (root in CI: the root mode) and as an ordinary user
(the user-namespace mode; when the tests run as root, a fresh unprivileged uid, driving the sandbox from its own
process through tests/sandbox_driver.py). The victims are that caller's own: a 0700 home with a secret and a
precious file, its processes (the driving process and a bystander), its environment, a listener on 127.0.0.1.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from string import Template
from textwrap import dedent

import pytest

from dare.rewards import sandbox
from dare.rewards.sandbox import CodeJob, CodeResult, cgroups, local, run, run_batch

HERE = os.path.dirname(os.path.abspath(__file__))
USER_UID = 2_900_000_000 + os.getpid() % 1_000_000  # an unnamed, unprivileged uid, unique to this test session
SECRET = "TOPSECRET-" + str(random.randrange(10**9))


def program(source: str, **values) -> str:
    """``source`` dedented, with ``$name`` replaced by ``repr(values[name])``."""
    return Template(dedent(source).strip() + "\n").substitute({k: repr(v) for k, v in values.items()})


def usable_by_others(path: str) -> bool:
    parts = os.path.realpath(path).split(os.sep)
    return all(os.stat(os.sep.join(parts[:i]) or "/").st_mode & 0o001 for i in range(1, len(parts) + 1))


class Caller:
    """Who runs the sandbox ("caller": this process, root in CI; "user": an ordinary user's own process), and
    what is theirs."""

    def __init__(self, mode: str, home: str, tools: str | None = None, python: str | None = None):
        self.mode, self.home, self.tools, self.python = mode, home, tools, python
        self.uid = USER_UID if mode == "user" else os.getuid()
        self.isolation = "root" if mode == "caller" and sandbox.IS_ROOT else "userns"

    def run(self, program: str, timeout: float = 3.0, **kw) -> CodeResult:
        """Run a job; ``CALLER_PID`` in the program becomes the pid of the process calling the sandbox."""
        if self.mode == "caller":
            return run(CodeJob(program.replace("CALLER_PID", str(os.getpid())), timeout=timeout, **kw))
        env = {"PATH": "/usr/bin:/bin", "HOME": self.home, "DARE_TEST_SECRET": SECRET}
        driver = subprocess.Popen([self.python, f"{self.tools}/sandbox_driver.py", f"{self.tools}/sandbox"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=self.home, env=env, user=self.uid, group=self.uid, extra_groups=[])
        job = dict(program=program.replace("CALLER_PID", str(driver.pid)), timeout=timeout, **kw)
        out, err = driver.communicate(json.dumps(job), timeout=timeout + 30)
        assert driver.returncode == 0, f"the calling process died: {driver.returncode}\n{err}"  # e.g. killed
        result = json.loads(out)
        assert "unavailable" not in result, result["unavailable"]
        return CodeResult(**result)

    def spawn(self, *argv: str) -> subprocess.Popen:
        """A process of the caller's user that the job must not be able to touch."""
        kw = dict(user=self.uid, group=self.uid, extra_groups=[]) if self.mode == "user" else {}
        return subprocess.Popen(argv, **kw)


@pytest.fixture(scope="session")
def user_tools():
    """The sandbox package + the driver where the ordinary user can read them, and a python that user can run."""
    if not sandbox.IS_ROOT:
        pytest.skip("not root: the current user already is the ordinary user (the 'caller' leg runs as it)")
    python = next((p for p in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")
                   if os.path.exists(p) and usable_by_others(p)), None)
    if python is None:
        pytest.skip("no python3 that an unprivileged user can execute")
    probe = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "true"]
    if shutil.which("unshare") and subprocess.run(probe, user=USER_UID, group=USER_UID, extra_groups=[],
                                                  capture_output=True).returncode != 0:
        pytest.skip("this kernel gives ordinary users no user namespaces: the sandbox refuses them (tested below)")
    d = tempfile.mkdtemp(prefix="dare-sbx-test-tools-")
    shutil.copy(os.path.join(HERE, "sandbox_driver.py"), d)
    shutil.copytree(os.path.dirname(sandbox.__file__), os.path.join(d, "sandbox"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _, files in os.walk(d):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    yield d, python
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["caller", "user"])
def caller(request, monkeypatch):
    """The caller, with a 0700 home next to the tests (like a repository checkout) holding its private files."""
    tools, python = request.getfixturevalue("user_tools") if request.param == "user" else (None, None)
    where = HERE if usable_by_others(HERE) else "/var/tmp"
    home = tempfile.mkdtemp(prefix=".sandbox-test-home-", dir=where)
    c = Caller(request.param, home, tools, python)
    with open(os.path.join(home, "secret.txt"), "w") as f:
        f.write(SECRET)
    os.chmod(os.path.join(home, "secret.txt"), 0o600)
    with open(os.path.join(home, "precious.txt"), "w") as f:
        f.write("precious")
    if c.mode == "user":
        for p in (home, os.path.join(home, "secret.txt"), os.path.join(home, "precious.txt")):
            os.chown(p, c.uid, c.uid)
    os.chmod(home, 0o700)
    monkeypatch.setenv("DARE_TEST_SECRET", SECRET)
    yield c
    shutil.rmtree(home, ignore_errors=True)


def procs_with(token: str) -> list[int]:
    """Pids of live processes whose command line contains ``token``."""
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit():
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if token in f.read().decode(errors="replace"):
                        found.append(int(p))
        except OSError:
            pass
    return found


def test_pass_and_stdin(caller):
    r = caller.run("import sys\nprint('got', sys.stdin.read().strip())", stdin="hello\n")
    assert r.passed and r.reason == "ok" and r.stdout == "got hello\n", r
    budgets = ("cgroup-v2", "cgroup-v1", "watchdog") if caller.isolation == "root" else ("watchdog",)
    assert r.isolation in [f"{caller.isolation}+{b}" for b in budgets], r.isolation


def test_failing_assert(caller):
    r = caller.run("assert 1 + 1 == 3, 'wrong'")
    assert not r.passed and "AssertionError" in r.reason and "wrong" in r.reason, r


def test_early_exit_is_reported_as_is():
    """The sandbox reports the exit status; that the tests all ran is the code reward's business (its token)."""
    assert run(CodeJob("import os\nos._exit(0)\nassert False")).passed


def test_timeouts(caller):
    for program in ("while True: pass", "import time\nwhile True: time.sleep(1)"):  # CPU and wall clock
        t = time.monotonic()
        r = caller.run(program, timeout=1)
        assert not r.passed and r.reason == "timeout", r
        assert time.monotonic() - t < 1 + 2


def test_memory_bomb(caller):
    r = caller.run("x = bytearray(4 << 30)", memory_mb=256)
    assert not r.passed and r.reason == "memory", r
    r = caller.run("x = []\nwhile True: x.append(' ' * 10**7)", memory_mb=256)
    assert not r.passed and r.reason == "memory", r


SPLIT_BOMB = program("""
    import os, time
    kids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            x = bytearray(600 << 20)
            time.sleep(0.5)
            os._exit(0)
        kids.append(pid)
    codes = [os.waitpid(k, 0)[1] for k in kids]
    print('ALL OK' if not any(codes) else codes)
""")


def test_memory_bomb_split_over_children(caller):
    """4 x 600 MB in 4 processes: each is under the budget, together they are far over it."""
    r = caller.run(SPLIT_BOMB, memory_mb=1024, timeout=5)
    assert not r.passed and r.reason == "memory" and "ALL OK" not in r.stdout, r


def test_watchdog_when_no_cgroup(monkeypatch):
    """Without a usable cgroup (none, or cgroup v2 that cannot delegate) the job's init enforces the budget."""
    monkeypatch.setattr(cgroups, "mounts", dict)
    r = run(CodeJob(SPLIT_BOMB, memory_mb=1024, timeout=5))
    assert not r.passed and r.reason == "memory" and r.isolation.endswith("+watchdog"), r


def test_fork_bomb_is_bounded_and_cleaned_up(caller):
    token = f"forkbomb-{random.randrange(10**9)}"
    prog = program("""
        import os, sys, time
        if len(sys.argv) < 2:  # the token into every process's command line
            os.execv(sys.executable, [sys.executable, '-I', '-S', 'main.py', $token])
        n = 0
        while n < 10000:
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
        print('forked', n, flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, token=token)
    t = time.monotonic()
    r = caller.run(prog, timeout=1.5)
    assert not r.passed and r.reason == "timeout" and time.monotonic() - t < 1.5 + 3, r
    assert r.stdout.startswith("forked ") and int(r.stdout.split()[1]) < sandbox.NPROC, r
    assert procs_with(token) == []
    assert caller.run("print(1)").passed  # the machine (and the uid pool) is still usable


DAEMON = program("""
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp('sleep', ['sleep', 'TOKEN'])
        os._exit(0)
    time.sleep(0.3)
    print(os.getuid())
""")


def test_escaped_daemon_is_killed(caller):
    token = f"{60 + random.random():.9f}"  # sleep's argument, recognisable in its command line
    r = caller.run(DAEMON.replace("TOKEN", token))
    assert r.passed, r
    assert procs_with(token) == []


def test_caller_files_out_of_reach(caller):
    home = caller.home
    prog = program("""
        import json, os, shutil
        H, out = $home, {}
        def attempt(name, fn):
            try:
                fn()
                out[name] = 'done'
            except Exception as e:
                out[name] = type(e).__name__
        attempt('read', lambda: print(open(H + '/secret.txt').read()))
        attempt('list', lambda: print(os.listdir(H)))
        attempt('write', lambda: open(H + '/pwned', 'w').write('x'))
        attempt('delete', lambda: os.remove(H + '/precious.txt'))
        attempt('rmtree', lambda: shutil.rmtree(H))
        attempt('chmod', lambda: os.chmod(H, 0o777))
        attempt('etc', lambda: open('/etc/dare-pwned', 'w').write('x'))
        attempt('python', lambda: open(os.path.dirname(os.__file__) + '/dare-pwned.py', 'w').write('x'))
        print(json.dumps(out))
    """, home=home)
    r = caller.run(prog)
    assert r.passed, r
    outcome = json.loads(r.stdout.splitlines()[-1])
    assert "done" not in outcome.values() and SECRET not in r.stdout + r.stderr, outcome
    assert sorted(os.listdir(home)) == ["precious.txt", "secret.txt"]
    with open(os.path.join(home, "precious.txt")) as f:
        assert f.read() == "precious" and os.stat(home).st_mode & 0o777 == 0o700
    assert not os.path.exists("/etc/dare-pwned")


def test_world_writable_tmp_is_private(caller):
    name = f"/tmp/dare-sbx-junk-{os.getpid()}"
    r = caller.run(f"open({name!r}, 'w').write('x')\nimport os\nassert os.path.exists({name!r})")
    assert r.passed, r  # writable inside the job (its own tmpfs) ...
    assert not os.path.exists(name)  # ... but nothing appears on the host


def test_signals_stay_inside(caller):
    """kill(-1), the parent, the caller and a bystander process of the caller's user: nothing outside dies."""
    bystander = caller.spawn("sleep", "30")
    try:
        prog = program("""
            import json, os, signal
            out = {'procs': sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}
            targets = {'bystander': $bystander, 'caller': CALLER_PID, 'parent': os.getppid(), 'all': -1}
            for name, pid in targets.items():
                try:
                    os.kill(pid, signal.SIGKILL)
                    out[name] = 'sent'
                except OSError as e:
                    out[name] = type(e).__name__
            print(json.dumps(out))
        """, bystander=bystander.pid)
        r = caller.run(prog)  # (when the caller dies, run() raises or pytest itself is gone)
        assert r.passed, r
        out = json.loads(r.stdout)
        assert out["bystander"] == out["caller"] == "ProcessLookupError", out  # not even visible
        assert max(out["procs"]) < 10, out  # the job's own pid namespace
        time.sleep(0.1)
        assert bystander.poll() is None, "the caller's process was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_no_network_to_local_listener(caller):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        prog = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')"
        r = caller.run(prog)
        assert not r.passed and "CONNECTED" not in r.stdout, r
        srv.settimeout(0.2)
        with pytest.raises(OSError):  # nothing ever reached the listener
            srv.accept()
    r = caller.run("import socket\nprint(sorted(n for _, n in socket.if_nameindex()))")
    assert r.passed and r.stdout.strip() == "['lo']", r


def test_environment_not_visible(caller):
    r = caller.run("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'])")
    assert r.passed, r
    assert "DARE_TEST_SECRET" not in r.stdout and SECRET not in r.stdout and caller.home not in r.stdout, r


def test_huge_output_bounded(caller):
    t = time.monotonic()
    r = caller.run("while True: print('x' * 10**7)", timeout=10)
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


def test_concurrent_processes():
    """Several processes, each with several threads, share the machine's uids and cgroups without mixing up jobs."""
    code = ("import sys\nfrom dare.rewards.sandbox import CodeJob, run_batch\nk = int(sys.argv[1])\n"
            "rs = run_batch([CodeJob(f'print({k} * 100 + {i})') for i in range(4)], max_workers=4)\n"
            "assert [r.stdout for r in rs] == [f'{k * 100 + i}\\n' for i in range(4)], rs\nprint('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(HERE)) for k in range(3)]
    assert [p.communicate(timeout=60)[0] for p in procs] == ["ok\n"] * 3


def test_uid_leases_are_exclusive_and_leave_no_files():
    """Threads racing for a few uids never hold the same one at once, and every lease file goes with its job."""
    if not sandbox.IS_ROOT:
        pytest.skip("uid leases are taken as root only")
    from concurrent.futures import ThreadPoolExecutor

    from dare.rewards.sandbox import uids
    before = set(os.listdir(uids.LEASE_DIR)) if os.path.isdir(uids.LEASE_DIR) else set()
    held, clashes = set(), []

    def lease(_):
        with uids.UidLease() as uid:
            if uid in held:
                clashes.append(uid)
            held.add(uid)
            time.sleep(0.001)
            held.discard(uid)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uids, "UID_COUNT", 16)  # 8 threads for 16 uids: many attempts meet a held or removed file
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lease, range(400)))
    assert clashes == []
    assert set(os.listdir(uids.LEASE_DIR)) <= before


def test_cgroups_are_removed(monkeypatch):
    if not sandbox.IS_ROOT:
        pytest.skip("cgroups need root")
    made, init = [], cgroups.Cgroup.__init__

    def recording_init(self, *args):
        init(self, *args)
        made.append(list(self.dirs))
    monkeypatch.setattr(cgroups.Cgroup, "__init__", recording_init)
    run(CodeJob("import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(60)"))
    assert made and all(not os.path.exists(d) for dirs in made for d in dirs), made


def test_unsafe_mode_as_root_drops_the_uid_and_cleans_up():
    if not sandbox.IS_ROOT:
        pytest.skip("the uid drop needs root")
    token = f"{60 + random.random():.9f}"
    r = local.execute(CodeJob(DAEMON.replace("TOKEN", token)), unsafe=True)
    assert r.passed and int(r.stdout) >= sandbox.UID_BASE and r.isolation.startswith("unsafe+"), r
    assert procs_with(token) == []


def test_refuses_without_isolation_unless_opted_in(user_tools):
    """Inside a user namespace that may not create more (as in a locked-down container), nothing isolates: the
    sandbox refuses, naming the opt-in; with it, the job runs unsafely and says so."""
    if not shutil.which("unshare"):
        pytest.skip("needs util-linux unshare")
    tools, _ = user_tools
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && "
              f'exec "{sys.executable}" {tools}/sandbox_driver.py {tools}/sandbox')
    results = []
    for unsafe in (False, True):
        job = json.dumps(dict(program="print('ran')", timeout=3, unsafe=unsafe))
        p = subprocess.run(["unshare", "-U", "-r", "sh", "-c", script], input=job, capture_output=True, text=True,
                           timeout=30, env={"PATH": "/usr/bin:/bin"})
        assert p.returncode == 0, p.stderr
        results.append(json.loads(p.stdout))
    assert "DARE_SANDBOX_UNSAFE=1" in results[0]["unavailable"], results[0]
    assert results[1]["passed"] and results[1]["stdout"] == "ran\n" and results[1]["isolation"] == "unsafe+rlimit"


def test_code_result_fields():
    assert [f.name for f in dataclasses.fields(CodeResult)][:5] == ["passed", "reason", "stdout", "stderr", "seconds"]


def test_executors_are_chosen_by_name(monkeypatch):
    """The executor seam: a registered executor runs the jobs it is named for (argument or DARE_SANDBOX_EXECUTOR);
    an unknown name is refused naming the known ones; the default is the local one."""
    seen = []

    @sandbox.register_executor("recording")
    def recording(job, allow_unsafe):
        seen.append((job.program, allow_unsafe))
        return CodeResult(True, "ok", "", "", 0.0, "recording")

    try:
        assert run(CodeJob("print(1)"), executor="recording").isolation == "recording"
        monkeypatch.setenv("DARE_SANDBOX_EXECUTOR", "recording")
        monkeypatch.setenv("DARE_SANDBOX_UNSAFE", "1")
        assert [r.isolation for r in run_batch([CodeJob("a"), CodeJob("b")])] == ["recording"] * 2
        assert seen == [("print(1)", False), ("a", True), ("b", True)]
        with pytest.raises(ValueError, match="unknown sandbox executor 'remote'; known: .*local.*recording"):
            run(CodeJob("print(1)"), executor="remote")
        monkeypatch.delenv("DARE_SANDBOX_EXECUTOR")
        monkeypatch.delenv("DARE_SANDBOX_UNSAFE")
        assert run(CodeJob("print(1)")).stdout == "1\n"
    finally:
        sandbox.EXECUTORS.pop("recording")
