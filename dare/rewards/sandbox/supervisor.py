"""The supervisor of one sandbox job: ``python -I -S supervisor.py CONFIG`` (CONFIG: the JSON that ``local.py``
builds), run in its own session as the caller's user. It takes the job's namespaces (a user namespace first
without real root), forks the job's init (pid 1 of the job's pid namespace: builds its file system, starts the
program, reaps orphans, watches memory without a cgroup) and kills it at the timeout. Standard library only: it
runs before anything of the job exists, from wherever the sandbox package was copied. Status goes to the file
``cfg["status"]`` as JSON lines: ``setup_error``, ``exit``, ``memory``, ``abort``, ``mode``.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

# mount(2) flags and the syscalls ctypes reaches by number
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWUTS = 0x40000000, 0x20000000, 0x08000000, 0x04000000
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000  # mount_setattr: Linux >= 5.12
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38

# The network guard of unsafe mode (no network namespace). Weak: ctypes or _socket get around it.
GUARD = """
import socket, _socket, runpy, sys
def _no_net(*a, **k): raise PermissionError("network disabled in sandbox")
socket.socket = socket.create_connection = socket.socketpair = _socket.socket = _no_net
sys.argv = ["main.py"]; del socket, _socket
runpy.run_path("main.py", run_name="__main__")
"""

libc = ctypes.CDLL(None, use_errno=True)
cfg, safe, uid, status_fd = {}, True, 0, -1  # set by configure()


def configure(text: str):
    global cfg, safe, uid, status_fd
    cfg = json.loads(text)
    safe, uid = not cfg["unsafe"], cfg["uid"]
    status_fd = os.open(cfg["status"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)


def report(**fields):
    os.write(status_fd, (json.dumps(fields) + "\n").encode())


def ok(ret: int, what: str):
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(src, dst, fstype=None, flags=0, data=None):
    encode = lambda s: s and s.encode()
    ok(libc.mount(encode(src), encode(dst), encode(fstype), ctypes.c_ulong(flags), encode(data)), "mount " + dst)


def readonly(path: str, recursive: bool = False):
    """Make ``path`` read-only and nosuid: mount_setattr (recursively) where the kernel has it, else a remount of
    this mount only, keeping its other flags."""
    attr = (ctypes.c_uint64 * 4)(RDONLY | NOSUID, 0, 0, 0)  # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
    flags = AT_RECURSIVE if recursive else 0
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, attr, 32) != 0:
        kept = os.statvfs(path).f_flag
        mount(None, path, None, REMOUNT | BIND | RDONLY | NOSUID | (kept & 0xc0e) | (1 << 21 if kept & 4096 else 0))


def copy(src: str, dst: str):
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())


def build_root(root: str):
    """The job's file system, in a new mount namespace (we are its root): a fresh tmpfs with read-only binds of the
    system and the interpreter, a minimal /dev, size-limited /tmp and /dev/shm, a fresh /proc; then pivot_root."""
    os.umask(0o022)
    ok(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "mode=755,size=1m")
    for path in cfg["binds"]:
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        else:
            os.makedirs(root + path)
            mount(path, root + path, None, BIND | REC)
            readonly(root + path, recursive=True)
    os.mkdir(root + "/dev")
    mount("tmpfs", root + "/dev", "tmpfs", NOSUID | NOEXEC, "mode=755,size=64k")
    for device in ("null", "zero", "full", "random", "urandom"):
        open(root + "/dev/" + device, "w").close()
        mount("/dev/" + device, root + "/dev/" + device, None, BIND)
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", root + "/dev/" + name)
    os.symlink("/proc/self/fd", root + "/dev/fd")
    for path in ("/dev/shm", "/tmp"):
        os.mkdir(root + path)
        mount("tmpfs", root + path, "tmpfs", NOSUID | NODEV, f"mode=1777,size={cfg['tmpfs_mb']}m")
    readonly(root + "/dev")
    os.mkdir(root + "/tmp/sandbox", 0o700)
    copy(cfg["work"] + "/main.py", root + "/tmp/sandbox/main.py")
    if cfg["real_root"]:
        os.chown(root + "/tmp/sandbox", uid, uid)
        os.chown(root + "/tmp/sandbox/main.py", uid, uid)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)  # we are pid 1 of the job's pid namespace
    os.chdir(root)
    ok(libc.pivot_root(b".", b"."), "pivot_root")
    ok(libc.umount2(b".", 2), "umount old root")  # MNT_DETACH
    os.chdir("/")
    readonly("/")


def anon_rss() -> int:
    """Anonymous resident bytes of every process of the pid namespace but its init."""
    pages = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and pid != "1":
                with open(f"/proc/{pid}/statm") as f:
                    fields = f.read().split()
                pages += int(fields[1]) - int(fields[2])
        except (OSError, IndexError, ValueError):
            pass
    return pages * os.sysconf("SC_PAGE_SIZE")


def start_program(procs: list[int]):
    """In the forked child: join the job's cgroups, set the limits, drop the user, exec the program."""
    exe, cwd = (cfg["python"], "/tmp/sandbox") if safe else (cfg["unsafe_python"], cfg["work"])
    argv = [exe, "-I", "main.py"] if safe else [exe, "-I", "-c", GUARD]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd}
    try:
        for fd in procs:
            os.write(fd, b"%d" % os.getpid())
        limits = ((resource.RLIMIT_AS, cfg["as_mb"] << 20), (resource.RLIMIT_CPU, cfg["cpu"]),
                  (resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, cfg["fsize_mb"] << 20),
                  (resource.RLIMIT_NOFILE, cfg["nofile"]), (resource.RLIMIT_NPROC, cfg["nproc"]))
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        if cfg["real_root"]:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.umask(0o077)
        os.chdir(cwd)
        os.execve(exe, argv, env)
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(127)


def init():
    """The job's pid 1 (a plain child in unsafe mode): build the file system, start the program, reap every
    process until the program exits; without a memory cgroup, kill the job when its memory passes the budget."""
    try:
        for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        procs = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cfg["cgroup_procs"]]
        if safe:
            build_root(cfg["root"])
    except BaseException as e:
        report(setup_error=f"{type(e).__name__}: {e}")
        os._exit(1)
    child = os.fork()
    if child == 0:
        start_program(procs)
    watchdog, status = safe and cfg["watchdog"], {}
    while True:
        pid, wait_status = os.waitpid(-1, os.WNOHANG if watchdog else 0)
        if pid == child:
            status["exit"] = os.waitstatus_to_exitcode(wait_status)
            break
        if pid == 0:
            if not status and anon_rss() > cfg["memory_mb"] << 20:
                status["memory"] = True
                os.kill(-1, signal.SIGKILL)  # every process of the job but us
            time.sleep(0.01)
    report(**status)
    os._exit(0)  # as pid 1: the kernel kills whatever is left in the namespace


def enter_namespaces():
    """The job's user namespace (without real root: we map our own uid to the job's) and its network, pid, IPC and
    UTS namespaces."""
    if safe and not cfg["real_root"]:
        # our ids before the unshare: inside, until the maps are written, they read as the overflow id
        maps = (("setgroups", "deny"), ("uid_map", f"{uid} {os.geteuid()} 1"), ("gid_map", f"{uid} {os.getegid()} 1"))
        ok(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
        for name, text in maps:
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
    if safe:
        ok(libc.unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare(net, pid, ipc, uts)")


def kill_descendants():
    """Unsafe mode: kill our children (orphans reparent to us, the subreaper) until none is left."""
    for _ in range(10000):
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as f:
                kids = f.read().split()
        except OSError:
            kids = []
        if not kids:
            return
        for kid in kids:
            try:
                os.kill(int(kid), signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


class Abort(Exception):
    pass


def on_signal(sig, frame):
    raise Abort(sig)


def main():
    try:
        enter_namespaces()
    except OSError as e:
        report(setup_error=str(e))
        sys.exit()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    status, child = {"mode": ("root" if cfg["real_root"] else "userns") if safe else "unsafe"}, 0
    try:
        signal.setitimer(signal.ITIMER_REAL, cfg["timeout"])
        child = os.fork()
        if child == 0:
            try:
                init()
            finally:
                os._exit(1)  # never back into the supervisor's code
        while os.waitpid(-1, 0)[0] != child:
            pass
        child = 0
    except Abort as e:
        status["abort"] = "timeout" if e.args[0] == signal.SIGALRM else "aborted"
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    if child:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    if not safe:
        kill_descendants()
    report(**status)


if __name__ == "__main__":
    configure(sys.argv[1])
    main()
