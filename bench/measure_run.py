"""Run a command and report its wall time and the peak memory of its whole process tree.

    python bench/measure_run.py -- draco-gym train configs/quickstart.yaml

Ray's raylet, GCS and worker processes are descendants of the driver, so the tree's
summed memory covers the actors too. Two sums are reported at their peaks: RSS counts a page
shared by several processes (torch's libraries, Ray's shared objects) once per process, an
upper bound; PSS splits each shared page among the processes sharing it, so the tree's PSS
is the memory the run occupies (Linux; RSS alone elsewhere). Then each process's own peak
PSS (``draco_gym.algos.memory``, which ``draco-gym train`` also reports at its end).
"""

from __future__ import annotations

import subprocess
import sys
import time

from draco_gym.algos.memory import GIB, TreeMemory


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print(__doc__)
        return 2
    t0 = time.time()
    proc = subprocess.Popen(argv)
    memory = TreeMemory(proc.pid)
    memory.start()
    rc = proc.wait()
    memory.stop()
    print(f"[measure] exit={rc} wall={time.time() - t0:.1f}s peak_tree_pss={memory.peak_pss / GIB:.2f}GiB "
          f"peak_tree_rss={memory.peak_rss / GIB:.2f}GiB (upper bound)", flush=True)
    for line in memory.report().splitlines()[1:]:
        print(f"[measure] {line}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
