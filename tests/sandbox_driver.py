"""Run one sandbox job the way an ordinary user's training process would, for tests/test_sandbox.py.

Usage: ``python sandbox_driver.py /path/to/sandbox`` (a copy of the package) with a JSON job on stdin ({"program",
"timeout", "memory_mb", "stdin"}; optional "unsafe": allow unsafe execution); prints the CodeResult as JSON, or
{"unavailable": message} when the sandbox refuses. Imports nothing but the standard library and the sandbox package
itself, so that any python3 the user can execute will do."""
import dataclasses
import importlib.util
import json
import sys

spec = importlib.util.spec_from_file_location("dare_sandbox", f"{sys.argv[1]}/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
sandbox = sys.modules["dare_sandbox"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(sandbox)

job = json.loads(sys.stdin.read())
sandbox.ALLOW_UNSAFE = job.pop("unsafe", False)
try:
    result = dataclasses.asdict(sandbox.run(sandbox.CodeJob(**job)))
except sandbox.SandboxUnavailable as e:
    result = {"unavailable": str(e)}
print(json.dumps(result))
