"""What a sandbox job is, what it returns, the refusal when nothing can isolate it, and the executors that run jobs
(registered by name; executor ``name`` lives in this package's module ``name.py``)."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass


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


Executor = Callable[[CodeJob, bool], CodeResult]  # (job, allow_unsafe) -> result
EXECUTORS: dict[str, Executor] = {}


def register_executor(name: str):
    def add(fn: Executor) -> Executor:
        if name in EXECUTORS and EXECUTORS[name] is not fn:
            raise ValueError(f"sandbox executor {name!r} is already registered")
        EXECUTORS[name] = fn
        return fn

    return add


def get_executor(name: str) -> Executor:
    """The executor registered as ``name``, imported from this package's module of that name on first use."""
    if name not in EXECUTORS:
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ImportError:
            pass
    if name not in EXECUTORS:
        raise ValueError(f"unknown sandbox executor {name!r}; known: {', '.join(sorted(EXECUTORS))}")
    return EXECUTORS[name]
