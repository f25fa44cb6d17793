"""What scoring groups as they finish buys: real GRPO iterations (SmolLM2-135M-Instruct,
PythonTools, DRACO's dynamic rubric) against the scripted OpenAI-protocol judge of
tests/judge_server.py, in its own process, answering each call after L seconds.

    python bench/pipeline.py                       # L = 0.5 s, G = 6, 4 groups, 2 timed iterations
    python bench/pipeline.py --tasks 6 --iterations 3 --latency 1.0
    python bench/pipeline.py --model tiny          # a random tiny Llama: the judge's share dominates

The three modes run the same seeded iterations, one after the other in this run:
  - sequential: every group is scored after the rollout, one group after another;
  - streaming (``rollout.scoring: streaming``): a group goes to the judge as soon as its G
    episodes end and is judged while the others sample; the end of the rollout waits only
    for the groups still at the judge;
  - one_step (``rollout.pipeline: one_step``, streaming too): the next iteration is sampled
    and judged on the env runner while this one learns in the driver (one update stale).
Printed: wall time per iteration (``time_this_iter_s``) and each phase's seconds for each
(one_step's sampling phases ran behind the previous iteration's learning; ``waited`` is the
part the driver still waited for), whether the first iteration's rewards are the same in
sequential and streaming, the critical path (the slowest phase alone: rollout, sequential
judging, or the learner), one_step / critical path (goal <= 1.15), the machine's load, and
on the last line the ratio streaming / sequential (goal <= 0.75).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_server import RuleJudge, ServerProcess  # noqa: E402

CRITERIA = ["Checks the product first", "Computes the total", "Submits one answer"]
KEY_ENV = "DRACO_BENCH_JUDGE_KEY"


def passes(title: str, text: str) -> bool:
    """Criterion k passes when bit k of the prompt's length is set: deterministic in the
    rollout (the prompt's fence code is random but of fixed length), independent across
    criteria, so a group's rollouts get different rewards."""
    return bool((len(text) >> CRITERIA.index(title)) & 1)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="a local directory, smollm2-135m-instruct, or 'tiny' (a random Llama built here: it never "
                        "writes code, so every episode ends at turn 1 and only the groups' judging overlaps)")
    p.add_argument("--latency", type=float, default=0.5, help="seconds the judge takes per call")
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--tasks", type=int, default=4, help="groups per iteration")
    p.add_argument("--iterations", type=int, default=2, help="timed iterations per mode (after one warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=3)
    return p.parse_args(argv)


MODES = {"sequential": {"scoring": "sequential"}, "streaming": {"scoring": "streaming"},
         "one_step": {"scoring": "streaming", "pipeline": "one_step"}}


def run_mode(args, mode: str, base_url: str) -> list[dict]:
    from draco_gym.algos.rllib.grpo import GRPOConfig

    judge = {"name": "openai", "model": "bench-judge", "base_url": base_url, "api_key_env": KEY_ENV}
    config = (
        GRPOConfig()
        .environment("draco_gym/PythonTools-v0", env_config={"max_turns": args.max_turns})
        .policy(model=args.model)
        .training(group_size=args.group_size, tasks_per_iteration=args.tasks, max_new_tokens=args.max_new_tokens,
                  max_response_tokens=args.max_turns * (args.max_new_tokens + 400), reward="dynamic",
                  reward_options={"judge": judge}, credit="draco", minibatch_size=None, **MODES[mode])
        .env_runners(num_env_runners=1).learners(num_learners=0).debugging(seed=0, log_level="ERROR")
    )
    algo = config.build_algo()
    rows = []
    try:
        for i in range(args.iterations + 1):
            r = algo.train()
            phases = {k: float(v) for k, v in r["timers"]["phases"].items()}
            row = {"iteration": i, "wall": float(r["time_this_iter_s"]), **phases,
                   "waited": float(r["timers"].get("waited_for_sample", 0.0)),
                   "calls": float(r["judge"]["calls"]), "turns": float(r["env_runners"]["episode_len_mean"]),
                   "returns": [float(r["env_runners"][k]) for k in ("episode_return_mean", "episode_return_min",
                                                                     "episode_return_max")]}
            print(f"  {mode:<10} iteration {i}{' (warm-up)' if i == 0 else ''}: wall {row['wall']:.1f} s  "
                  + " ".join(f"{k}={row.get(k, 0.0):.1f}" for k in ("generation", "env", "judge", "learner"))
                  + f"  judge calls {row['calls']:.0f}, turns/episode {row['turns']:.2f}", flush=True)
            rows.append(row)
    finally:
        algo.stop()
    return rows


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r.get(key, 0.0) for r in rows[1:])  # the warm-up left out


def main(argv=None) -> int:
    args = parse(argv)
    os.environ[KEY_ENV] = "sk-bench"
    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.policy.models import build_tiny_llama, resolve_model
    from draco_gym.algos.rllib.session import ray_session

    args.model = (str(build_tiny_llama(tempfile.mkdtemp(prefix="draco_bench_tiny_"))) if args.model == "tiny"
                  else resolve_model(args.model))
    load_before = os.getloadavg()
    print(f"judge latency L = {args.latency} s per call, {args.tasks} groups x G = {args.group_size}, "
          f"max {args.max_turns} turns x {args.max_new_tokens} tokens; load before {load_before[0]:.2f}", flush=True)
    results = {}
    with ServerProcess(RuleJudge(CRITERIA, passes), latency_s=args.latency) as server, \
            ray_session(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=128)):
        for mode in MODES:
            results[mode] = run_mode(args, mode, server.base_url)
    load_after = os.getloadavg()
    seq, stream, ahead = results["sequential"], results["streaming"], results["one_step"]
    same = all(a["returns"] == b["returns"] for a, b in zip(seq, stream))
    print(f"\nper iteration (mean of {args.iterations}, warm-up left out), seconds:")
    print(f"{'':<12}{'wall':>8}{'generation':>12}{'env':>8}{'judge':>8}{'learner':>9}{'waited':>8}")
    for mode, rows in results.items():
        print(f"{mode:<12}{mean(rows, 'wall'):>8.1f}{mean(rows, 'generation'):>12.1f}{mean(rows, 'env'):>8.1f}"
              f"{mean(rows, 'judge'):>8.1f}{mean(rows, 'learner'):>9.1f}{mean(rows, 'waited'):>8.1f}")
    rollout = mean(seq, "generation") + mean(seq, "env")
    critical = max(("rollout", rollout), ("judge (sequential)", mean(seq, "judge")), ("learner", mean(seq, "learner")),
                   key=lambda kv: kv[1])
    print(f"critical path (the slowest phase alone): {critical[0]} {critical[1]:.1f} s; "
          f"streaming wall / critical path = {mean(stream, 'wall') / critical[1]:.2f}")
    print(f"one_step wall / critical path = {mean(ahead, 'wall'):.1f} / {critical[1]:.1f} s = "
          f"{mean(ahead, 'wall') / critical[1]:.2f} (goal <= 1.15)")
    print(f"episode returns (mean, min, max) equal in both modes, every iteration: {'yes' if same else 'NO'}")
    print(f"load average (1 min) before / after: {load_before[0]:.2f} / {load_after[0]:.2f} (2 cores, shared)")
    ratio = mean(stream, "wall") / mean(seq, "wall")
    print(f"streaming / sequential wall time per iteration = {mean(stream, 'wall'):.1f} / {mean(seq, 'wall'):.1f} s "
          f"= {ratio:.2f} (goal <= 0.75)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
