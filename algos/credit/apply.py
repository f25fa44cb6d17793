"""Credit for a whole iteration: scored groups in, a typed batch of per-token advantages out.

Per group: A_i = group-normalised reward (``group_advantages``), per-step credit by the rule,
then each step's advantage spread over that step's tokens (gap tokens 0; the tokens of a turn
without code carry its number and get what the rule's step boundary gave it, see
``registry.py``). This module adds no values of its own: every number it applies is the
rule's, and whose each one is (paper, reference implementation or ours) is stated in the
rule's module (``core.py``, ``trace.py``, ``prover.py``, ``trca.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from draco_gym.algos.credit.core import group_advantages, token_advantages
from draco_gym.algos.credit.core import CreditRule
from draco_gym.types import RolloutGroup, Trajectory, TrajectoryScore


@dataclass
class CreditedBatch:
    """The iteration's trajectories in group order, each with its credit.

    ``step_advantages[i][j]`` is a_j of trajectory i, ``token_advantages[i]`` the same per
    token of ``trajectories[i].token_ids``. Two measures of credit that changes nothing:

    ``inert_credit_share``   ours: the share of trajectories with A_i != 0 whose steps all
                             got exactly A_i (the rule changed nothing, for any reason)
    ``paper_inert_share``    the paper's (its appendix B.3, 76.4% static / 48.1% dynamic):
                             the share of all rollouts whose surviving verdicts are unanimous
                             (every PASS/FAIL verdict the same, or none at all), where DRACO's
                             weights are all equal; a rollout of a group without verdicts
                             (e.g. the outcome reward) counts as unanimous

    ``uncredited_citations`` counts the citations of turns without code that reach no credit
    step (``core.uncredited_citations``; none under ``turns_without_code: attach``).
    """

    trajectories: list[Trajectory]
    group_advantages: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[list[float]]
    inert_credit_share: float
    paper_inert_share: float = 0.0
    uncredited_citations: int = 0


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


def apply_credit(groups: Sequence[RolloutGroup], rule: CreditRule) -> CreditedBatch:
    """``groups``: scored groups (the reward has run on each). ``rule`` as ``get_credit_rule``
    builds it (its ``base_advantages`` and ``uncredited_citations`` feed the measures); a bare
    ``CreditRule`` is measured against the group advantages and counts no citations."""
    trajectories, per_group, step_adv, token_adv = [], [], [], []
    inert_count = nonzero = agreeing = uncredited = 0
    count_uncredited = getattr(rule, "uncredited_citations", None)
    rule_base = getattr(rule, "base_advantages", None)
    for group in groups:
        trajs, score = group.trajectories, group.score
        if score is None:
            raise ValueError(f"group of task {group.task_id!r} is not scored: credit needs its verdicts")
        advantages = group_advantages(score.rewards)
        per_group.append(advantages)
        scores = list(score.scores) or [None] * len(trajs)
        agreeing += sum(unanimous(s) for s in scores)
        if count_uncredited is not None:
            uncredited += count_uncredited(trajs, score)
        credited = rule(trajs, score, advantages)
        bases = rule_base(trajs, score, advantages) if rule_base is not None else advantages
        for traj, base, a_steps in zip(trajs, bases, credited):
            trajectories.append(traj)
            step_adv.append(a_steps)
            token_adv.append(token_advantages(a_steps, traj.token_step))
            if base != 0:
                nonzero += 1
                inert_count += inert(traj, base, a_steps)
    return CreditedBatch(trajectories, per_group, step_adv, token_adv, inert_count / nonzero if nonzero else 0.0,
                         paper_inert_share=agreeing / len(trajectories) if trajectories else 0.0,
                         uncredited_citations=uncredited)
