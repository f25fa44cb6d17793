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
from draco_gym.types import Trajectory


@dataclass
class CreditedBatch:
    """The iteration's trajectories in group order, each with its credit.

    ``step_advantages[i][j]`` is a_j of trajectory i, ``token_advantages[i]`` the same per
    token of ``trajectories[i].token_ids``. ``inert_credit_share`` is the share of
    trajectories with A_i != 0 whose steps all got exactly A_i (the rule changed nothing).
    """

    trajectories: list[Trajectory]
    group_advantages: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[list[float]]
    inert_credit_share: float


def apply_credit(groups: Sequence[dict], rule: CreditRule) -> CreditedBatch:
    """``groups`` as the env runners return them: ``{"trajectories": [...], "score": GroupScore}``."""
    trajectories, per_group, step_adv, token_adv = [], [], [], []
    inert = nonzero = 0
    for group in groups:
        trajs, score = group["trajectories"], group["score"]
        advantages = group_advantages(score.rewards)
        per_group.append(advantages)
        for traj, a_i, a_steps in zip(trajs, advantages, rule(trajs, score, advantages)):
            trajectories.append(traj)
            step_adv.append(a_steps)
            token_adv.append(token_advantages(a_steps, traj.token_step))
            if a_i != 0:
                nonzero += 1
                inert += all(math.isclose(a, a_i, rel_tol=1e-9, abs_tol=1e-12) for a in a_steps)
    return CreditedBatch(trajectories, per_group, step_adv, token_adv, inert / nonzero if nonzero else 0.0)
