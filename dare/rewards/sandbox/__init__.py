"""Run untrusted, model-written Python programs (the code reward) contained: ``run(CodeJob(program)) -> CodeResult``.

An executor runs the job: ``local`` (``local.py``: namespaces, a cgroup or a memory watchdog, rlimits, on this
machine) unless ``DARE_SANDBOX_EXECUTOR`` or ``run(..., executor=)`` names another; executor ``name`` is the
module ``name.py`` of this package, registered with ``@register_executor(name)``, so a remote service is one new
file. What each isolation mode contains, and what it does not, is in docs/sandbox.md ("Code sandbox"). Without any
isolation the local executor refuses (``SandboxUnavailable``) unless ``DARE_SANDBOX_UNSAFE=1`` or
``ALLOW_UNSAFE = True``. Standard library only, relative imports only: the tests run a copy as an ordinary user.
"""

import os
from concurrent.futures import ThreadPoolExecutor

from .job import EXECUTORS, CodeJob, CodeResult, SandboxUnavailable, get_executor, register_executor
from .local import NPROC, OUTPUT_CAP
from .uids import IS_ROOT, UID_BASE

ALLOW_UNSAFE = False  # run without isolation when none is possible (also DARE_SANDBOX_UNSAFE=1)


def run(job: CodeJob, executor: str | None = None) -> CodeResult:
    name = executor or os.environ.get("DARE_SANDBOX_EXECUTOR") or "local"
    return get_executor(name)(job, ALLOW_UNSAFE or os.environ.get("DARE_SANDBOX_UNSAFE") == "1")


def run_batch(jobs: list[CodeJob], max_workers: int | None = None) -> list[CodeResult]:
    """Run jobs in parallel (threads driving subprocesses); results in the order of ``jobs``."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers or min(len(jobs), max(2, os.cpu_count() or 2))) as ex:
        return list(ex.map(run, jobs))


__all__ = ["ALLOW_UNSAFE", "EXECUTORS", "IS_ROOT", "NPROC", "OUTPUT_CAP", "UID_BASE", "CodeJob", "CodeResult",
           "SandboxUnavailable", "get_executor", "register_executor", "run", "run_batch"]
