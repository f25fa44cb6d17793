"""Credit rules: from one advantage per trajectory to one advantage per step, then per token.

Every rule has the same shape, so the trainer and the benchmarks can swap them by name:

    rule = get_credit_rule("draco")
    step_advantages = rule(trajectories, group_score, advantages)   # one list per trajectory

where ``advantages`` are the group-normalised A_i from ``group_advantages``. Tokens of step j
then receive a_j and gap tokens 0 (``token_advantages``); ``apply_credit`` does all of it for
an iteration's groups. One module per rule, each registering itself with ``@credit_rule``
(``registry.py``): ``uniform.py`` (GRPO), ``draco.py``, ``trace.py``, ``trca.py``,
``prover.py``; what they share is in ``core.py``.

A credit step is one code block (the paper's step): what a turn without code gets is
``core.TurnsWithoutCode``'s choice. Each rule declares, where it is defined, what it needs from
the trainer and its options, each default labelled as the paper's, a reference
implementation's or ours (``spec.py``); ``credit_spec(name)`` reads the declaration.

Pure Python and numpy: importing this package never imports torch.
"""

from draco_gym.algos.credit.core import CreditRule, group_advantages, token_advantages
from draco_gym.algos.credit.registry import CREDIT_RULES, credit_rule, credit_spec, get_credit_rule
from draco_gym.algos.credit.spec import CreditSpec, Need, RuleOptions, option

# Each rule module registers its rule on import.
from draco_gym.algos.credit.uniform import uniform_credit
from draco_gym.algos.credit.draco import draco_credit, step_quality
from draco_gym.algos.credit import prover, trace, trca  # noqa: F401
from draco_gym.algos.credit.apply import CreditedBatch, apply_credit

__all__ = [
    "CREDIT_RULES",
    "CreditRule",
    "CreditSpec",
    "CreditedBatch",
    "Need",
    "RuleOptions",
    "apply_credit",
    "credit_rule",
    "credit_spec",
    "draco_credit",
    "get_credit_rule",
    "group_advantages",
    "step_quality",
    "option",
    "token_advantages",
    "uniform_credit",
]
