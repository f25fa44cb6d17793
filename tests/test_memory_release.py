"""A process hands the heap pages it freed back to the OS at the end of a phase
(``algos.memory.release_freed_memory``), so that the run's processes, which peak in turns, do
not each hold their own peak while another peaks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

psutil = pytest.importorskip("psutil")

# In a fresh interpreter, so that no other test's heap is in the way: 300 MiB of 1 MiB blocks
# on the heap (a 16 MiB block freed first raises glibc's mmap threshold above them),
# interleaved with small blocks that stay, then the big ones freed.
SCRIPT = textwrap.dedent("""
    import json, sys
    import psutil
    from draco_gym.algos.memory import release_freed_memory
    me = psutil.Process()
    big = bytearray(16 * 2**20); del big
    blocks, keep = [], []
    for _ in range(300):
        blocks.append(bytearray(2**20))
        keep.append(bytearray(64 * 1024))
    del blocks
    freed = me.memory_info().rss
    released = release_freed_memory() if sys.argv[1] == "release" else False
    print(json.dumps({"freed": freed, "after": me.memory_info().rss, "released": released}))
""")


def run(mode: str) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_go_back_to_the_os():
    kept, released = run("keep"), run("release")
    mib = 2**20
    # freeing alone leaves the pages with the process ...
    assert kept["after"] > kept["freed"] - 20 * mib
    assert released["released"] is True
    # ... releasing returns nearly all of the 300 MiB
    assert released["freed"] - released["after"] > 250 * mib


def test_the_tree_sampler_outlives_the_process_it_watches():
    """A watched command that ends between two samples leaves an empty sample, not a dead
    sampling thread (which would stop recording a peak with no error)."""
    from draco_gym.algos.memory import TreeMemory

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    memory = TreeMemory(proc.pid, interval_s=0.05)
    memory.sample()
    assert memory.peak_pss > 0
    proc.wait()
    memory.sample()  # the root is gone
    assert memory.peak_pss > 0
