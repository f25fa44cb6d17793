"""Credit rules in the real trainer: iterations of GRPO until a Corridor is solved, rule by rule.

The setting (``draco_gym.bench.learning_setting``, ``LOCKS_CONFIG``): Corridor-v0's ``locks``
layout, where every room of every task is its own decision: 4 corridors (tasks) x 4 rooms,
one of 3 doors per room opens its lock, a different one per room and per task, and the
observation names the corridor, the room and its doors. Each (corridor, room, door) is one
token with its own orthogonal output row in a tiny warm-started Llama (hidden size 64), so no
two decisions share the row that scores their choice, as in ``draco-gym bench credit``'s
tabular policy. Success is every lock of the corridor opened (chance 1/81). GRPO on
Ray/RLlib, 4 tasks x 8 episodes per iteration.

Each rule trains with the reward its paper uses:

    draco     the ``corridor`` rubric: one criterion per room, "Opens the lock in room k",
              citing that room's step; with probability p a citation points at another step
    uniform   the same rubric, every step A_i (GRPO; the paper's "w/o Cred." ablation)
    trace     the ``outcome`` reward (A_out: the group advantage of success) and the frozen
              base policy scoring the gold answer (the right doors, ``metadata["answer"]``)
    prover    the ``outcome`` reward (A_i = success - mean), a simulated judge proposing the
              pivotal step of the shortest success (the room the failures got wrong most
              often; with probability p another step), K = 8 continuations from each of its
              boundaries on the env runner
    trca      the ``outcome`` episode advantage and the generic rule items per transition (a
              locked door raises: Invalidity; an open one runs cleanly: Execution), steps
              compared within the room they were taken in

p moves only where citations point (``corridor`` reward) and where ProVer's judge points, so
uniform, trace and trca runs are the same for every p: each seed runs them once and the
report shows that run under every p (``p = any`` in the saved runs).

For every rule, p and seed, training runs until the success rate of the iteration's own
rollouts, averaged over the last two iterations, reaches ``--threshold`` and for at least
``--k`` iterations (censored at ``--max-iters``: an unreached run counts as ``max_iters``;
the count that got there is shown). Beside it, the mean success over iterations 1..k (the
area under the curve every run has). ``draco-gym bench credit``'s tabular simulation runs
for the same p and rules, and its ratios stand beside the trainer's.

    python bench/learning.py [--seeds 10] [--ps 0,0.2,0.4] [--rules draco,uniform,trace,prover,trca]

Resumable: every finished run is saved to ``--out`` at once (default
``bench/results/learning_<layout>.json``: each run's iterations and success curve, with the
setting they were made in), and a restart skips the runs already there. ``--summarize``
reprints the report of what is saved, with no Ray and no training; saved runs of another
setting, or lacking a rule or p asked for, are an error that names the difference and the
command that reprints what is saved. The last line is the
ratio uniform/draco of mean iterations at p = 0.2 (above 1: DRACO needs fewer), beside the
tabular one. ``--layout treasure --traps room --rules draco,uniform --threshold 0.75
--max-iters 16 --k 0`` is the previous benchmark (one pivotal room, shared door tokens).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

RULES = ("draco", "uniform", "trace", "prover", "trca")
READS_P = ("draco", "prover")
"""The rules whose runs depend on the citation noise p; the others run once per seed."""
REWARD = {"draco": "corridor", "uniform": "corridor", "trace": "outcome", "prover": "outcome", "trca": "outcome"}


class CorridorSegmentJudge:
    """ProVer's judge, simulated: the pivotal step of the shortest success is the non-final
    step whose room the failed rollouts got wrong most often (the first on a tie); with
    probability ``p`` (seeded by the trajectory's content) it names a uniformly drawn other
    non-final step instead. A segment of one step, the shortest ProVer allows."""

    def __init__(self, p: float, seed: int) -> None:
        self.p, self.seed = float(p), int(seed)

    def __call__(self, trajectory, max_len: int, failures=()):
        from draco_gym.reward.stages import Segment

        visits = {v[0]: v for v in trajectory.metrics.get("visits", [])}
        candidates = [j for j in visits if j < len(trajectory.steps)]
        if not candidates:
            return None, "no door opened before the final step"
        wrong = Counter(v[1] for f in failures for v in f.metrics.get("visits", []) if v[3] != "open")
        best = max(candidates, key=lambda j: (wrong[visits[j][1]], -j))
        digest = hashlib.sha256("\x00".join(s.text for s in trajectory.steps).encode()).digest()
        rng = np.random.default_rng([self.seed, int.from_bytes(digest[:8], "little")])
        if rng.random() < self.p and len(candidates) > 1:
            others = [j for j in candidates if j != best]
            best = others[int(rng.integers(len(others)))]
        return Segment(best, best), "ok"


def rule_options(rule: str, p: float, seed: int) -> dict:
    if rule == "prover":
        return {"propose": CorridorSegmentJudge(p, seed), "K": 8}
    return {}


def train_until(algo, threshold: float, max_iters: int, k: int, window: int = 2,
                log=lambda line: None) -> tuple[int, bool, list[float]]:
    """Iterations until the mean success of the last ``window`` iterations reaches
    ``threshold`` (or ``max_iters``), running at least ``k``; the success curve."""
    curve, reached_at = [], None
    for i in range(1, max_iters + 1):
        result = algo.train()
        curve.append(float(result["env_runners"]["env"]["success"]))
        log(f"  iteration {i}: success {curve[-1]:.3f}, inert {result.get('credit', {}).get('inert_share', 0):.2f}, "
            f"{result.get('timers', {}).get('training_iteration', 0):.0f} s")
        if reached_at is None and len(curve) >= window and np.mean(curve[-window:]) >= threshold:
            reached_at = i
        if reached_at is not None and i >= k:
            break
    return (reached_at or max_iters), reached_at is not None, curve


def tabular_ratios(ps: list[float], seeds: int, rules: tuple[str, ...]) -> dict[float, dict[str, float]]:
    """``draco-gym bench credit``'s speed-up of each rule over uniform (uniform's episodes /
    the rule's) at each p, from its tabular simulation."""
    from draco_gym.bench.credit_quality import run_benchmark

    rows = run_benchmark(ps, seeds, rules=tuple(dict.fromkeys(("uniform", *rules))), log=lambda *_: None)
    return {r["p"]: {r2["rule"]: r2["speedup_x_uniform"] for r2 in rows if r2["p"] == r["p"]} for r in rows}


def cell(runs: list[dict], p: float, rule: str) -> list[dict]:
    """The runs of ``rule`` at ``p``: its own, or for a rule that does not read p its runs at any p."""
    return [r for r in runs if r["rule"] == rule and (r["p"] == p or (r["p"] == "any" and rule not in READS_P))]


def report(runs: list[dict], ps: list[float], rules: tuple[str, ...], args, tabular: dict | None = None) -> dict:
    """The table, the ratios beside ``bench credit``'s, and the headline ratio (last line)."""
    seeds = len({r["seed"] for r in runs})
    tabular = tabular if tabular is not None else tabular_ratios(ps, max(seeds, 5), rules)
    k = min([len(r["curve"]) for r in runs] + ([args.k] if args.k else []))
    print(f"\nGRPO on Corridor-v0 ({args.layout}: {args.rooms} rooms x {args.doors} doors, {args.tasks} tasks x 8 episodes "
          f"per iteration); iterations until success >= {args.threshold:.0%} (mean of 2 iterations), capped at "
          f"{args.max_iters}; mean ± std over seeds; reward per rule: "
          + ", ".join(f"{r} {REWARD[r]}" for r in rules))
    print(f"{'p':>4}  {'rule':<8} {'iterations':>15} {'reached':>8}  {f'success, iterations 1-{k}':>25}  {'seeds':>5}")
    summary: dict[tuple[float, str], dict] = {}
    for p in ps:
        for rule in rules:
            runs_here = cell(runs, p, rule)
            if not runs_here:
                continue
            its = np.array([r["iterations"] for r in runs_here], dtype=float)
            area = np.array([np.mean(r["curve"][:k]) for r in runs_here])
            got = sum(r["reached"] for r in runs_here)
            summary[(p, rule)] = {"iterations": float(its.mean()), "iterations_std": float(its.std()),
                                  "area": float(area.mean()), "area_std": float(area.std()),
                                  "reached": got, "seeds": len(its)}
            shared = "" if rule in READS_P else "  (one run serves every p)"
            print(f"{p:>4.1f}  {rule:<8} {its.mean():>7.1f} ± {its.std():<5.1f} {got:>4}/{len(its):<3}  "
                  f"{area.mean():>17.3f} ± {area.std():.3f}  {len(its):>5}{shared}")
    others = [r for r in rules if r != "uniform"]
    print("\nuniform's iterations / the rule's (trainer; tabular: uniform's episodes / the rule's, bench credit)")
    print(f"{'p':>4}  " + "  ".join(f"{r:>16}" for r in others))
    for p in ps:
        cells = []
        for r in others:
            if (p, r) in summary and (p, "uniform") in summary:
                mine = summary[(p, "uniform")]["iterations"] / summary[(p, r)]["iterations"]
                cells.append(f"{mine:>5.2f}x ({tabular.get(p, {}).get(r, float('nan')):>4.2f}x)")
            else:
                cells.append(f"{'-':>16}")
        print(f"{p:>4.1f}  " + "  ".join(f"{c:>16}" for c in cells))
    p_head = 0.2 if 0.2 in ps else ps[len(ps) // 2]
    if (p_head, "draco") in summary and (p_head, "uniform") in summary:
        ratio = summary[(p_head, "uniform")]["iterations"] / summary[(p_head, "draco")]["iterations"]
        print(f"uniform/draco iterations at p={p_head}: trainer {ratio:.2f}x "
              f"(tabular {tabular.get(p_head, {}).get('draco', float('nan')):.2f}x)")
    return {f"{p}/{rule}": v for (p, rule), v in summary.items()}


# The arguments that decide what a saved run measured: runs of another setting are not comparable.
SETTING = ("layout", "rooms", "doors", "tasks", "traps", "threshold", "max_iters", "k")


class SavedRunsError(ValueError):
    """The saved runs cannot answer the arguments; the message says what is saved instead."""


def reprint_command(out: Path, saved: dict) -> str:
    """The command that reprints the runs saved in ``out``: their setting, rules and ps."""
    runs = saved.get("runs", [])
    rules = ",".join(dict.fromkeys(r["rule"] for r in runs))
    ps = ",".join(str(p) for p in sorted({r["p"] for r in runs if r["p"] != "any"}))
    flags = " ".join(f"--{key.replace('_', '-')} {saved['setting'][key]}" for key in SETTING if key in saved["setting"])
    return f"python bench/learning.py --summarize --out {out} {flags} --rules {rules}" + (f" --ps {ps}" if ps else "")


def saved_runs(out: Path, setting: dict, must_exist: bool) -> dict:
    """The runs saved in ``out`` ({"setting", "runs", "tabular"}), checked against the
    arguments' setting; none yet is an empty list unless ``must_exist`` (``--summarize``).
    ``SavedRunsError`` names each argument that differs and the saved files' settings."""
    if not out.is_file():
        if must_exist:
            raise SavedRunsError(f"{out}: no saved runs. {_saved_elsewhere(out.parent)}")
        return {"runs": []}
    try:
        saved = json.loads(out.read_text())
        saved_setting, runs = saved["setting"], saved["runs"]
        saved["tabular"] = {float(p): ratios for p, ratios in saved.get("tabular", {}).items()} or None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SavedRunsError(f"{out} is not a file of saved runs ({type(exc).__name__}: {exc})") from None
    differ = [f"--{key.replace('_', '-')} {saved_setting.get(key)} (given: {setting[key]})"
              for key in SETTING if saved_setting.get(key) != setting[key]]
    if runs and differ:
        raise SavedRunsError(f"{out} holds runs of another setting: {'; '.join(differ)}. Reprint them with "
                             f"{reprint_command(out, saved)}, or give another --out")
    return saved


def _saved_elsewhere(folder: Path) -> str:
    commands = []
    for path in sorted(folder.glob("learning*.json")) if folder.is_dir() else []:
        try:
            commands.append(reprint_command(path, json.loads(path.read_text())))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    if not commands:
        return "Run the benchmark first (python bench/learning.py with the same arguments)."
    return ("Run the benchmark for this setting first, or reprint the runs saved beside it: "
            + "; ".join(commands))


def require_cells(runs: list[dict], ps: list[float], rules: tuple[str, ...]) -> None:
    """Every one of ``rules`` has saved runs at every p of ``ps``, else ``SavedRunsError``
    names the (rule, p) cells the saved runs lack and what they hold."""
    missing = [f"{rule} at p={p}" for p in ps for rule in rules if not cell(runs, p, rule)]
    if missing:
        held = sorted({(r["rule"], r["p"]) for r in runs}, key=str)
        raise SavedRunsError(f"the saved runs hold no {', '.join(missing)}; they hold "
                             + (", ".join(f"{rule} at p={p}" for rule, p in held) if held else "nothing")
                             + ": give --ps and --rules among these")


def planned(seeds: int, ps: list[float], rules: tuple[str, ...]) -> list[tuple[int, float | str, str]]:
    """Every (seed, p, rule) run, seed-major so that an interrupted run still compares every
    rule; a rule that does not read p has one run per seed (p "any")."""
    out = []
    for seed in range(seeds):
        for rule in rules:
            for p in (ps if rule in READS_P else ["any"]):
                out.append((seed, p, rule))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--ps", default="0,0.2,0.4", help="wrong-citation probabilities, comma-separated")
    parser.add_argument("--rules", default=",".join(RULES), help="credit rules, comma-separated")
    parser.add_argument("--threshold", type=float, default=0.5, help="success rate to reach")
    parser.add_argument("--max-iters", type=int, default=40)
    parser.add_argument("--k", type=int, default=20, help="every run trains at least k iterations: the curve's "
                        "area over iterations 1..k is compared (0: the shortest run's length)")
    parser.add_argument("--layout", default="locks", choices=("locks", "treasure"),
                        help="locks: every room its own decision (the default); treasure: one pivotal room")
    parser.add_argument("--rooms", type=int, default=4, help="rooms per corridor")
    parser.add_argument("--doors", type=int, default=None, help="doors per room (default: locks 3, treasure 4)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per iteration (each a group of 8 episodes)")
    parser.add_argument("--traps", default="room", choices=("episode", "room"),
                        help="treasure layout only: the rubric's trap criteria per episode or per hallway room")
    parser.add_argument("--out", default=None, help="the saved runs (default: bench/results/learning_<layout>.json "
                        "in the repository)")
    parser.add_argument("--policy", default=None, help="folder of the warm-started policy: reused if built there "
                        "for the same corridor, else built (default: a new temporary folder)")
    parser.add_argument("--summarize", action="store_true", help="only print the report of the runs saved in --out")
    parser.add_argument("--verbose", action="store_true", help="print every iteration's success")
    args = parser.parse_args(argv)
    args.doors = args.doors or (3 if args.layout == "locks" else 4)
    args.out = args.out or str(Path(__file__).resolve().parent / "results" / f"learning_{args.layout}.json")
    ps = [float(x) for x in args.ps.split(",")]
    rules = tuple(r.strip() for r in args.rules.split(",") if r.strip())
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        parser.error(f"--rules: unknown {unknown}; known: {list(RULES)}")
    if "uniform" not in rules or "draco" not in rules:
        parser.error("--rules must include draco and uniform (the ratio is uniform/draco)")
    out = Path(args.out)
    setting = {key: getattr(args, key) for key in SETTING}
    try:
        saved = saved_runs(out, setting, must_exist=args.summarize)
        if args.summarize:
            require_cells(saved["runs"], ps, rules)
    except SavedRunsError as exc:
        parser.exit(2, f"error: {exc}\n")
    runs = saved["runs"]
    if args.summarize:
        report(runs, ps, rules, args, tabular=saved.get("tabular"))
        return 0

    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.rllib.session import start_ray, stop_ray
    from draco_gym.bench.learning_setting import (ENV_CONFIG, LOCKS_CONFIG, LOCKS_WARM_START, build_corridor_policy,
                                                  corridor_config)

    if args.layout == "locks":
        env_config = {**LOCKS_CONFIG, "n_rooms": args.rooms, "n_doors": args.doors, "n_tasks": args.tasks}
    else:
        env_config = {**ENV_CONFIG, "n_rooms": args.rooms, "n_doors": args.doors}
    todo = [(seed, p, rule) for seed, p, rule in planned(args.seeds, ps, rules)
            if not any(r["seed"] == seed and r["p"] == p and r["rule"] == rule for r in runs)]
    print(f"{len(runs)} runs saved in {out}, {len(todo)} to go", flush=True)
    start_ray(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=80))
    start = time.perf_counter()
    warm = LOCKS_WARM_START if args.layout == "locks" else {}
    policy = build_corridor_policy(Path(args.policy or tempfile.mkdtemp(prefix="corridor_policy_")), env_config=env_config,
                                   **warm)
    for n, (seed, p, rule) in enumerate(todo, start=1):
        p_value = 0.0 if p == "any" else p
        reward_options = {"traps": args.traps} if args.layout == "treasure" else {}
        algo = corridor_config(policy, credit=rule, p=p_value, seed=seed, env_config=env_config,
                               reward=REWARD[rule], reward_options=reward_options, tasks_per_iteration=args.tasks,
                               credit_options=rule_options(rule, p_value, seed),
                               max_new_tokens=12 if args.layout == "locks" else 8).build_algo()
        began = time.perf_counter()
        try:
            iters, reached, curve = train_until(algo, args.threshold, args.max_iters, args.k,
                                                log=lambda line: print(line, flush=True) if args.verbose else None)
        finally:
            algo.stop()
        runs.append({"p": p, "rule": rule, "seed": seed, "iterations": iters, "reached": reached, "curve": curve,
                     "seconds": time.perf_counter() - began})
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"setting": setting, "runs": runs}, indent=1))  # progress so far
        print(f"[{n}/{len(todo)}] p={p} {rule:<8} seed {seed}: {iters:>3} iterations{'' if reached else ' (not reached)'}"
              f", {len(curve)} run in {time.perf_counter() - began:4.0f} s ({time.perf_counter() - start:6.0f} s in all)",
              flush=True)
    stop_ray()
    tabular = tabular_ratios(ps, max(args.seeds, 5), rules)
    summary = report(runs, ps, rules, args, tabular=tabular)
    out.write_text(json.dumps({"setting": setting, "runs": runs, "tabular": tabular, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
