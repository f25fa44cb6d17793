"""Run a command and report its wall time and the peak memory of its whole process tree.

    python bench/measure_run.py -- draco-gym train configs/quickstart.yaml

Ray's raylet, GCS and worker processes are descendants of the driver, so the tree's
summed RSS covers the actors too. RSS counts shared pages once per process, so the figure
is an upper bound on what the run needs.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil


def tree_rss(root: psutil.Process) -> tuple[int, list[tuple[int, str]]]:
    total, parts = 0, []
    for proc in [root, *root.children(recursive=True)]:
        try:
            rss = proc.memory_info().rss
            name = " ".join(proc.cmdline()[:2])[-60:]
        except psutil.Error:
            continue
        total += rss
        parts.append((rss, name))
    return total, sorted(parts, reverse=True)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print(__doc__)
        return 2
    t0 = time.time()
    proc = subprocess.Popen(argv)
    root = psutil.Process(proc.pid)
    peak = [0, []]

    def watch() -> None:
        while proc.poll() is None:
            try:
                total, parts = tree_rss(root)
            except psutil.Error:
                total, parts = 0, []
            if total > peak[0]:
                peak[0], peak[1] = total, parts
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    rc = proc.wait()
    thread.join(timeout=2)
    print(f"[measure] exit={rc} wall={time.time() - t0:.1f}s peak_tree_rss={peak[0] / 2**30:.2f}GiB", flush=True)
    for rss, name in peak[1][:8]:
        print(f"[measure]   {rss / 2**20:8.0f} MiB  {name}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
