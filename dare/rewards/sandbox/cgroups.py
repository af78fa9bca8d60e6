"""The job's memory and process budget, shared by its whole process tree (root only): a cgroup v2 where its root
can delegate both controllers, else v1 (nested in this process's cgroups), else none (the job's init watches memory
instead)."""

import os
import signal
import time

from .uids import IS_ROOT


def mounts() -> dict[str, tuple[str, str]]:
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


class Cgroup:
    """The job's memory + pids budget, shared by its whole process tree (root only): cgroup v2 if its root can
    delegate both controllers, else v1 (nested in this process's cgroups), else none (kind "")."""

    def __init__(self, name: str, memory: int, pids: int):
        self.dirs, self.kind, self.memory = [], "", False
        try:
            m = mounts() if IS_ROOT else {}
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
