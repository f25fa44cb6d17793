"""The table of credit rules by name, and the decorator a rule's module registers with.

A rule's module defines a factory that takes the rule's options and returns a
``CreditRule``, and registers it where it is defined (verl's ``register_adv_est`` form):

    @credit_rule("draco", reads_scores=True)
    def draco_rule() -> CreditRule: ...

What ``CREDIT_RULES`` holds under that name wraps the factory with what every rule needs, so
a rule body never repeats it: the group check (one advantage per trajectory, and one score
per trajectory when the group carries scores or the rule reads them) and the step boundary.
A credit step is one code block (the paper's step): a rule sees turns without code with no
tokens and no citations of their own (``core.credit_view``), and their tokens then get what
``turns_without_code`` says (``core.TURNS_WITHOUT_CODE``). The decorator returns the factory
itself, unwrapped.

The rule modules (``uniform``, ``draco``, ``trace``, ``trca``, ``prover``) are imported by
the package, so every name is registered once ``draco_gym.algos.credit`` is imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from draco_gym.algos.credit.core import (TURNS_WITHOUT_CODE, CreditRule, credit_owners, credit_view, from_credit_steps,
                                         uncredited_citations)
from draco_gym.registry import Registry
from draco_gym.types import GroupScore, Trajectory

CREDIT_RULES: Registry[Callable[..., CreditRule]] = Registry("credit rule")

Factory = TypeVar("Factory", bound=Callable[..., CreditRule])


def credit_rule(name: str, *, reads_scores: bool = False) -> Callable[[Factory], Factory]:
    """Register the decorated factory in ``CREDIT_RULES`` as ``name``; ``reads_scores``: the
    rule reads the group's verdicts, so a group without one score per trajectory is refused."""

    def add(factory: Factory) -> Factory:
        @functools.wraps(factory)  # keeps the factory's signature: the trainer reads which options it takes
        def build(*args, turns_without_code: str = "trajectory", **options) -> CreditRule:
            return CheckedRule(factory(*args, **options), reads_scores, turns_without_code)

        CREDIT_RULES.register(name)(build)
        return factory

    return add


def get_credit_rule(name: str, *, turns_without_code: str = "trajectory", **options) -> CreditRule:
    """The credit rule registered as ``name``, built with its ``options``;
    ``turns_without_code`` (one of ``core.TURNS_WITHOUT_CODE``) says where the tokens of a
    turn without code get their advantage."""
    return CREDIT_RULES.get(name)(turns_without_code=turns_without_code, **options)


def check_group(trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float], *,
                reads_scores: bool) -> None:
    sizes = {"trajectories": len(trajectories), "advantages": len(advantages)}
    if reads_scores or group.scores:
        sizes["scores"] = len(group.scores)
    if len(set(sizes.values())) > 1:
        raise ValueError("group sizes differ: " + ", ".join(f"{n} {what}" for what, n in sizes.items()))


class CheckedRule:
    """A rule that checks its group and runs over credit steps only; any other attribute is
    the rule's own (ProVer's ``stats`` and ``last``)."""

    def __init__(self, rule: CreditRule, reads_scores: bool, turns_without_code: str = "trajectory") -> None:
        self.rule = rule
        self.reads_scores = reads_scores
        self.turns_without_code = turns_without_code
        if turns_without_code not in TURNS_WITHOUT_CODE:
            raise ValueError(f"turns_without_code must be one of {TURNS_WITHOUT_CODE}, got {turns_without_code!r}")

    def __call__(self, trajectories, group, advantages) -> list[list[float]]:
        check_group(trajectories, group, advantages, reads_scores=self.reads_scores)
        owners = [credit_owners(t, self.turns_without_code) for t in trajectories]
        scores = list(group.scores) or [None] * len(trajectories)
        views = [credit_view(t, s, o) for t, s, o in zip(trajectories, scores, owners)]
        if group.scores:
            group = group.model_copy(update={"scores": [score for _, score in views]})
        per_step = self.rule([traj for traj, _ in views], group, advantages)
        # A rule that builds on its own A_i (TRCA's and ProVer's: the outcome's) says so; else
        # it is the group's.
        episode = getattr(self.rule, "episode_advantages", None)
        base = episode(trajectories, group, advantages) if episode is not None else advantages
        if self.turns_without_code == "gap":  # a turn in no step is a gap: no credit
            base = [0.0] * len(trajectories)
        return [from_credit_steps(a_steps, o, a) for a_steps, o, a in zip(per_step, owners, base)]

    def uncredited_citations(self, trajectories: Sequence[Trajectory], group: GroupScore) -> int:
        """Citations in ``group`` of turns without code that reach no credit step."""
        scores = list(group.scores) or [None] * len(trajectories)
        return sum(uncredited_citations(t, s, credit_owners(t, self.turns_without_code))
                   for t, s in zip(trajectories, scores))

    def __getattr__(self, name: str):
        return getattr(self.rule, name)
