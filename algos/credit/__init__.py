"""Credit rules: from one advantage per trajectory to one advantage per step, then per token.

Every rule has the same shape, so the trainer and the benchmarks can swap them by name:

    rule = get_credit_rule("draco")
    step_advantages = rule(trajectories, group_score, advantages)   # one list per trajectory

where ``advantages`` are the group-normalised A_i from ``group_advantages``. Tokens of step j
then receive a_j and gap tokens 0 (``token_advantages``); ``apply_credit`` does all of it for
an iteration's groups. The arithmetic is in ``core.py``, the rules by name in
``registry.py`` (uniform, draco, trace, trca, prover).

A credit step is one code block (the paper's step): a turn without code keeps the
trajectory's A_i (``registry.py``). Each rule's module states, value by value, whether it is
the paper's, a reference implementation's or ours.

Pure Python and numpy: importing this package never imports torch.
"""

from draco_gym.algos.credit.core import (
    CreditRule,
    draco_credit,
    group_advantages,
    step_quality,
    token_advantages,
    uniform_credit,
)
from draco_gym.algos.credit.registry import CREDIT_RULES, get_credit_rule
from draco_gym.algos.credit.apply import CreditedBatch, apply_credit

__all__ = [
    "CREDIT_RULES",
    "CreditRule",
    "CreditedBatch",
    "apply_credit",
    "draco_credit",
    "get_credit_rule",
    "group_advantages",
    "step_quality",
    "token_advantages",
    "uniform_credit",
]
