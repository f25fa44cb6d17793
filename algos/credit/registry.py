"""Every credit rule by name, registered here and nowhere else.

A rule's factory takes the rule's options and returns a ``CreditRule``; ``register`` wraps
what it returns with what every rule needs, so a rule body never repeats it: the group check
(one advantage per trajectory, and one score per trajectory when the group carries scores or
the rule reads them) and the step boundary. A credit step is one code block (the paper's
step): a rule sees turns without code with no tokens and no citations of their own
(``credit_view``), and their tokens then get the trajectory's A_i, or with
``turns_without_code="attach"`` the preceding code step's advantage (``from_credit_steps``).

Values: the credit step as one code block is the paper's (DRACO's step); the default for a
turn without code ("trajectory": A_i) and the "attach" option are ours (``core.py`` says why).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from draco_gym.algos.credit.core import (TURNS_WITHOUT_CODE, CreditRule, credit_owners, credit_view, draco_credit, from_credit_steps,
                                         uniform_credit)
from draco_gym.algos.credit.prover import prover_rule
from draco_gym.algos.credit.trace import trace_rule
from draco_gym.algos.credit.trca import trca_rule
from draco_gym.registry import Registry
from draco_gym.types import GroupScore, Trajectory

CREDIT_RULES: Registry[Callable[..., CreditRule]] = Registry("credit rule")


def get_credit_rule(name: str, *, turns_without_code: str = "trajectory", **options) -> CreditRule:
    """The credit rule registered as ``name``, built with its ``options``;
    ``turns_without_code`` ("trajectory" or "attach", see ``core.TURNS_WITHOUT_CODE``) says
    where the tokens of a turn without code get their advantage."""
    return CREDIT_RULES.get(name)(turns_without_code=turns_without_code, **options)


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
    def build(*args, turns_without_code: str = "trajectory", **options) -> CreditRule:
        return CheckedRule(factory(*args, **options), reads_scores, turns_without_code)

    CREDIT_RULES.register(name)(build)


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
        # A rule that builds on its own A_i (TRCA: the outcome's) says so; else it is the group's.
        episode = getattr(self.rule, "episode_advantages", None)
        base = episode(trajectories, advantages) if episode is not None else advantages
        return [from_credit_steps(a_steps, o, a) for a_steps, o, a in zip(per_step, owners, base)]

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
