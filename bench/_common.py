"""Helpers shared by the bench scripts (run as ``python bench/<script>.py``, so this folder is on sys.path)."""

import json
import multiprocessing as mp
import tempfile

import torch


def rss_kib(field: str) -> int:
    """A field of /proc/self/status in KiB: ``VmRSS`` (now) or ``VmHWM`` (peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


class LivePeak:
    """``with LivePeak(device) as peak: ...`` then ``peak.mib``: the most memory held by live tensors inside the
    block, above what they held at its start. CUDA: ``torch.cuda.max_memory_allocated``. CPU: the allocator events
    of ``torch.profiler`` (``profile_memory``), whose running ``Total Allocated`` rises on every allocation and falls
    on every free. Memory freed to the allocator cannot count, unlike the resident-set high-water mark (glibc keeps
    freed pages, so a run that allocates and frees more, e.g. with activation checkpointing, could read higher).
    The profiler slows the CPU ops it records: time outside the block."""

    def __init__(self, device: str = "cpu"):
        self.cuda, self.mib = str(device).startswith("cuda"), 0.0

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.mib = (torch.cuda.max_memory_allocated() - self.start) / 2 ** 20
            return
        self.prof.__exit__(*exc)
        with tempfile.TemporaryDirectory() as folder:
            self.prof.export_chrome_trace(f"{folder}/trace.json")
            with open(f"{folder}/trace.json") as f:
                trace = json.load(f)
        events = sorted((e["ts"], e["args"]) for e in trace["traceEvents"]
                        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
        if events:  # the reporter's total also holds tensors from before the block: measure from its first value
            start = events[0][1]["Total Allocated"] - events[0][1]["Bytes"]
            self.mib = (max(e["Total Allocated"] for _, e in events) - start) / 2 ** 20


class FedCounter:
    """What the model was fed (a forward pre-hook reading ``input_ids``): ``positions``, canvas positions per call
    summed (per row, when every call feeds every row), and ``row_positions``, rows x positions summed (what rows that
    sit out or leave the batch save)."""

    def __init__(self, model):
        self.positions = self.row_positions = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.positions += ids.shape[1]
            self.row_positions += ids.numel()


def hidden_override(family: str, hidden: int, vocab: int = 0) -> dict:
    """Config override for a wider tiny model (LLaDA keeps its OLMo field names); ``vocab``: its output layer as wide
    as a real model's (e.g. LLaDA-8B's 126,464 rows; the tiny tokenizer's ids stay below 512)."""
    out = {} if not hidden else dict(d_model=hidden) if family == "llada" else dict(hidden_size=hidden)
    if vocab:
        out |= dict(vocab_size=vocab, embedding_size=vocab) if family == "llada" else dict(vocab_size=vocab)
    return out


def in_child(target, *args):
    """Run ``target(*args, queue)`` in a forked child (its own peak memory) and return what it put on the queue;
    a crashed child is an error, not a hang."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    proc.join()
    if proc.exitcode:
        name = getattr(target, "__name__", target)
        raise SystemExit(f"{name}{args[1:]}: child failed with exit code {proc.exitcode}")
    return queue.get()
