"""DRACO vs uniform credit in the real trainer: iterations of GRPO until the Corridor is solved.

The setting of the learning test (``draco_gym.algos.learning``): a tiny warm-started policy,
the Corridor-v0 environment (one pivotal step among four), the judge-free ``corridor``
rubric whose citations point at a wrong step with probability p, and GRPO on Ray/RLlib.
For every p, credit rule and seed, training runs until the success rate of the iteration's
own rollouts, averaged over the last two iterations, reaches the threshold (censored at
``--max-iters``: an unreached run counts as ``max_iters``, and the count that got there is
shown). Beside it, ``draco-gym bench credit``'s tabular simulation is run for the same p
and rules, so the trainer's ratio and the tabular one are side by side.

    python bench/learning.py [--seeds 5] [--ps 0,0.2,0.4] [--rules draco,uniform]

The last line is the ratio uniform/draco of mean iterations at p = 0.2 (above 1: DRACO
needs fewer iterations).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def iterations_to_threshold(algo, threshold: float, max_iters: int, window: int = 2) -> tuple[int, bool, list[float]]:
    curve = []
    for i in range(1, max_iters + 1):
        curve.append(float(algo.train()["env_runners"]["env"]["success"]))
        if len(curve) >= window and np.mean(curve[-window:]) >= threshold:
            return i, True, curve
    return max_iters, False, curve


def tabular_ratios(ps: list[float], seeds: int, rules: tuple[str, ...]) -> dict[float, dict[str, float]]:
    """``draco-gym bench credit``'s speed-up of each rule over uniform (uniform's episodes /
    the rule's) at each p, from its tabular simulation."""
    from draco_gym.bench.credit_quality import run_benchmark

    rows = run_benchmark(ps, seeds, rules=tuple(dict.fromkeys(("uniform", *rules))), log=lambda *_: None)
    return {r["p"]: {**{r2["rule"]: r2["speedup_x_uniform"] for r2 in rows if r2["p"] == r["p"]}} for r in rows}


def report(runs: list[dict], ps: list[float], rules: tuple[str, ...], args) -> None:
    """The table, the ratios beside ``bench credit``'s, and the headline ratio (last line)."""
    out = Path(args.out)
    seeds = len({r["seed"] for r in runs})
    tabular = tabular_ratios(ps, seeds, rules)
    print(f"\nGRPO on Corridor-v0 (4 rooms, 1 pivotal), iterations until success >= {args.threshold:.0%} "
          f"(mean of 2 iterations), capped at {args.max_iters}; {seeds} seeds")
    print(f"{'p':>4}  {'rule':<8} {'iterations':>15} {'reached':>8}")
    summary = {}
    for p in ps:
        for rule in rules:
            its = np.array([r["iterations"] for r in runs if r["p"] == p and r["rule"] == rule], dtype=float)
            got = sum(r["reached"] for r in runs if r["p"] == p and r["rule"] == rule)
            summary[(p, rule)] = float(its.mean())
            print(f"{p:>4.1f}  {rule:<8} {its.mean():>7.1f} ± {its.std():<5.1f} {got:>4}/{len(its)}")
    print(f"\n{'p':>4}  {'trainer uniform/draco':>22}  {'tabular uniform/draco (bench credit)':>37}")
    for p in ps:
        print(f"{p:>4.1f}  {summary[(p, 'uniform')] / summary[(p, 'draco')]:>21.2f}x  "
              f"{tabular[p]['draco']:>36.2f}x")
    if not args.summarize:
        out.write_text(json.dumps({"args": vars(args), "runs": runs,
                                   "tabular_speedup": {str(p): v for p, v in tabular.items()}}, indent=1))
    p_head = 0.2 if 0.2 in ps else ps[len(ps) // 2]
    print(f"uniform/draco iterations at p={p_head}: trainer {summary[(p_head, 'uniform')] / summary[(p_head, 'draco')]:.2f}x "
          f"(tabular {tabular[p_head]['draco']:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--ps", default="0,0.2,0.4", help="wrong-citation probabilities, comma-separated")
    parser.add_argument("--rules", default="draco,uniform", help="credit rules, comma-separated")
    parser.add_argument("--threshold", type=float, default=0.75, help="success rate to reach")
    parser.add_argument("--max-iters", type=int, default=15)
    parser.add_argument("--out", default="bench/results/learning.json")
    parser.add_argument("--summarize", action="store_true",
                        help="only print the report of the runs saved in --out (e.g. an interrupted run)")
    args = parser.parse_args(argv)
    ps = [float(x) for x in args.ps.split(",")]
    rules = tuple(r.strip() for r in args.rules.split(",") if r.strip())
    if "uniform" not in rules or "draco" not in rules:
        parser.error("--rules must include draco and uniform (the ratio is uniform/draco)")

    if args.summarize:
        runs = json.loads(Path(args.out).read_text())["runs"]
        report(runs, [p for p in ps if any(r["p"] == p for r in runs)], rules, args)
        return 0

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from draco_gym.algos.learning import build_corridor_policy, corridor_config

    out = Path(args.out)
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter()
    policy = build_corridor_policy(Path(tempfile.mkdtemp(prefix="corridor_policy_")))
    runs = []
    for seed in range(args.seeds):  # seed-major: an interrupted run still compares every cell
        for p in ps:
            for rule in rules:
                algo = corridor_config(policy, credit=rule, p=p, seed=seed).build_algo()
                try:
                    iters, reached, curve = iterations_to_threshold(algo, args.threshold, args.max_iters)
                finally:
                    algo.stop()
                runs.append({"p": p, "rule": rule, "seed": seed, "iterations": iters, "reached": reached,
                             "curve": curve})
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))  # progress so far
                print(f"p={p:.1f} {rule:<8} seed {seed}: {iters:>3} iterations{'' if reached else ' (not reached)'}"
                      f"  ({time.perf_counter() - start:5.0f} s)", flush=True)
    ray.shutdown()

    report(runs, ps, rules, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
