"""The judge of one code-reward job, run in the sandbox as ``main.py`` (``code.py`` appends ``main(payload)``): the
candidate's code runs in a second, fresh interpreter and the tests run here, calling the candidate's functions
through pipes. The one thing to know: nothing the candidate does reaches the tests. Its return values cross as
literals only (no object with its own ``__eq__``), its builtins and modules are its own, and it never holds this
file (unlinked), the tests, the verdict's token (read from stdin before the candidate starts) or this process's
stdout, nor can it read this process's memory or file descriptors (this process is not dumpable). The verdict is
``PASS <token>`` on stdout. Standard library only.
"""

import ast
import builtins
import ctypes
import json
import math
import os
import subprocess
import sys
import traceback
import types

PR_SET_DUMPABLE = 4
NOT_PROXIED = set(dir(builtins))  # a candidate's ``def abs`` never stands in for the tests' ``abs``


LAZY = (types.GeneratorType, map, filter, zip, range, reversed, enumerate, type({}.keys()), type({}.values()),
        type({}.items()))  # returned where a list is meant: read out as one


def plain(value):
    """``value`` as built-in literal values only: a subclass of a literal or container type as its base value (read
    through the base type's own methods, so its overrides say nothing), numpy values through ``tolist``, lazy
    sequences as lists; anything else raises ``TypeError``."""
    kind = type(value)
    if kind in (bool, int, float, complex, str, bytes, type(None)):
        return value
    for base, read in ((int, int.__int__), (float, float.__float__), (complex, complex.__complex__),
                       (str, str.__str__), (bytes, lambda v: bytes.__getitem__(v, slice(None)))):
        if isinstance(value, base):
            return read(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in dict.items(value)}
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base(plain(v) for v in base.__iter__(value))
    if kind.__module__ == "numpy" and hasattr(value, "tolist"):
        return plain(value.tolist())
    if isinstance(value, LAZY):
        return [plain(v) for v in value]
    raise TypeError(f"a {kind.__name__} is not a literal value")


def encode(value) -> str:
    """``value`` (already ``plain``) as Python literal text that ``decode`` reads back."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if type(value) in (bool, int, float, complex, str, bytes, type(None)):
        return repr(value)
    if type(value) in (list, tuple, set, frozenset):
        items = ", ".join(encode(v) for v in value)
        if type(value) is list:
            return f"[{items}]"
        if type(value) is tuple:
            return f"({items},)" if len(value) == 1 else f"({items})"
        return f"{type(value).__name__}([{items}])"
    if type(value) is dict:
        return "{" + ", ".join(f"{encode(k)}: {encode(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"a {type(value).__name__} is not a literal value")


def decode(text: str):
    """The value of ``encode``'s text: literals, containers, ``float('nan'|'inf'|'-inf')``, ``set([...])``,
    ``frozenset([...])``; nothing else is evaluated."""
    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [value(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else +inner
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # complex literals
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left - right
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords:
            kind, arg = node.func.id, value(node.args[0])
            if kind == "float" and arg in ("nan", "inf", "-inf"):
                return float(arg)
            if kind in ("set", "frozenset") and isinstance(arg, list):
                return {"set": set, "frozenset": frozenset}[kind](arg)
        raise ValueError(f"not a literal: {ast.dump(node)[:80]}")
    return value(ast.parse(text, mode="eval").body)


# the I/O of both sides is bound here, before any candidate code runs: patching os or json changes nothing in it
def send(fd: int, message: dict, write=os.write, dumps=json.dumps) -> None:
    data = dumps(message).encode()
    write(fd, len(data).to_bytes(8, "little") + data)


def receive(fd: int, read=os.read, loads=json.loads) -> dict:
    def exactly(n):
        chunks = []
        while n:
            chunk = read(fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError("the candidate's process ended")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)
    return loads(exactly(int.from_bytes(exactly(8), "little")))


# -- the candidate's side -------------------------------------------------------------------------------------------
def serve():
    """Run the candidate's module (sent first), report the callables it defines, then answer calls until EOF."""
    requests, replies = os.dup(0), os.dup(1)  # the pipes, moved off stdin/stdout before the candidate's code runs
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(receive(requests)["source"], "solution.py", "exec"), namespace)
    except BaseException:
        send(replies, {"error": traceback.format_exc(limit=5)})
        return
    send(replies, {"defined": sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("__"))})
    while True:
        try:
            request = receive(requests)
        except EOFError:
            return
        try:
            result = namespace[request["call"]](*decode(request["args"]), **decode(request["kwargs"]))
            reply = {"value": encode(plain(result))}
        except BaseException as e:
            reply = {"raise": type(e).__name__, "message": str(e)[:500]}
        send(replies, reply)


# -- the judge's side -----------------------------------------------------------------------------------------------
class Candidate:
    """The candidate's process: its module run, its functions called by name."""

    def __init__(self, judge_source: str, source: str):
        self.process = subprocess.Popen([sys.executable, "-I", "-c", judge_source, "serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self.requests, self.replies = self.process.stdin.fileno(), self.process.stdout.fileno()
        send(self.requests, {"source": source})
        first = receive(self.replies)
        if "error" in first:
            raise RuntimeError("the candidate's code failed to run:\n" + first["error"])
        self.defined = set(first["defined"])

    def call(self, name: str, args: tuple, kwargs: dict):
        send(self.requests, {"call": name, "args": encode(plain(args)), "kwargs": encode(plain(kwargs))})
        reply = receive(self.replies)
        if "raise" in reply:
            kind = getattr(builtins, reply["raise"], None)
            safe = isinstance(kind, type) and issubclass(kind, Exception)
            raise (kind if safe else RuntimeError)(reply["message"])
        return decode(reply["value"])

    def proxy(self, name: str):
        def call(*args, **kwargs):
            return self.call(name, args, kwargs)
        call.__name__ = call.__qualname__ = name
        return call

    def close(self):
        self.process.kill()
        self.process.wait()


def called_names(tests: str) -> set[str]:
    """The names the tests read but neither define, import nor take from the builtins: the candidate's functions."""
    tree = ast.parse(tests)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return read - bound - NOT_PROXIED


def judge(payload: dict, judge_source: str) -> None:
    """Run the tests against the candidate; raise on the first failure."""
    candidate = Candidate(judge_source, payload["candidate"])
    try:
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(payload["setup"], "prompt.py", "exec"), namespace)  # the dataset's own code (its helpers)
        names = {payload["entry"]} if payload["entry"] else called_names(payload["tests"])
        namespace.update({name: candidate.proxy(name) for name in names & candidate.defined})
        exec(compile(payload["tests"], "tests.py", "exec"), namespace)
        if payload["entry"]:
            namespace["check"](namespace[payload["entry"]])
    finally:
        candidate.close()


def main(payload: dict) -> None:
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/<pid>/mem, fd or ptrace for the candidate
    token = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    with open(__file__) as f:
        judge_source = f.read().rsplit("\nmain(", 1)[0] + "\n"
    os.unlink(__file__)  # the tests are not on disk for the candidate to read
    sys.set_int_max_str_digits(0)
    try:
        judge(payload, judge_source)
    except BaseException:
        os.write(2, traceback.format_exc().encode(errors="replace"))
        os._exit(1)
    os.write(1, f"PASS {token}\n".encode())
    os._exit(0)


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    sys.set_int_max_str_digits(0)
    serve()
