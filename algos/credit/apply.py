"""Credit for a whole iteration: scored groups in, a typed batch of per-token advantages out.

Per group: A_i = group-normalised reward (``group_advantages``), per-step credit by the rule,
then each step's advantage spread over that step's tokens (gap tokens 0; the tokens of a turn
without code carry its number and get what the rule's step boundary gave it, see
``registry.py``).

An episode that ended in ``env_error`` (a sandbox that crashed, a world that timed out, a
protocol breach) failed for the infrastructure, not for the policy: it is left out of its
group's mean and std, out of the rule's view of the group and out of the loss (advantage 0,
``left_out``). A group left with fewer than two episodes by that has no baseline and is
skipped whole (ours: GRPO's statistics assume every episode is the policy's).

This module adds no values of its own: every number it applies is the rule's, and whose
each one is (paper, reference implementation or ours) is stated in the rule's module
(``core.py``, ``trace.py``, ``prover.py``, ``trca.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from draco_gym.algos.credit.core import group_advantages, token_advantages
from draco_gym.algos.credit.core import CreditRule
from draco_gym.metrics import learned_episodes
from draco_gym.types import GroupScore, RolloutGroup, Termination, Trajectory, TrajectoryScore


@dataclass
class CreditedBatch:
    """The iteration's trajectories in group order, each with its credit, and the measures of
    what the credit did: the only statistics of credit (the RLlib trainer, TRL's trainer and
    the example read them).

    ``step_advantages[i][j]`` is a_j of trajectory i, ``token_advantages[i]`` the same per
    token of ``trajectories[i].token_ids``; ``base_advantages[i]`` the A_i the rule built on
    (its own: the outcome's for TRCA and ProVer, else the group's). What the credit changed:

    ``inert_credit_share``     ours: the share of trajectories with A_i != 0 whose credit
                               steps all got exactly their A_i (the rule changed nothing, for
                               any reason)
    ``paper_inert_share``      the paper's (its appendix B.3, 76.4% static / 48.1% dynamic):
                               the share of all rollouts whose surviving verdicts are
                               unanimous (every PASS/FAIL verdict the same, or none at all),
                               where DRACO's weights are all equal; a rollout of a group
                               without verdicts (e.g. the outcome reward) counts as unanimous
    ``uncredited_citations``   the citations of turns without code that reach no credit step
                               (``core.uncredited_citations``; none under
                               ``turns_without_code: attach``)
    ``changed_token_share``    the share of the policy's tokens whose advantage differs from
                               their trajectory's A_i (0: plain GRPO there)
    ``step_advantage_spread``  the mean, over trajectories of two steps or more, of the
                               population std of their a_j
    ``step_advantage_abs_mean`` the mean |a_j| over all steps

    ``left_out[i]``: trajectory i takes no part in the loss nor in the measures above (it
    ended in ``env_error``, or its group was skipped); its advantages are 0. ``env_errors``
    counts the ``env_error`` episodes, ``skipped_groups`` the groups they left with fewer than
    two others.
    """

    trajectories: list[Trajectory]
    group_advantages: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[list[float]]
    base_advantages: list[float]
    inert_credit_share: float
    paper_inert_share: float
    uncredited_citations: int
    changed_token_share: float
    step_advantage_spread: float
    step_advantage_abs_mean: float
    left_out: list[bool]
    env_errors: int
    skipped_groups: int

    def learned(self) -> tuple[list[Trajectory], list[list[float]]]:
        """The trajectories the loss is taken over, with their token advantages."""
        keep = [i for i, out in enumerate(self.left_out) if not out]
        return [self.trajectories[i] for i in keep], [self.token_advantages[i] for i in keep]

    def metrics(self) -> dict[str, float]:
        """The measures under the names both trainers log them (``credit/...``)."""
        return {"credit/inert_share": self.inert_credit_share, "credit/paper_inert_share": self.paper_inert_share,
                "credit/uncredited_citations": self.uncredited_citations,
                "credit/changed_token_share": self.changed_token_share,
                "credit/step_advantage_spread": self.step_advantage_spread,
                "credit/step_advantage_abs_mean": self.step_advantage_abs_mean}


def unanimous(score: TrajectoryScore | None) -> bool:
    """The paper's inert rollout: its surviving PASS/FAIL verdicts all agree, or there are none."""
    if score is None:
        return True
    return score.p == 0 or score.f == 0


def inert(trajectory: Trajectory, base: float, step_advantages: Sequence[float]) -> bool:
    """Every credit step of ``trajectory`` got exactly ``base``: the rule moved nothing. A turn
    without code is left out: it gets the base, its owner's a_j or 0 by ``turns_without_code``,
    not by the rule."""
    return all(math.isclose(step_advantages[step.index - 1], base, rel_tol=1e-9, abs_tol=1e-12)
               for step in trajectory.steps if step.is_credit_step)


def changed_tokens(trajectory: Trajectory, base: float, step_advantages: Sequence[float]) -> tuple[int, int]:
    """(tokens whose advantage differs from ``base``, the policy's tokens) of one trajectory."""
    tolerance = 1e-6 * max(1.0, abs(base))
    tokens = changed = 0
    for step, a in zip(trajectory.steps, step_advantages):
        tokens += step.n_tokens
        changed += step.n_tokens * (abs(a - base) > tolerance)
    return changed, tokens


def spread(values: Sequence[float]) -> float:
    """The population std of ``values``."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((a - mean) ** 2 for a in values) / len(values))


def apply_credit(groups: Sequence[RolloutGroup], rule: CreditRule,
                 advantages: Sequence[Sequence[float]] | None = None) -> CreditedBatch:
    """``groups``: scored groups (the reward has run on each). ``rule`` as ``get_credit_rule``
    builds it (its ``base_advantages`` and ``uncredited_citations`` feed the measures); a bare
    ``CreditRule`` is measured against the group advantages and counts no citations.
    ``advantages``: each group's A_i where the trainer computes them itself (TRL); by default
    the group-normalised rewards (``group_advantages``)."""
    if advantages is not None and len(advantages) != len(groups):
        raise ValueError(f"{len(advantages)} rows of advantages for {len(groups)} groups")
    trajectories, per_group, step_adv, token_adv, bases, left_out = [], [], [], [], [], []
    inert_count = nonzero = agreeing = uncredited = changed = tokens = env_errors = skipped = 0
    spreads: list[float] = []
    count_uncredited = getattr(rule, "uncredited_citations", None)
    rule_base = getattr(rule, "base_advantages", None)
    for k, group in enumerate(groups):
        trajs, score = group.trajectories, group.score
        if score is None:
            raise ValueError(f"group of task {group.task_id!r} is not scored: credit needs its verdicts")
        kept = learned_episodes(traj.termination for traj in trajs)
        failed = sum(traj.termination == Termination.ENV_ERROR for traj in trajs)
        env_errors += failed
        skipped += failed > 0 and not kept  # env errors left no baseline: nothing to compare with
        view = [trajs[i] for i in kept]
        view_score = score if len(kept) == len(trajs) else _scores_of(score, kept)
        view_adv = (group_advantages(view_score.rewards) if advantages is None
                    else [float(advantages[k][i]) for i in kept])
        group_adv = [0.0] * len(trajs)
        credit: list[list[float]] = [[0.0] * len(traj.steps) for traj in trajs]
        group_bases = [0.0] * len(trajs)
        scores = list(score.scores) or [None] * len(trajs)
        agreeing += sum(unanimous(s) for s in scores)
        if view:
            if count_uncredited is not None:
                uncredited += count_uncredited(view, view_score)
            credited = rule(view, view_score, view_adv)
            view_bases = rule_base(view, view_score, view_adv) if rule_base is not None else view_adv
            for i, a_i, base, a_steps in zip(kept, view_adv, view_bases, credited):
                group_adv[i], group_bases[i], credit[i] = a_i, base, a_steps
        per_group.append(group_adv)
        in_loss = set(kept)
        for i, (traj, base, a_steps) in enumerate(zip(trajs, group_bases, credit)):
            trajectories.append(traj)
            step_adv.append(a_steps)
            bases.append(base)
            token_adv.append(token_advantages(a_steps, traj.token_step))
            left_out.append(i not in in_loss)
            if i not in in_loss:  # no part in the loss: none in the measures of what credit did
                continue
            if base != 0:
                nonzero += 1
                inert_count += inert(traj, base, a_steps)
            moved, n = changed_tokens(traj, base, a_steps)
            changed, tokens = changed + moved, tokens + n
            if len(a_steps) > 1:
                spreads.append(spread(a_steps))
    magnitudes = [abs(a) for a_steps, out in zip(step_adv, left_out) if not out for a in a_steps]
    return CreditedBatch(
        trajectories, per_group, step_adv, token_adv, bases,
        inert_credit_share=inert_count / nonzero if nonzero else 0.0,
        paper_inert_share=agreeing / len(trajectories) if trajectories else 0.0,
        uncredited_citations=uncredited,
        changed_token_share=changed / tokens if tokens else 0.0,
        step_advantage_spread=sum(spreads) / len(spreads) if spreads else 0.0,
        step_advantage_abs_mean=sum(magnitudes) / len(magnitudes) if magnitudes else 0.0,
        left_out=left_out, env_errors=env_errors, skipped_groups=skipped)


def _scores_of(score: GroupScore, kept: Sequence[int]) -> GroupScore:
    """The group's score as seen by the episodes ``kept`` (their verdicts, the group's rubric)."""
    return score.model_copy(update={"scores": [score.scores[i] for i in kept]})
