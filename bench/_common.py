"""Helpers shared by the bench scripts (run as ``python bench/<script>.py``, so this folder is on sys.path)."""


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
