"""DRACO vs uniform credit in the real trainer: iterations of GRPO until the Corridor is solved.

The setting of the learning test (``draco_gym.algos.learning``): a tiny warm-started policy,
the Corridor-v0 environment (one pivotal step among ``--rooms``, 4), the judge-free
``corridor`` rubric whose citations point at a wrong step with probability p, and GRPO on
Ray/RLlib. One difference: the rubric judges each hallway with its own trap criterion
(``--traps room``, citing that room's step) where the learning test has one for the whole
corridor. The treasure door is then one verdict among ``rooms``, so a trajectory's advantage
is mostly the hallways': uniform credit puts it on the pivotal step all the same, DRACO
moves it to the steps the verdicts cite (``--traps episode`` gives the test's rubric).

For every p, credit rule and seed, training runs until the success rate of the iteration's
own rollouts, averaged over the last two iterations, reaches the threshold (censored at
``--max-iters``: an unreached run counts as ``max_iters``, and the count that got there is
shown). A finer figure beside it: the mean success over the first k iterations, k the
shortest run (the area under the curve every run has). Beside the ratios,
``draco-gym bench credit``'s tabular simulation is run for the same p and rules.

    python bench/learning.py [--seeds 5] [--ps 0,0.2,0.4] [--rules draco,uniform] [--rooms 4] [--traps room]

Runs go seed by seed, so ``--summarize`` on an interrupted run still compares every cell.
The last line is the ratio uniform/draco of mean iterations at p = 0.2 (above 1: DRACO
needs fewer iterations), beside the tabular one.
"""

from __future__ import annotations

import argparse
import json
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
    print(f"\nGRPO on Corridor-v0 ({args.rooms} rooms, 1 pivotal; treasure door 3, hallway traps behind {args.trap_doors}; "
          f"trap criteria per {args.traps}; "
          f"{args.tasks} tasks x 8 episodes per iteration), iterations until "
          f"success >= {args.threshold:.0%} (mean of 2 iterations), capped at {args.max_iters}; {seeds} seeds")
    # The curve's area over the iterations every run has (a run stops at the threshold): the
    # mean success of iterations 1..k, finer than the integer iteration count.
    k = min(len(r["curve"]) for r in runs)
    print(f"{'p':>4}  {'rule':<8} {'iterations':>15} {'reached':>8}  {f'success, iterations 1-{k}':>25}")
    summary = {}
    for p in ps:
        for rule in rules:
            cell = [r for r in runs if r["p"] == p and r["rule"] == rule]
            its = np.array([r["iterations"] for r in cell], dtype=float)
            area = np.array([np.mean(r["curve"][:k]) for r in cell])
            got = sum(r["reached"] for r in cell)
            summary[(p, rule)] = float(its.mean())
            print(f"{p:>4.1f}  {rule:<8} {its.mean():>7.1f} ± {its.std():<5.1f} {got:>4}/{len(its)}  "
                  f"{area.mean():>17.3f} ± {area.std():.3f}")
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
    parser.add_argument("--max-iters", type=int, default=16)
    parser.add_argument("--rooms", type=int, default=4, help="rooms per corridor (Corridor-v0's n_rooms)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per iteration (each a group of 8 episodes)")
    parser.add_argument("--trap-doors", default="2", help="the hallway doors that hide traps, comma-separated "
                        "(the treasure door is 3 of 0-3)")
    parser.add_argument("--traps", default="room", choices=("episode", "room"),
                        help="the corridor rubric's trap criteria: one per episode or one per hallway room")
    parser.add_argument("--out", default="bench/results/learning.json")
    parser.add_argument("--policy", default=None, help="folder of the warm-started policy: reused if built there "
                        "for the same corridor, else built (default: a new temporary folder)")
    parser.add_argument("--summarize", action="store_true",
                        help="only print the report of the runs saved in --out (e.g. an interrupted run)")
    args = parser.parse_args(argv)
    ps = [float(x) for x in args.ps.split(",")]
    rules = tuple(r.strip() for r in args.rules.split(",") if r.strip())
    try:
        trap_doors = [int(d) for d in args.trap_doors.split(",")]
    except ValueError:
        parser.error(f"--trap-doors must be comma-separated door numbers, got {args.trap_doors!r}")
    if "uniform" not in rules or "draco" not in rules:
        parser.error("--rules must include draco and uniform (the ratio is uniform/draco)")

    if args.summarize:
        saved = json.loads(Path(args.out).read_text())
        runs = saved["runs"]
        for key in ("rooms", "tasks", "trap_doors", "traps", "threshold", "max_iters"):  # the setting the runs were made with
            setattr(args, key, saved["args"].get(key, getattr(args, key)))
        report(runs, [p for p in ps if any(r["p"] == p for r in runs)], rules, args)
        return 0

    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.learning import ENV_CONFIG, build_corridor_policy, corridor_config
    from draco_gym.algos.rllib.session import start_ray, stop_ray

    out = Path(args.out)
    start_ray(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=80))
    start = time.perf_counter()
    env_config = {**ENV_CONFIG, "n_rooms": args.rooms, "trap_doors": trap_doors}
    policy = build_corridor_policy(Path(args.policy or tempfile.mkdtemp(prefix="corridor_policy_")), env_config=env_config)
    runs = []
    for seed in range(args.seeds):  # seed-major: an interrupted run still compares every cell
        for p in ps:
            for rule in rules:
                algo = corridor_config(policy, credit=rule, p=p, seed=seed, env_config=env_config,
                                       reward_options={"traps": args.traps},
                                       tasks_per_iteration=args.tasks).build_algo()
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
    stop_ray()

    report(runs, ps, rules, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
