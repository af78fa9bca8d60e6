"""Helpers shared by the bench scripts (run as ``python bench/<script>.py``, so this folder is on sys.path)."""

import multiprocessing as mp


def rss_kib(field: str) -> int:
    """A field of /proc/self/status in KiB: ``VmRSS`` (now) or ``VmHWM`` (peak)."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def hidden_override(family: str, hidden: int) -> dict:
    """Config override for a wider tiny model (LLaDA keeps its OLMo field names)."""
    if not hidden:
        return {}
    return dict(d_model=hidden) if family == "llada" else dict(hidden_size=hidden)


def in_child(target, *args):
    """Run ``target(*args, queue)`` in a forked child (its own peak memory) and return what it put on the queue;
    a crashed child is an error, not a hang."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"{getattr(target, '__name__', target)}{args[1:]}: child failed with exit code {proc.exitcode}")
    return queue.get()
