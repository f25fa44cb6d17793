"""What a training run shows while it runs and leaves behind: the iteration's metrics
(``iteration_metrics``), one progress line per iteration, ``metrics.jsonl`` (one flat JSON
object per iteration), ``rollouts.jsonl`` (``RolloutLog``, train and eval alike), and PNG
plots of the rubric pass rate and of the termination modes over iterations (DRACO's
Figures 3 and 4). TensorBoard event files come from Tune's own logger, in the trial directory.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# The phases of one iteration, in order; each reports seconds as ``time/<phase>``.
PHASES = ("generation", "env", "judge", "credit", "learner", "sync")


def iteration_metrics(groups: Sequence[dict], batch, timers: dict[str, float], total_s: float,
                      generated_tokens: int) -> dict[str, float]:
    """One iteration in numbers: reward, rubric, credit, episodes, judge usage, time per phase.

    ``groups`` are the scored groups (``trajectories``, ``score``), ``batch`` their
    ``CreditedBatch``; runners work in parallel, so ``timers`` hold the slowest one's.
    """
    rewards, turns, terminations, env_metrics, usage = [], [], Counter(), {}, Counter()
    passes = fails = before = after = fallbacks = 0
    for group in groups:
        score = group["score"]
        rewards.extend(score.rewards)
        for traj, ts in zip(group["trajectories"], score.scores):
            terminations[traj.termination] += 1
            turns.append(len(traj.steps))
            passes, fails = passes + ts.p, fails + ts.f
            for key, value in traj.metrics.items():
                if isinstance(value, (bool, int, float)):
                    env_metrics.setdefault(key, []).append(float(value))
        after += len(score.criteria)
        before += len(score.criteria) + len(score.dropped)
        fallbacks += len(score.fallbacks)
        total = score.total_usage
        usage.update({"calls": total.calls, "prompt_tokens": total.prompt_tokens,
                      "completion_tokens": total.completion_tokens, "cost": total.cost})
    n_groups, n = max(len(groups), 1), max(len(turns), 1)
    accounted = sum(timers.values())
    return {
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "reward_std": float(np.std(rewards)) if rewards else 0.0,
        "rubric_pass_rate": passes / (passes + fails) if passes + fails else 0.0,
        "criteria_before_dropout": before / n_groups,
        "criteria_after_dropout": after / n_groups,
        "inert_credit_share": batch.inert_credit_share,
        "episode_turns_mean": float(np.mean(turns)) if turns else 0.0,
        "judge_calls": usage["calls"], "judge_prompt_tokens": usage["prompt_tokens"],
        "judge_completion_tokens": usage["completion_tokens"], "judge_cost": float(usage["cost"]),
        "reward_fallbacks": fallbacks,
        **{f"termination/{k}": v / n for k, v in terminations.items()},
        **{f"env/{k}": float(np.mean(v)) for k, v in env_metrics.items()},
        **{f"time/{phase}": seconds for phase, seconds in timers.items()},
        "time/other": max(total_s - accounted, 0.0),
        "time/iteration": total_s,
        "tokens_per_s": generated_tokens / timers["generation"] if timers.get("generation") else 0.0,
        "generated_tokens": generated_tokens,
        "num_trajectories": len(turns),
    }


class RolloutLog:
    """``rollouts.jsonl``: every rollout, one JSON line each, with its verdicts and (in
    training) its step credit: enough to replay and re-score later with another judge or
    credit rule. Lines: ``task_id``, ``index`` (in its group), ``trajectory``, ``score``
    (null when unscored), ``criteria``, ``dropped``, ``fallbacks`` (of the group), and in
    training ``iteration`` and ``step_advantages``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, groups: Sequence[dict], *, iteration: int | None = None,
              step_advantages: Sequence[Sequence[float]] | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        credit = iter(step_advantages) if step_advantages is not None else None
        with open(self.path, "a") as fh:
            for group in groups:
                score = group.get("score")
                for i, traj in enumerate(group["trajectories"]):
                    line: dict[str, Any] = {} if iteration is None else {"iteration": iteration}
                    line.update(task_id=group["task_id"], index=i, trajectory=traj.model_dump(mode="json"),
                                score=score.scores[i].model_dump(mode="json") if score else None)
                    if score:
                        line.update(criteria=[c.title for c in score.criteria], dropped=score.dropped,
                                    fallbacks=score.fallbacks)
                    if credit is not None:
                        line["step_advantages"] = next(credit)
                    fh.write(json.dumps(line) + "\n")

# Keys of an RLlib result worth keeping, besides everything under the prefixes below.
_TOP = ("training_iteration", "time_this_iter_s", "time_total_s", "reward_mean", "reward_std", "rubric_pass_rate",
        "criteria_before_dropout", "criteria_after_dropout", "inert_credit_share", "episode_turns_mean",
        "judge_calls", "judge_prompt_tokens", "judge_completion_tokens", "judge_cost", "reward_fallbacks",
        "tokens_per_s", "generated_tokens", "num_trajectories")
_PREFIXES = ("termination/", "env/", "time/")
_LEARNER = ("policy_loss", "kl", "ratio", "clip_fraction", "total_loss", "policy_tokens",
            "gradients_default_optimizer_global_norm")


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """The run's own metrics out of an RLlib result dict, flat and JSON-safe."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        if key in _TOP or key.startswith(_PREFIXES):
            out[key] = _plain(value)
    learner = (result.get("learners") or {}).get("default_policy") or {}
    for key in _LEARNER:
        if key in learner:
            out[f"learner/{key}"] = _plain(learner[key])
    return out


def _plain(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return value
    return value if math.isfinite(value) else None


def progress_line(m: dict[str, Any], total_iterations: int | None = None) -> str:
    it = int(m.get("training_iteration", 0))
    head = f"[iter {it}/{total_iterations}]" if total_iterations else f"[iter {it}]"
    terms = " ".join(f"{k.split('/', 1)[1]}={v:.2f}" for k, v in sorted(m.items())
                     if k.startswith("termination/") and v)
    times = " ".join(f"{p}={m.get('time/' + p, 0.0):.1f}s" for p in (*PHASES, "other"))
    success = f" success={m['env/success']:.2f}" if m.get("env/success") is not None else ""
    return (f"{head} reward={m.get('reward_mean', 0):+.3f}±{m.get('reward_std', 0):.3f} "
            f"pass={m.get('rubric_pass_rate', 0):.2f} criteria={m.get('criteria_before_dropout', 0):.1f}"
            f"->{m.get('criteria_after_dropout', 0):.1f} inert={m.get('inert_credit_share', 0):.2f} "
            f"turns={m.get('episode_turns_mean', 0):.1f}{success} [{terms}] "
            f"kl={m.get('learner/kl') or 0:.4f} tok/s={m.get('tokens_per_s', 0):.1f} | "
            f"{times} iter={m.get('time/iteration', 0):.1f}s")


class MetricsLog:
    """Appends compact metrics to ``metrics.jsonl`` and redraws the plots."""

    def __init__(self, output_dir: str | Path, total_iterations: int | None = None, echo=print) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.total = total_iterations
        self.echo = echo
        # A resumed run appends: its plots cover the earlier iterations too.
        self.rows: list[dict] = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()] \
            if self.path.exists() else []

    def add(self, result: dict[str, Any]) -> dict[str, Any]:
        row = compact(result)
        self.rows.append(row)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.echo:
            self.echo(progress_line(row, self.total))
        plot_run(self.rows, self.dir / "plots")
        return row


def plot_run(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """rubric_pass_rate.png and termination_modes.png; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    its = [r.get("training_iteration", i + 1) for i, r in enumerate(rows)]
    written = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(its, [r.get("rubric_pass_rate") or 0 for r in rows], marker="o", label="rubric pass rate")
    ax.plot(its, [r.get("reward_mean") or 0 for r in rows], marker=".", linestyle="--", label="reward mean")
    if any(r.get("env/success") is not None for r in rows):
        ax.plot(its, [r.get("env/success") or 0 for r in rows], marker="x", linestyle=":", label="env success")
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Rubric pass rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    written.append(out / "rubric_pass_rate.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    modes = sorted({k.split("/", 1)[1] for r in rows for k in r if k.startswith("termination/")})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if modes:
        ax.stackplot(its, *[[r.get(f"termination/{m}") or 0 for r in rows] for m in modes], labels=modes)
        ax.legend(loc="upper left", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of rollouts")
    ax.set_title("Termination modes")
    fig.tight_layout()
    written.append(out / "termination_modes.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written
