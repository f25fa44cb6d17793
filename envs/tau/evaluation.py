"""Zero-shot evaluation on τ-bench: run a policy n times per task, report SR and pass^k.

pass^k (τ-bench, Yao et al. 2024) is the chance that k independent runs of a task *all*
succeed, estimated without bias from n >= k runs with c successes as C(c, k) / C(n, k) and
averaged over tasks. pass^1 is the success rate (SR). Success is the benchmark's own: reward
1 (within 1e-6), as τ²'s metrics count it.

Any ``policy(messages) -> str`` plays the agent: ``messages`` are chat messages (system
prompt, then alternating user/assistant turns, see ``TauBenchEnv.chat_messages``), the return
value is the agent's next message. A transformers pipeline, a vLLM server or a scripted
function all fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from draco_gym.envs.tau.env import TauBenchEnv
from draco_gym.metrics import pass_hat_k as task_pass_hat_k

Policy = Callable[[list[dict[str, str]]], str]


def run_trials(
    env: TauBenchEnv,
    policy: Policy,
    *,
    task_ids: Iterable[str] | None = None,
    n_trials: int = 1,
    seed: int = 0,
    keep_trajectories: bool = False,
    on_episode: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run ``n_trials`` episodes of each task; returns task id -> one record per trial
    (``reward``, ``success``, ``termination``, ``turns``, and ``trajectory`` if kept).
    Trial t of every task uses seed ``seed + t``. ``on_episode(task_id, trial, record)`` is
    called after each episode (progress bars, incremental saving)."""
    if n_trials < 1:
        raise ValueError(f"n_trials must be >= 1, got {n_trials}")
    ids = list(task_ids) if task_ids is not None else env.backend.task_ids()
    results: dict[str, list[dict[str, Any]]] = {}
    for task_id in ids:
        task_id = env.backend.check_task(task_id)
        for trial in range(n_trials):
            env.reset(seed=seed + trial, options={"task_id": task_id})
            terminated = truncated = False
            info: dict[str, Any] = {}
            while not (terminated or truncated):
                _, _, terminated, truncated, info = env.step(policy(env.chat_messages()))
            metrics = info["metrics"]
            record = {
                "reward": float(metrics.get("reward", 0.0)),
                "success": bool(metrics.get("success", False)),
                "termination": info["trajectory"].termination,
                "turns": len(info["trajectory"].steps),
            }
            if "evaluation_error" in metrics:
                record["evaluation_error"] = metrics["evaluation_error"]
            if keep_trajectories:
                record["trajectory"] = info["trajectory"]
            results.setdefault(task_id, []).append(record)
            if on_episode is not None:
                on_episode(task_id, trial, record)
    return results


def evaluate(
    env_config: Mapping[str, Any],
    policy: Policy,
    *,
    task_ids: Iterable[str] | None = None,
    n_trials: int = 1,
    seed: int = 0,
    on_episode: Callable[[str, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Build a TauBench env from ``env_config`` (``TauBenchEnv`` keyword arguments, e.g.
    ``{"backend": "tau2", "domain": "retail", "user": {...}}``) and run ``policy`` on it;
    returns ``{"summary": trial_summary(...), "results": ...}``. What an ``eval`` command calls."""
    config = dict(env_config)
    env_id = config.pop("id", "draco_gym/TauBench-v0")
    if env_id != "draco_gym/TauBench-v0":
        raise ValueError(f"env id must be draco_gym/TauBench-v0, got {env_id!r}")
    env = TauBenchEnv(**config)
    results = run_trials(env, policy, task_ids=task_ids, n_trials=n_trials, seed=seed, on_episode=on_episode)
    return {"summary": trial_summary(results), "results": results}


def _successes(runs: Sequence[Any]) -> list[bool]:
    return [bool(r["success"]) if isinstance(r, Mapping) else bool(r) for r in runs]


def pass_hat_k(results: Mapping[str, Sequence[Any]], k: int) -> float:
    """τ-bench's pass^k over tasks. ``results`` maps task id -> runs, each a bool or a
    record with ``success``; every task needs at least k runs."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not results:
        raise ValueError("no results to score")
    total = 0.0
    for task_id, runs in results.items():
        wins = _successes(runs)
        if len(wins) < k:
            raise ValueError(f"pass^{k} needs at least {k} runs per task; task {task_id!r} has {len(wins)}")
        total += task_pass_hat_k(len(wins), sum(wins), k)
    return total / len(results)


def success_rate(results: Mapping[str, Sequence[Any]]) -> float:
    """SR: pass^1, the mean per-task success rate."""
    return pass_hat_k(results, 1)


def trial_summary(results: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """SR, mean reward and pass^k for every k up to the fewest runs of any task."""
    if not results:
        raise ValueError("no results to score")
    n_min = min(len(runs) for runs in results.values())
    rewards = [float(r["reward"]) for runs in results.values() for r in runs if isinstance(r, Mapping)]
    return {
        "tasks": len(results),
        "runs": sum(len(runs) for runs in results.values()),
        "success_rate": success_rate(results),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "pass_hat_k": {k: pass_hat_k(results, k) for k in range(1, n_min + 1)},
    }
