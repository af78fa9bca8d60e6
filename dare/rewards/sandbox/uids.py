"""Who runs a job: real root (a throw-away uid per running job, leased across every caller on the machine) or an
ordinary user (a fixed uid inside the job's user namespace)."""

import fcntl
import os
import random
import stat

UID_BASE, UID_COUNT = 3_000_000_000, 4096  # throw-away uids; nothing else on the machine should use them
LEASE_DIR = "/tmp/dare-sandbox-uids"  # fixed (not $TMPDIR): every caller on the machine must share it
USERNS_UID = 1000  # the program's uid inside a user namespace (not 0: no capabilities after exec)


def real_root() -> bool:
    """Root of the initial user namespace (not root inside a container's user namespace)."""
    try:
        with open("/proc/self/uid_map") as f:
            return os.geteuid() == 0 and f.read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return False


IS_ROOT = real_root()


class UidLease:
    """One throw-away uid per running job, exclusive across threads and processes (flock on a file of a root-only
    dir, removed when the job ends)."""

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
            path = os.path.join(d, str(n))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if not same_file(fd, path):  # its holder removed it between our open and our lock: not a lease
                os.close(fd)
                continue
            self.fd, self.path = fd, path
            return UID_BASE + n
        raise RuntimeError("all sandbox uids are busy")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:  # removed while still locked: a waiter that opened it sees another inode, retries
            os.unlink(self.path)
            os.close(self.fd)


def same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
