"""Run a command and report its wall time and the peak memory of its whole process tree.

    python bench/measure_run.py -- draco-gym train configs/quickstart.yaml

Ray's raylet, GCS and worker processes are descendants of the driver, so the tree's
summed memory covers the actors too. Two sums are reported at their peaks: RSS counts a page
shared by several processes (torch's libraries, Ray's shared objects) once per process, an
upper bound; PSS splits each shared page among the processes sharing it, so the tree's PSS
is the memory the run occupies (Linux; RSS alone elsewhere).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, list[tuple[int, str]]]:
    """Summed RSS and PSS of ``root`` and its descendants, and each process's RSS."""
    rss_total, pss_total, parts = 0, 0, []
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
            name = " ".join(proc.cmdline()[:2])[-60:]
        except psutil.Error:
            continue
        rss_total += info.rss
        pss_total += getattr(info, "pss", info.rss)
        parts.append((info.rss, name))
    return rss_total, pss_total, sorted(parts, reverse=True)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print(__doc__)
        return 2
    t0 = time.time()
    proc = subprocess.Popen(argv)
    root = psutil.Process(proc.pid)
    peak = {"rss": 0, "pss": 0, "parts": []}

    def watch() -> None:
        while proc.poll() is None:
            try:
                rss, pss, parts = tree_memory(root)
            except psutil.Error:
                rss, pss, parts = 0, 0, []
            if rss > peak["rss"]:
                peak["rss"], peak["parts"] = rss, parts
            peak["pss"] = max(peak["pss"], pss)
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    rc = proc.wait()
    thread.join(timeout=2)
    print(f"[measure] exit={rc} wall={time.time() - t0:.1f}s peak_tree_pss={peak['pss'] / 2**30:.2f}GiB "
          f"peak_tree_rss={peak['rss'] / 2**30:.2f}GiB (upper bound)", flush=True)
    print("[measure] at the RSS peak, per process (RSS):")
    for rss, name in peak["parts"][:8]:
        print(f"[measure]   {rss / 2**20:8.0f} MiB  {name}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
