"""Cost of DRACO step credit next to plain GRPO credit on a paper-sized batch.

One training step in the paper: 16 tasks x G=6 rollouts = 96 trajectories; here each has 50
steps (the turn budget) with random step lengths and citations. Both rules run on the same
batch, through the registry, the way the trainer calls them, and then map to tokens.

    python bench/credit.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from draco_gym.algos.credit import get_credit_rule, group_advantages, token_advantages
from draco_gym.types import GAP, GroupScore, Step, Task, Trajectory, TrajectoryScore, Verdict

TASKS, G, STEPS, CRITERIA = 16, 6, 50, 12


def make_batch(seed: int = 0) -> list[tuple[list[Trajectory], GroupScore]]:
    rng = random.Random(seed)
    groups = []
    for t in range(TASKS):
        task = Task(id=f"task-{t}", instruction="bench")
        trajectories, scores = [], []
        for _ in range(G):
            steps = [Step(index=j + 1, text="", code="pass", n_tokens=rng.randint(20, 400)) for j in range(STEPS)]
            token_step = [GAP] * 200
            for step in steps:
                token_step += [step.index] * step.n_tokens + [GAP] * 100
            trajectories.append(Trajectory(task=task, steps=steps, token_ids=[0] * len(token_step), token_step=token_step))
            verdicts = [
                Verdict(criterion=f"c{c}", score=rng.choice([-1, 0, 1]),
                        cited_steps=rng.sample(range(1, STEPS + 1), rng.randint(1, 4)))
                for c in range(CRITERIA)
            ]
            scores.append(TrajectoryScore.from_verdicts(verdicts))
        groups.append((trajectories, GroupScore(scores=scores)))
    return groups


def time_rule(name: str, groups, repeats: int) -> tuple[float, float]:
    rule = get_credit_rule(name)
    step_times, token_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        per_step = []
        for trajectories, group in groups:
            per_step.append(rule(trajectories, group, group_advantages(group.rewards)))
        mid = time.perf_counter()
        for (trajectories, _), credit in zip(groups, per_step):
            for traj, a in zip(trajectories, credit):
                token_advantages(a, traj.token_step)
        end = time.perf_counter()
        step_times.append(mid - start)
        token_times.append(end - mid)
    return statistics.median(step_times), statistics.median(token_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    groups = make_batch()
    n_tokens = sum(len(t.token_step) for trajectories, _ in groups for t in trajectories)
    print(f"batch: {TASKS} tasks x G={G} = {TASKS * G} trajectories x {STEPS} steps, "
          f"{CRITERIA} verdicts each, {n_tokens:,} tokens; median of {args.repeats} runs")
    results = {name: time_rule(name, groups, args.repeats) for name in ("uniform", "draco")}
    print(f"{'rule':<8} {'step credit':>12} {'to tokens':>12} {'total':>12}")
    for name, (steps, tokens) in results.items():
        print(f"{name:<8} {steps * 1e3:>10.2f}ms {tokens * 1e3:>10.2f}ms {(steps + tokens) * 1e3:>10.2f}ms")
    (us, ut), (ds, dt) = results["uniform"], results["draco"]
    print(f"ratio draco/uniform: step credit {ds / us:.2f}x, total {(ds + dt) / (us + ut):.2f}x")


if __name__ == "__main__":
    main()
