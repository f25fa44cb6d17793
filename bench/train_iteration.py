"""Where a GRPO iteration's time goes, and what batched generation buys.

    python bench/train_iteration.py                               # tiny random Llama, PythonTools
    python bench/train_iteration.py --model smollm2-135m-instruct --max-new-tokens 48

Part 1 runs real iterations on Ray (one env runner, local learner) and prints each phase's
seconds and share of the iteration: generation, env (reset + tool execution), judge
(reward), credit, learner, weight sync, and everything else (driver bookkeeping, Ray
transfers, batching). Goal: everything else <= 5%.

Part 2 runs the same G episodes of one task twice in this process, once batched (one
sampling call per turn across the G live episodes) and once one episode at a time, and
compares generated tokens per second of sampling time. Goal: batched >= 2x on CPU.
The policy is whatever --model names: with the tiny random model the numbers measure the
machinery, not a realistic workload.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

PHASES = ("generation", "env", "judge", "credit", "learner", "sync", "other")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (built here), a local directory, or smollm2-135m-instruct")
    p.add_argument("--env", default="draco_gym/PythonTools-v0")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2, help="tasks per iteration")
    p.add_argument("--iterations", type=int, default=3, help="timed iterations (after one warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--reward", default="rule")
    p.add_argument("--credit", default="draco")
    p.add_argument("--threads", type=int, default=1, help="torch threads for part 2 (Ray's actors default to 1)")
    p.add_argument("--skip", choices=["iteration", "generation"], action="append", default=[])
    return p.parse_args()


def model_path(name: str) -> str:
    from draco_gym.algos.models import build_tiny_llama, resolve_model

    if name == "tiny":
        return str(build_tiny_llama(tempfile.mkdtemp(prefix="draco_bench_tiny_")))
    return resolve_model(name)


def bench_iteration(args, path: str) -> None:
    import ray

    from draco_gym.algos.grpo import GRPOConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, object_store_memory=128 * 2**20, include_dashboard=False, log_to_driver=False)
    config = (
        GRPOConfig()
        .environment(args.env, env_config={"max_turns": args.max_turns})
        .policy(model=path)
        .training(group_size=args.group_size, tasks_per_iteration=args.tasks, max_new_tokens=args.max_new_tokens,
                  max_response_tokens=args.max_turns * (args.max_new_tokens + 400), reward=args.reward,
                  credit=args.credit, minibatch_size=None)
        .env_runners(num_env_runners=1).learners(num_learners=0).debugging(seed=0, log_level="ERROR")
    )
    algo = config.build_algo()
    try:
        algo.train()  # warm-up: first-call costs (lazy imports, env processes) are not steady state
        rows = []
        for _ in range(args.iterations):
            r = algo.train()
            phases = r["timers"]["phases"]
            rows.append({p: float(phases[p]) for p in (*PHASES, "other")} | {
                "total": float(r["timers"]["training_step"]),
                "tokens_per_s": float(r["env_runners"]["generated_tokens_per_s"])})
    finally:
        algo.stop()
        ray.shutdown()
    total = statistics.mean(r["total"] for r in rows)
    print(f"\n== one GRPO iteration ({args.tasks} tasks x G={args.group_size}, {args.iterations} timed, "
          f"mean) model={args.model} ==")
    print(f"{'phase':<12}{'seconds':>10}{'share':>9}")
    for p in PHASES:
        s = statistics.mean(r[p] for r in rows)
        print(f"{p:<12}{s:>10.3f}{s / total:>9.1%}")
    print(f"{'iteration':<12}{total:>10.3f}{1:>9.0%}")
    other = statistics.mean(r["other"] for r in rows) / total
    print(f"everything else: {other:.1%} of the iteration (goal <= 5%: {'met' if other <= 0.05 else 'NOT met'})")
    print(f"rollout tokens/s (sampling time only): {statistics.mean(r['tokens_per_s'] for r in rows):.1f}")


def bench_generation(args, path: str) -> None:
    import gymnasium as gym
    import torch
    from transformers import AutoTokenizer

    import draco_gym  # noqa: F401
    from draco_gym.algos.chat import ChatFormat, eos_token_ids
    from draco_gym.algos.generation import TorchSampler
    from draco_gym.algos.module import add_lora, load_causal_lm
    from draco_gym.algos.rollout import Episode, EpisodeLimits, run_episodes

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(path)
    lm = add_lora(load_causal_lm(path), {"r": 16, "alpha": 32}).eval()
    chat = ChatFormat.from_tokenizer(tok)
    eos = eos_token_ids(tok, lm.generation_config)
    sampler = TorchSampler(lm, eos_ids=eos, pad_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0])
    limits = EpisodeLimits(max_new_tokens=args.max_new_tokens, max_response_tokens=args.max_turns * (args.max_new_tokens + 400))
    envs = [gym.make(args.env, max_turns=args.max_turns) for _ in range(args.group_size)]
    task = envs[0].unwrapped.task_ids[0]

    def episodes():
        return [Episode.start(env, chat, limits, task_id=task, seed=i) for i, env in enumerate(envs)]

    run_episodes(episodes()[:1], sampler, chat, limits, seed=99)  # warm-up
    results = {}
    for mode in ("batched", "one at a time"):
        stats: dict = {}
        t0 = time.perf_counter()
        for rep in range(2):
            if mode == "batched":
                run_episodes(episodes(), sampler, chat, limits, seed=rep, stats=stats)
            else:
                for i, ep in enumerate(episodes()):
                    run_episodes([ep], sampler, chat, limits, seed=rep * 100 + i, stats=stats)
        results[mode] = (stats["sampled_tokens"], stats["sampling_s"], time.perf_counter() - t0)
    for env in envs:
        env.close()
    print(f"\n== generation of G={args.group_size} episodes, 2 repeats, model={args.model}, "
          f"max_new_tokens={args.max_new_tokens} ==")
    print(f"{'mode':<15}{'tokens':>8}{'sampling s':>12}{'tokens/s':>10}{'wall s':>9}")
    for mode, (n, s, wall) in results.items():
        print(f"{mode:<15}{n:>8}{s:>12.2f}{n / s:>10.1f}{wall:>9.2f}")
    speedup = (results["batched"][0] / results["batched"][1]) / (results["one at a time"][0] / results["one at a time"][1])
    print(f"batched / one at a time: {speedup:.2f}x tokens/s (goal >= 2x: {'met' if speedup >= 2 else 'NOT met'})")


def main() -> None:
    args = parse()
    path = model_path(args.model)
    if "generation" not in args.skip:
        bench_generation(args, path)
    if "iteration" not in args.skip:
        bench_iteration(args, path)


if __name__ == "__main__":
    main()
