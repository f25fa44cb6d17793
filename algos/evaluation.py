"""Evaluation statistics: what a run shows about learning (before/after rates with confidence
intervals, plain statements when a run could not have learned or cannot tell), and the
rates of ``draco-gym eval`` (pass@k, pass^k, their mean over checkpoints).

    before = episode_summary(algo.rollout(held_out, group_size=k, seed=s))
    ...train...
    after = episode_summary(algo.rollout(held_out, group_size=k, seed=s))
    for line in comparison_notes(before, after): print(line)

Every rate is a share of counted events (episodes, verdicts, turns or executed blocks) with a
95% Wilson interval (``draco_gym.metrics.share``). The success rate also keeps each episode's
outcome by ``task_id/index``: two evaluations with one seed meet the same episodes, so their
difference gets the paired interval (``draco_gym.metrics.paired_difference``), where an episode
that both policies pass or both fail cancels out; other rates, and evaluations of different
episodes, get the normal approximation for independent samples. When the interval holds zero
the notes say the evaluation had too few episodes to tell, when it excludes zero they say
whether the policy got better or worse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from draco_gym.metrics import difference, pass_at_k, pass_hat_k, share
from draco_gym.types import RolloutGroup

def episode_summary(groups: Sequence[RolloutGroup], success_metric: str = "success") -> dict:
    """The user-facing rates of a set of evaluation episodes (``GRPO.rollout`` groups):

    success_rate         episodes whose ``metrics[success_metric]`` is true (``outcomes``:
                         each episode's, by ``task_id/index``, for a paired comparison)
    rubric_pass_rate     PASS verdicts among PASS + FAIL over the whole rubric (criteria
                         that dropout removed included), when the groups were scored
    well_formed_turns    turns that carried one well-formed code block
    raised_blocks        executed blocks whose execution raised
    """
    trajectories = [t for g in groups for t in g.trajectories]
    outcomes = {f"{g.task_id}/{i}": bool(t.metrics.get(success_metric))
                for g in groups for i, t in enumerate(g.trajectories)}
    wins = sum(outcomes.values())
    turns = [s for t in trajectories for s in t.steps]
    well_formed = sum(s.code is not None and not _parse_error(s) for s in turns)
    executed = [s for s in turns if s.code is not None]
    raised = sum(bool(s.info.get("exec_error")) for s in executed)
    out = {
        "episodes": len(trajectories),
        "success_rate": {**share(wins, len(trajectories)),
                         **({"outcomes": outcomes} if len(outcomes) == len(trajectories) else {})},
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


RATES = ("success_rate", "rubric_pass_rate", "well_formed_turns", "raised_blocks")

# What each rate counts (its k of n), and the rate that is better when it falls.
COUNTED = {"success_rate": "episodes", "rubric_pass_rate": "verdicts", "well_formed_turns": "turns",
           "raised_blocks": "executed blocks"}
LOWER_IS_BETTER = {"raised_blocks"}


def comparison_notes(before: dict, after: dict) -> list[str]:
    """One line per rate that changed beyond noise (better or worse: the 95% interval of the
    difference excludes zero), that cannot be told from noise (the interval holds zero), or
    that sat at 0 or 1 on both sides (no spread, so no interval of the difference to speak of).
    Episodes are counted as episodes; a rate over verdicts, turns or blocks names its own
    count beside them."""
    notes = []
    episodes = f"{before.get('episodes', '?')} and {after.get('episodes', '?')} episodes"
    for key in RATES:
        if key not in before or key not in after:
            continue
        b, a = before[key], after[key]
        counts = episodes if key == "success_rate" else f"{episodes}; {b['n']} and {a['n']} {COUNTED[key]}"
        change = f"{key}: {b['mean']:.3f} -> {a['mean']:.3f}"
        if b["mean"] == a["mean"] and b["mean"] in (0.0, 1.0) and b["n"] and a["n"]:
            lo, hi = min(b["ci95"][0], a["ci95"][0]), max(b["ci95"][1], a["ci95"][1])
            notes.append(f"{key}: {b['mean']:.3f} before and after ({b['k']} of {b['n']} and {a['k']} of {a['n']} "
                         f"{COUNTED[key]}): no change seen; each side's 95% interval lies within [{lo:.2f}, {hi:.2f}]")
            continue
        diff = difference(b, a)
        lo, hi = diff["ci95"]
        interval = f"the 95% CI of the difference [{lo:+.3f}, {hi:+.3f}]" + paired_clause(diff, "after", "before")
        if lo <= 0 <= hi:
            notes.append(f"{change}; {interval} does not exclude zero: too few episodes ({counts}) to tell a change "
                         "from noise")
        else:
            better = (lo > 0) != (key in LOWER_IS_BETTER)
            notes.append(f"{change}; {interval} excludes zero: {'better' if better else 'WORSE'} after training "
                         f"({counts})")
    return notes


def paired_clause(diff: dict, later: str, earlier: str) -> str:
    """How a paired difference (``draco_gym.metrics.difference``) was counted, for a note: the
    episodes both sides met and how many changed outcome each way; "" for an unpaired one."""
    if not diff.get("paired"):
        return ""
    changed = diff["changed"]
    return (f" (paired over the same {diff['paired']} episodes: {changed['gained']} passed only {later}, "
            f"{changed['lost']} only {earlier})")


def rates_table(columns: dict[str, dict], title: str, more: Sequence[tuple[str, list[str]]] = ()) -> str:
    """The rates of ``episode_summary``, one column per evaluation (before/after, or each
    checkpoint), each cell the rate and its 95% interval; then ``more`` rows (a name and a
    cell per column) and the episodes counted."""
    width = max(22, *(len(name) + 2 for name in columns))
    def cell(rate: dict) -> str:
        return f"{rate['mean']:.3f} [{rate['ci95'][0]:.2f}, {rate['ci95'][1]:.2f}]"

    rows = [(key, [cell(c[key]) for c in columns.values()]) for key in RATES if all(key in c for c in columns.values())]
    rows += [*more, ("episodes", [str(c["episodes"]) for c in columns.values()])]
    return "\n".join(f"{name:<22} " + " ".join(f"{cell:>{width}}" for cell in cells)
                     for name, cells in [(title, list(columns)), *rows])


def no_update_note(rows: Iterable[dict]) -> str | None:
    """The run's statement when some iterations could not update the policy: every group of
    the iteration had equal rewards, so every advantage was 0."""
    rows = [r for r in rows if "credit/groups_with_spread" in r]
    flat = sum(r["credit/groups_with_spread"] == 0 for r in rows)
    if not flat:
        return None
    return f"no update in {flat} of {len(rows)} iterations: every group had equal rewards"


def credit_note(rows: Iterable[dict]) -> str | None:
    """The run's statement of what its credit did: the mean inert share over the iterations
    (the project's, against the rule's own base, and the paper's: 1.0 is one advantage per
    episode, GRPO's) and, of the groups whose episodes differed in outcome, how many kept a
    criterion after dropout (what the step credit needs to act on)."""
    # A key an iteration did not report reads as None in Tune's rows (e.g. the mixed groups'
    # share when no group had mixed outcomes): such an iteration counts 0 for it.
    def value(row: dict, key: str) -> float:
        v = row.get(key)
        return float(v) if isinstance(v, (int, float)) else 0.0

    rows = [r for r in rows if isinstance(r.get("credit/inert_share"), (int, float))]
    if not rows:
        return None
    inert = sum(value(r, "credit/inert_share") for r in rows) / len(rows)
    paper = [value(r, "credit/paper_inert_share") for r in rows
             if isinstance(r.get("credit/paper_inert_share"), (int, float))]
    note = f"credit over {len(rows)} iterations: mean inert share {inert:.2f}"
    if paper:
        note += f" (the paper's {sum(paper) / len(paper):.2f})"
    mixed = round(sum(value(r, "judge/mixed_groups") for r in rows))  # Tune's results hold counts as floats
    if mixed:
        kept = sum(value(r, "judge/mixed_groups") * value(r, "judge/mixed_groups_with_criteria") for r in rows)
        note += f"; {round(kept)} of {mixed} groups with mixed outcomes kept a criterion after dropout"
    return note


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
