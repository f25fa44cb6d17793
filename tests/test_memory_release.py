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
    from draco_gym.algos.memory import heap_allocator, release_freed_memory
    me = psutil.Process()
    big = bytearray(16 * 2**20); del big
    blocks, keep = [], []
    for _ in range(300):
        blocks.append(bytearray(2**20))
        keep.append(bytearray(64 * 1024))
    del blocks
    freed = me.memory_info().rss
    released = release_freed_memory() if sys.argv[1] == "release" else False
    print(json.dumps({"freed": freed, "after": me.memory_info().rss, "released": released,
                      "heap": heap_allocator()}))
""")


def run(mode: str, env: dict[str, str] | None = None) -> dict:
    import json
    import os

    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout)


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and glibc are Linux's")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_go_back_to_the_os():
    kept, released = run("keep"), run("release")
    mib = 2**20
    # freeing alone leaves the pages with the process ...
    assert kept["after"] > kept["freed"] - 20 * mib
    assert released["released"] is True
    # ... releasing returns nearly all of the 300 MiB
    assert released["freed"] - released["after"] > 250 * mib
    assert released["heap"] == "glibc"


@linux
def test_a_process_started_on_mimalloc_hands_back_its_freed_heap():
    from draco_gym.algos.memory import allocator_env

    env = allocator_env("mimalloc")
    assert "libmimalloc.so" in env["LD_PRELOAD"]  # the rllib extra's wheel, found
    released = run("release", env)
    assert released["heap"] == "mimalloc"
    assert released["released"] is True
    assert released["freed"] - released["after"] > 250 * 2**20
    assert allocator_env("system") == {}


def _heap_of_this_process(config) -> tuple[str | None, str | None]:
    import os

    from draco_gym.algos.memory import heap_allocator

    return heap_allocator(), os.environ.get("LD_PRELOAD")


@linux
@pytest.mark.parametrize("allocator, heap", [("mimalloc", "mimalloc"), ("system", "glibc")])
def test_the_warm_start_and_evaluation_children_start_on_the_configs_allocator(allocator, heap):
    import os

    from draco_gym.algos.cli.train import in_child_process
    from draco_gym.algos.config import RunConfig
    from draco_gym.algos.memory import heap_allocator

    config = RunConfig.model_validate({"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "x"},
                                      "resources": {"allocator": allocator}})
    before = os.environ.get("LD_PRELOAD")
    # the child runs on it, and what the child starts (its Ray's own processes) does not inherit it
    assert in_child_process(_heap_of_this_process, config) == (heap, before)
    assert os.environ.get("LD_PRELOAD") == before  # only the child was started on it
    assert heap_allocator() == "glibc"


@linux
def test_the_workers_of_a_ray_the_command_starts_run_on_mimalloc_and_rays_own_processes_do_not():
    ray = pytest.importorskip("ray")
    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.memory import heap_allocator
    from draco_gym.algos.rllib.session import ray_session

    def mapped(proc) -> bool:
        return any("libmimalloc" in m.path for m in proc.memory_maps(grouped=True))

    with ray_session(ResourcesSection(ray_num_cpus=1, object_store_memory_mb=80)):
        assert ray.get(ray.remote(heap_allocator).remote()) == "mimalloc"
        raylet = [p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]
        assert raylet and not mapped(raylet[0])


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
