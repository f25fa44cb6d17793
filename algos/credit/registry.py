"""Every credit rule by name, registered here and nowhere else.

A rule's factory takes the rule's options and returns a ``CreditRule``; ``register`` wraps
what it returns with the group check every rule needs (one advantage per trajectory, and
one score per trajectory when the group carries scores or the rule reads them), so a rule
body never repeats it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from draco_gym.algos.credit.core import CreditRule, draco_credit, uniform_credit
from draco_gym.algos.credit.prover import prover_rule
from draco_gym.algos.credit.trace import trace_rule
from draco_gym.algos.credit.trca import trca_rule
from draco_gym.registry import Registry
from draco_gym.types import GroupScore, Trajectory

CREDIT_RULES: Registry[Callable[..., CreditRule]] = Registry("credit rule")


def get_credit_rule(name: str, **options) -> CreditRule:
    """The credit rule registered as ``name``, built with its ``options``."""
    return CREDIT_RULES.get(name)(**options)


def check_group(trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float], *,
                reads_scores: bool) -> None:
    sizes = {"trajectories": len(trajectories), "advantages": len(advantages)}
    if reads_scores or group.scores:
        sizes["scores"] = len(group.scores)
    if len(set(sizes.values())) > 1:
        raise ValueError("group sizes differ: " + ", ".join(f"{n} {what}" for what, n in sizes.items()))


def register(name: str, factory: Callable[..., CreditRule], *, reads_scores: bool) -> None:
    """Add ``factory`` to ``CREDIT_RULES`` as ``name``; the rules it builds check their group first."""

    @functools.wraps(factory)  # keeps the factory's signature: the trainer reads which options it takes
    def build(*args, **options) -> CreditRule:
        return CheckedRule(factory(*args, **options), reads_scores)

    CREDIT_RULES.register(name)(build)


class CheckedRule:
    """A rule that checks its group before it runs; any other attribute is the rule's own
    (ProVer's ``stats`` and ``last``)."""

    def __init__(self, rule: CreditRule, reads_scores: bool) -> None:
        self.rule = rule
        self.reads_scores = reads_scores

    def __call__(self, trajectories, group, advantages) -> list[list[float]]:
        check_group(trajectories, group, advantages, reads_scores=self.reads_scores)
        return self.rule(trajectories, group, advantages)

    def __getattr__(self, name: str):
        return getattr(self.rule, name)


def uniform_rule() -> CreditRule:
    """Plain GRPO: a_j = A_i."""
    return lambda trajectories, group, advantages: [
        uniform_credit(a, t.step_tokens) for t, a in zip(trajectories, advantages)]


def draco_rule() -> CreditRule:
    """DRACO: the trajectory's advantage redistributed by the step quality of the surviving
    verdicts that cite each step (``draco_credit``)."""

    def assign(trajectories, group, advantages):
        out = []
        for traj, score, a in zip(trajectories, group.scores, advantages):
            passes, fails = score.step_counts(len(traj.steps))
            out.append(draco_credit(a, traj.step_tokens, passes, fails))
        return out

    return assign


register("uniform", uniform_rule, reads_scores=False)
register("draco", draco_rule, reads_scores=True)
register("trace", trace_rule, reads_scores=False)
register("trca", trca_rule, reads_scores=False)
register("prover", prover_rule, reads_scores=False)
