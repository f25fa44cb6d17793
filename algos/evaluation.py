"""Evaluation statistics: what a run shows about learning (before/after rates with confidence
intervals, plain statements when a run could not have learned or cannot tell), and the
rates of ``draco-gym eval`` (pass@k, pass^k, their mean over checkpoints).

    before = episode_summary(algo.rollout(held_out, group_size=k, seed=s))
    ...train...
    after = episode_summary(algo.rollout(held_out, group_size=k, seed=s))
    for line in comparison_notes(before, after): print(line)

Every rate is a share of counted events (episodes, turns or executed blocks) with a 95%
Wilson interval; a before/after difference gets a normal-approximation interval, and when
that interval holds zero the notes say the evaluation had too few episodes to tell.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from draco_gym.metrics import pass_at_k, pass_hat_k
from draco_gym.types import RolloutGroup

Z95 = 1.959964


def wilson(k: int, n: int, z: float = Z95) -> list[float]:
    """95% Wilson score interval of a proportion k/n ([0, 1] when n = 0)."""
    if n <= 0:
        return [0.0, 1.0]
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def share(k: int, n: int) -> dict:
    return {"mean": k / n if n else 0.0, "k": int(k), "n": int(n), "ci95": wilson(k, n)}


def episode_summary(groups: Sequence[RolloutGroup], success_metric: str = "success") -> dict:
    """The user-facing rates of a set of evaluation episodes (``GRPO.rollout`` groups):

    success_rate         episodes whose ``metrics[success_metric]`` is true
    rubric_pass_rate     PASS verdicts among PASS + FAIL over the whole rubric (criteria
                         that dropout removed included), when the groups were scored
    well_formed_turns    turns that carried one well-formed code block
    raised_blocks        executed blocks whose execution raised
    """
    trajectories = [t for g in groups for t in g.trajectories]
    wins = sum(bool(t.metrics.get(success_metric)) for t in trajectories)
    turns = [s for t in trajectories for s in t.steps]
    well_formed = sum(s.code is not None and not _parse_error(s) for s in turns)
    executed = [s for s in turns if s.code is not None]
    raised = sum(bool(s.info.get("exec_error")) for s in executed)
    out = {
        "episodes": len(trajectories),
        "success_rate": share(wins, len(trajectories)),
        "well_formed_turns": share(well_formed, len(turns)),
        "raised_blocks": share(raised, len(executed)),
    }
    scores = [g.score for g in groups if g.score is not None]
    if scores:
        passes = sum(s.p + s.dropped_passes for g in scores for s in g.scores)
        fails = sum(s.f for g in scores for s in g.scores)
        out["rubric_pass_rate"] = share(passes, passes + fails)
    return out


def _parse_error(step) -> bool:
    parse = step.info.get("parse") if isinstance(step.info, dict) else None
    return bool(parse.get("error")) if isinstance(parse, dict) else False


def difference(before: dict, after: dict) -> dict:
    """after - before of two shares, with a 95% normal-approximation interval."""
    p1, n1, p2, n2 = before["mean"], before["n"], after["mean"], after["n"]
    if not n1 or not n2:
        return {"delta": p2 - p1, "ci95": [-1.0, 1.0]}
    half = Z95 * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return {"delta": p2 - p1, "ci95": [p2 - p1 - half, p2 - p1 + half]}


RATES = ("success_rate", "rubric_pass_rate", "well_formed_turns", "raised_blocks")


def comparison_notes(before: dict, after: dict) -> list[str]:
    """One line per rate whose before/after difference cannot be told from noise."""
    notes = []
    for key in RATES:
        if key in before and key in after:
            diff = difference(before[key], after[key])
            lo, hi = diff["ci95"]
            if lo <= 0 <= hi:
                notes.append(f"{key}: {before[key]['mean']:.3f} -> {after[key]['mean']:.3f}; the 95% CI of the "
                             f"difference [{lo:+.3f}, {hi:+.3f}] does not exclude zero: too few episodes "
                             f"({before[key]['n']} and {after[key]['n']}) to tell a change from noise")
    return notes


def no_update_note(rows: Iterable[dict]) -> str | None:
    """The run's statement when some iterations could not update the policy: every group of
    the iteration had equal rewards, so every advantage was 0."""
    rows = [r for r in rows if "credit/groups_with_spread" in r]
    flat = sum(r["credit/groups_with_spread"] == 0 for r in rows)
    if not flat:
        return None
    return f"no update in {flat} of {len(rows)} iterations: every group had equal rewards"


# -- draco-gym eval: pass@k and pass^k over n runs per task ------------------------------


def eval_summary(groups: Sequence[RolloutGroup], success_metric: str, *, scenarios: bool = False) -> dict:
    """One run's metrics over its groups (one group = the n episodes of one task): success
    rate, pass@k and pass^k for k = 1..n, termination shares, turns, the reward's mean.
    ``scenarios``: also AppWorld's SGC, the share of scenarios all of whose episodes passed."""
    per_task, terms, turns, rewards = [], Counter(), [], []
    results = []
    for group in groups:
        trajs = group.trajectories
        wins = [bool(t.metrics.get(success_metric, False)) for t in trajs]
        per_task.append((len(wins), sum(wins)))
        results += [{"task_id": group.task_id, "success": w} for w in wins]
        for t in trajs:
            terms[t.termination] += 1
            turns.append(len(t.steps))
        if group.score is not None:
            rewards.extend(group.score.rewards)
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
    if scenarios and results:
        from draco_gym.envs.appworld.metrics import sgc

        out["sgc"] = sgc(results)
    if rewards:
        out["reward_mean"] = sum(rewards) / len(rewards)
    return out


def mean_summary(summaries: list[dict]) -> dict:
    """Each metric's mean over several runs (checkpoints): numbers that every run reports,
    and the termination shares key by key (a mode a run never hit counts as 0 there)."""
    if not summaries:
        raise ValueError("no runs to average")
    out: dict = {}
    for key, value in summaries[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
                isinstance(s.get(key), (int, float)) for s in summaries):
            out[key] = sum(s[key] for s in summaries) / len(summaries)
    modes = sorted({m for s in summaries for m in s.get("termination", {})}, key=str)
    if modes:
        out["termination"] = {m: sum(s.get("termination", {}).get(m, 0.0) for s in summaries) / len(summaries)
                              for m in modes}
    out["runs"] = len(summaries)
    return out
