"""Peak memory of a run's process tree, per process and in all, sampled while it runs.

A training run is several processes: the command (driver), Ray's own (raylet, GCS), the
GRPO trial (with the learner when ``num_learners: 0``) and the env runners, all descendants of
the driver when it starts its own Ray. RSS counts a page shared by several processes (torch's
libraries, Ray's object store) once per process, an upper bound; PSS splits each shared page
among the processes sharing it, so the tree's PSS is the memory the run occupies (Linux;
elsewhere RSS stands in for it).

    with TreeMemory() as memory:           # a sampling thread, every half second
        ...run...
    print(memory.report())                 # peak PSS per process and of the tree

``python bench/measure_run.py -- CMD`` does the same around any command.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

GIB = 2**30
MIB = 2**20


@dataclass
class ProcessPeak:
    """One process's peak, under the name it had then (Ray names its actors ``ray::Class``)."""

    pid: int
    name: str
    pss: int = 0
    rss: int = 0


@dataclass
class TreeSample:
    """The tree at one moment: summed PSS and RSS, and each process's (pid, name, pss, rss)."""

    pss: int
    rss: int
    processes: list[tuple[int, str, int, int]] = field(default_factory=list)


def process_name(proc) -> str:
    """A short, recognisable name: ``ray::GRPO.train``, ``raylet``, ``draco-gym train``."""
    cmdline = proc.cmdline()
    if not cmdline:
        return proc.name()
    head = os.path.basename(cmdline[0])
    if head.startswith("ray::") or len(cmdline) == 1:
        return head
    if head.startswith("python"):
        rest = [os.path.basename(a) for a in cmdline[1:3] if a]
        return " ".join(rest)[:60]
    return " ".join([head, *cmdline[1:2]])[:60]


def sample_tree(root) -> TreeSample:
    """PSS and RSS of ``root`` (a ``psutil.Process``) and every descendant."""
    import psutil

    out = TreeSample(0, 0)
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # the root has ended: nothing left to sample
        return out
    for proc in tree:
        try:
            info = proc.memory_full_info()
            name = process_name(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
        pss = getattr(info, "pss", info.rss)
        out.pss += pss
        out.rss += info.rss
        out.processes.append((proc.pid, name, pss, info.rss))
    return out


class TreeMemory:
    """Samples the process tree of ``pid`` (default: this process) in a thread until stopped;
    keeps the tree's peak PSS and RSS and each process's own peaks."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.5) -> None:
        import psutil

        self.root = psutil.Process(pid or os.getpid())
        self.interval_s = interval_s
        self.peak_pss = 0
        self.peak_rss = 0
        self.processes: dict[int, ProcessPeak] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tree-memory", daemon=True)

    def __enter__(self) -> TreeMemory:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> None:
        tree = sample_tree(self.root)
        self.peak_pss = max(self.peak_pss, tree.pss)
        self.peak_rss = max(self.peak_rss, tree.rss)
        for pid, name, pss, rss in tree.processes:
            peak = self.processes.setdefault(pid, ProcessPeak(pid, name))
            if pss > peak.pss:
                peak.pss, peak.name = pss, name
            peak.rss = max(peak.rss, rss)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def summary(self) -> dict:
        """The peaks as JSON: the tree's, and each process's by its peak PSS (bytes)."""
        return {"peak_pss": self.peak_pss, "peak_rss": self.peak_rss,
                "processes": [{"pid": p.pid, "name": p.name, "peak_pss": p.pss, "peak_rss": p.rss}
                              for p in sorted(self.processes.values(), key=lambda p: p.pss, reverse=True)]}

    def report(self, top: int = 8) -> str:
        """The tree's peaks, then the processes by their own peak PSS (each process peaks at
        its own moment, so these add up to more than the tree's peak)."""
        lines = [f"memory: peak {self.peak_pss / GIB:.2f} GiB PSS for the whole process tree "
                 f"({self.peak_rss / GIB:.2f} GiB summed RSS, an upper bound); per process, peak PSS:"]
        for peak in sorted(self.processes.values(), key=lambda p: p.pss, reverse=True)[:top]:
            lines.append(f"  {peak.pss / MIB:7.0f} MiB  {peak.name} (pid {peak.pid})")
        return "\n".join(lines)



_HEAP: list = []  # (name, release function) of this process's allocator, once looked up


def mimalloc_library() -> str | None:
    """The path of mimalloc's shared library from the ``cmeel-mimalloc`` wheel (a Linux
    dependency of the ``rllib`` extra), or None where it is not installed."""
    from importlib import metadata

    if not sys.platform.startswith("linux"):
        return None
    try:
        files = metadata.distribution("cmeel-mimalloc").files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libmimalloc.so"):
            path = file.locate()
            if os.path.isfile(path):
                return str(path)
    return None


def allocator_env(allocator: str) -> dict[str, str]:
    """The variables that start a new process on ``allocator`` (``resources.allocator``): for
    ``"mimalloc"``, ``LD_PRELOAD`` naming its library; nothing for ``"system"`` or where the
    library is missing (the C library's allocator then, with a higher peak).

    Why: the processes that hold the policy allocate and free tensors of every size in turns
    (the sampler's KV caches, the learner's activations). glibc's heap keeps freed blocks below
    its top resident until a trim and splits them for smaller requests, so a learner step ends
    up 0.4-0.5 GiB above what it holds live; mimalloc reuses them by size class and returns
    the pages of emptied segments as it goes, at the same speed on this job (measured in
    docs/benchmarks.md). A variable a user already exported in ``LD_PRELOAD`` stays ahead of
    it."""
    library = mimalloc_library() if allocator == "mimalloc" else None
    if library is None:
        return {}
    preload = os.environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{preload} {library}".strip() if preload else library}


@contextmanager
def started_with(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block, the earlier values after it: for
    a child process that must be started with them (``LD_PRELOAD`` works only from a
    process's start)."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        set_environ(before)


def set_environ(values: dict[str, str | None]) -> None:
    """Each variable set to its value, or unset where the value is None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def heap_allocator() -> str | None:
    """``"mimalloc"`` or ``"glibc"``: the allocator this process's ``malloc`` is; None when it
    is neither (then ``release_freed_memory`` has nothing to call)."""
    return _heap()[0]


def _heap() -> tuple[str | None, object]:
    import ctypes
    import ctypes.util

    if not _HEAP:
        process = ctypes.CDLL(None)  # the symbols every loaded library exports, preloads first
        if hasattr(process, "mi_collect"):
            process.mi_collect.argtypes = [ctypes.c_bool]
            _HEAP.append(("mimalloc", lambda: process.mi_collect(True)))
        else:
            name = ctypes.util.find_library("c")
            try:
                libc = ctypes.CDLL(name) if name else None
            except OSError:
                libc = None
            if libc is not None and hasattr(libc, "malloc_trim"):
                _HEAP.append(("glibc", lambda: libc.malloc_trim(0)))
            else:
                _HEAP.append((None, None))
    return _HEAP[0]


def release_freed_memory() -> bool:
    """Hand the pages this process's heap holds free back to the OS (glibc's ``malloc_trim``,
    mimalloc's ``mi_collect``); False where the allocator is neither.

    A run's processes take turns: the env runner samples while the learner waits, then the
    learner steps while the env runner waits. Without this, each keeps the pages of its own
    peak while the other peaks, and the tree's peak is the sum of both: glibc returns a freed
    block to the OS at once only above its mmap threshold, a threshold that rises (up to 32 MiB
    on 64-bit) with the blocks freed, and activations and KV caches are mostly smaller blocks,
    freed in an order that leaves holes below the heap's top. Called at the end of each phase;
    it costs milliseconds."""
    release = _heap()[1]
    if release is None:
        return False
    release()
    return True
