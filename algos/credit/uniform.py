"""Plain GRPO credit: every step of a trajectory gets the trajectory's advantage A_i.

The baseline every other rule is measured against, DRACO's fallback when nothing is cited,
and the paper's "w/o Cred." ablation. Nothing here is ours: a_j = A_i is GRPO's.
"""

from __future__ import annotations

from collections.abc import Sequence

from draco_gym.algos.credit.core import CreditRule, check_counts, check_finite
from draco_gym.algos.credit.registry import credit_rule
from draco_gym.algos.credit.spec import Need, RuleOptions


class UniformOptions(RuleOptions):
    """Plain GRPO takes no options."""


def uniform_credit(advantage: float, step_tokens: Sequence[int]) -> list[float]:
    """a_j = A_i for every step of the trajectory."""
    advantage = check_finite(advantage, "advantage")
    return [advantage] * len(check_counts(step_tokens, "step_tokens"))


@credit_rule("uniform", UniformOptions, needs={Need.REWARD_ADVANTAGE})
def uniform_rule(options: UniformOptions) -> CreditRule:
    """Plain GRPO: a_j = A_i."""
    return lambda trajectories, group, advantages: [
        uniform_credit(a, t.step_tokens) for t, a in zip(trajectories, advantages)]
