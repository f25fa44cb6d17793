"""``draco-gym eval CONFIG.yaml --checkpoint PATH``: the policy on a task split, no update.

Runs ``eval.episodes_per_task`` episodes of every evaluation task (greedy by default) and
reports the environment's success rate, pass@k and pass^k (tau-bench's "all k succeed"),
termination modes and turns; with ``eval.score: true`` also the reward's mean. Writes
``OUTPUT_DIR/eval/summary.json`` and every episode to ``OUTPUT_DIR/eval/rollouts.jsonl``.
``--checkpoint base`` evaluates the base model (adapter at its zero start).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from draco_gym.algos.reporting import RolloutLog
from draco_gym.metrics import pass_at_k, pass_hat_k


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (the eval: section applies)")
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint directory written by draco-gym train, or 'base' for the base model")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--output-dir", help="where eval/ goes (default: the config's output_dir)")


def eval_summary(groups: list[dict], success_metric: str) -> dict:
    per_task, terms, turns, rewards = [], Counter(), [], []
    for group in groups:
        trajs = group["trajectories"]
        wins = [bool(t.metrics.get(success_metric, False)) for t in trajs]
        per_task.append((len(wins), sum(wins)))
        for t in trajs:
            terms[t.termination] += 1
            turns.append(len(t.steps))
        if group.get("score") is not None:
            rewards.extend(group["score"].rewards)
    n_eps = sum(n for n, _ in per_task) or 1
    k_max = min((n for n, _ in per_task), default=0)
    out = {
        "tasks": len(per_task),
        "episodes": sum(n for n, _ in per_task),
        "success_rate": sum(c for _, c in per_task) / n_eps,
        "turns_mean": sum(turns) / max(len(turns), 1),
        "termination": {k: v / n_eps for k, v in terms.items()},
    }
    for k in range(1, k_max + 1):
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in per_task) / max(len(per_task), 1)
        out[f"pass^{k}"] = sum(pass_hat_k(n, c, k) for n, c in per_task) / max(len(per_task), 1)
    if rewards:
        out["reward_mean"] = sum(rewards) / len(rewards)
    return out


def run(args: argparse.Namespace) -> int:
    import ray

    from draco_gym.algos.config import ConfigError, load_config
    from draco_gym.algos.grpo import GRPOConfig
    from draco_gym.algos.train_cli import prepare, start_ray

    overrides = list(args.set) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    checkpoint = None if args.checkpoint == "base" else Path(args.checkpoint)
    if checkpoint is not None and not checkpoint.is_dir():
        print(f"error: --checkpoint {checkpoint}: no such directory", file=sys.stderr)
        return 2
    ev = config.eval
    env_config = {**config.env.config, **ev.env_config}
    config = config.model_copy(update={"env": config.env.model_copy(update={"config": env_config})})
    try:
        task_ids = prepare(config, env_config=env_config, task_ids=ev.task_ids)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    task_ids = task_ids[: ev.max_tasks] if ev.max_tasks else task_ids
    out = Path(config.output_dir).resolve() / "eval"
    out.mkdir(parents=True, exist_ok=True)
    print(f"evaluating {args.checkpoint} on {len(task_ids)} tasks x {ev.episodes_per_task} episodes "
          f"(temperature {ev.temperature})", flush=True)
    start_ray(config)
    try:
        algo = GRPOConfig.from_run_config(config).training(task_ids=task_ids).build_algo()
        try:
            if checkpoint is not None:
                algo.restore_from_path(str(checkpoint.resolve()))
                algo.sync_weights()
            groups = algo.rollout(task_ids, group_size=ev.episodes_per_task, temperature=ev.temperature,
                                  score=ev.score, seed=config.seed)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    summary = {"checkpoint": args.checkpoint, "env": config.env.id, **eval_summary(groups, ev.success_metric)}
    (out / "rollouts.jsonl").unlink(missing_ok=True)
    RolloutLog(out / "rollouts.jsonl").write(groups)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0
