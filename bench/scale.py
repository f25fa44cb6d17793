"""What a second env runner and a second learner buy, side by side in one run.

    python bench/scale.py                          # tiny random Llama, 0.2 s per env step
    python bench/scale.py --step-latency 0.5 --group-size 4 --tasks 4
    python bench/scale.py --model smollm2-135m-instruct --skip rollout

Part 1, rollout throughput: the same rollouts (``--tasks`` tasks x G episodes of
``--max-turns`` steps on Corridor) with 1 and then 2 env runners, through the trainer's own
``GRPO.rollout``. Every env step sleeps ``--step-latency`` seconds, the stand-in for a tool
call or a remote sandbox: a runner steps its episodes one after another, so the latency is
what a second runner can overlap, whatever the CPU count. Reports episodes/s and sampled
tokens/s (wall time, warm-up excluded).

Part 2, the learner: one iteration's batch (sampled once), updated by 1 and then by 2 remote
learners (each its own rows of every minibatch, gradients all-reduced over gloo): seconds
per policy token of the update, ``--epochs`` passes over minibatches of ``--minibatch``
trajectories. On a CPU machine both learners share its cores, so this mostly shows the
cost of the all-reduce and the Ray hops; on GPUs each learner brings its own device.

The last line holds the headline ratios: 2 runners / 1 runner episodes/s, and 1 learner /
2 learners seconds per token.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from draco_gym.algos.config import ResourcesSection
from draco_gym.algos.rllib.session import ray_session, ship_by_value
from draco_gym.envs.corridor import CorridorEnv

ship_by_value(sys.modules[__name__])  # the env runners build SlowCorridor


class SlowCorridor(CorridorEnv):
    """Corridor whose every step waits ``step_latency`` seconds first (a slow tool)."""

    def __init__(self, *, step_latency: float = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_latency = step_latency

    def step(self, action):
        time.sleep(self.step_latency)
        return super().step(action)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (built here), a local directory, or smollm2-135m-instruct")
    p.add_argument("--step-latency", type=float, default=0.2, help="seconds each env step sleeps")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tasks", type=int, default=4, help="tasks per rollout (and per learner batch)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=2, help="timed rollouts / updates per setting (after a warm-up)")
    p.add_argument("--minibatch", type=int, default=4, help="trajectories per learner step")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--skip", choices=["rollout", "learner"], action="append", default=[])
    return p.parse_args()


def model_path(name: str) -> str:
    from draco_gym.algos.policy.models import build_tiny_llama, resolve_model

    if name == "tiny":
        return str(build_tiny_llama(tempfile.mkdtemp(prefix="draco_bench_tiny_")))
    return resolve_model(name)


def make_config(args, path: str, *, env_runners: int, learners: int):
    from draco_gym.algos.rllib.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment(SlowCorridor, env_config={"step_latency": args.step_latency, "n_rooms": args.tasks,
                                               "max_turns": args.max_turns})
        .policy(model=path, lora={"r": 8, "alpha": 16}, torch_threads=1)
        .training(group_size=args.group_size, tasks_per_iteration=args.tasks, max_new_tokens=args.max_new_tokens,
                  max_response_tokens=args.max_turns * (args.max_new_tokens + 200), reward="rule", credit="draco",
                  minibatch_size=args.minibatch, num_epochs=args.epochs, micro_batch_tokens=2048)
        .env_runners(num_env_runners=env_runners, num_cpus_per_env_runner=0.25)
        .learners(num_learners=learners, num_cpus_per_learner=0.25)
        .debugging(seed=0, log_level="ERROR")
    )


def policy_tokens(trajectories) -> int:
    """Tokens the policy sampled (the learner's loss tokens)."""
    from draco_gym.types import GAP

    return sum(sum(1 for s in t.token_step if s != GAP) for t in trajectories)


def bench_rollout(args, path: str) -> dict[int, dict]:
    out = {}
    for runners in (1, 2):
        algo = make_config(args, path, env_runners=runners, learners=0).build_algo()
        try:
            tasks = algo.sample_tasks(0)
            algo.rollout(tasks, group_size=args.group_size, score=False)  # warm-up
            walls, episodes, tokens = [], 0, 0
            for rep in range(args.repeats):
                t0 = time.perf_counter()
                groups = algo.rollout(tasks, group_size=args.group_size, score=False, seed=rep + 1)
                walls.append(time.perf_counter() - t0)
                episodes += sum(len(g.trajectories) for g in groups)
                tokens += policy_tokens(t for g in groups for t in g.trajectories)
        finally:
            algo.stop()
        wall = sum(walls)
        out[runners] = {"episodes_per_s": episodes / wall, "tokens_per_s": tokens / wall, "wall": wall / len(walls)}
    return out


def bench_learner(args, path: str) -> dict[int, dict]:
    from draco_gym.algos.credit.apply import apply_credit

    batch = None
    out = {}
    for learners in (1, 2):
        algo = make_config(args, path, env_runners=1, learners=learners).build_algo()
        try:
            if batch is None:
                groups, _ = algo.sample(algo.sample_tasks(0), seed=0)
                groups, _ = algo.score(groups)
                batch = apply_credit(groups, algo.credit_rule())
            algo.update(batch)  # warm-up (first-call costs, the process group's first all-reduce)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                algo.update(batch)
                times.append(time.perf_counter() - t0)
        finally:
            algo.stop()
        tokens = policy_tokens(batch.trajectories) * args.epochs
        best = min(times)
        out[learners] = {"seconds": best, "tokens": tokens, "s_per_token": best / tokens}
    return out


def main() -> None:
    args = parse()
    path = model_path(args.model)
    with ray_session(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=128)):
        rollout = bench_rollout(args, path) if "rollout" not in args.skip else None
        learner = bench_learner(args, path) if "learner" not in args.skip else None
    headline = []
    if rollout:
        print(f"\n== rollouts: {args.tasks} tasks x G={args.group_size}, {args.max_turns} steps each, "
              f"{args.step_latency:.2f} s per env step, model={args.model}, {args.repeats} timed ==")
        print(f"{'env runners':<13}{'episodes/s':>12}{'tokens/s':>10}{'s/rollout':>11}")
        for n, r in rollout.items():
            print(f"{n:<13}{r['episodes_per_s']:>12.2f}{r['tokens_per_s']:>10.1f}{r['wall']:>11.2f}")
        serial = args.tasks * args.group_size * args.max_turns * args.step_latency
        print(f"env latency alone, one runner stepping every episode: {serial:.2f} s per rollout")
        ratio = rollout[2]["episodes_per_s"] / rollout[1]["episodes_per_s"]
        tok = rollout[2]["tokens_per_s"] / rollout[1]["tokens_per_s"]
        print(f"2 runners / 1: {ratio:.2f}x episodes/s, {tok:.2f}x tokens/s")
        headline.append(f"2 env runners / 1 = {ratio:.2f}x episodes/s")
    if learner:
        print(f"\n== learner update: {args.tasks * args.group_size} trajectories, minibatch "
              f"{args.minibatch}, {args.epochs} epochs, model={args.model}, fastest of {args.repeats} ==")
        print(f"{'learners':<10}{'seconds':>9}{'policy tokens':>15}{'ms/token':>10}")
        for n, r in learner.items():
            print(f"{n:<10}{r['seconds']:>9.2f}{r['tokens']:>15}{1000 * r['s_per_token']:>10.3f}")
        speed = learner[1]["s_per_token"] / learner[2]["s_per_token"]
        print(f"1 learner / 2 learners time per token: {speed:.2f}x")
        headline.append(f"2 learners / 1 = {speed:.2f}x learner tokens/s")
    print("headline: " + "; ".join(headline))


if __name__ == "__main__":
    main()
