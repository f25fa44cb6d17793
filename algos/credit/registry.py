"""The table of credit rules by name, and the decorator a rule's module registers with.

A rule's module declares its options (a ``spec.RuleOptions`` model, each default labelled
with whose it is) and what it needs from the trainer (``spec.Need``), and registers its
factory where it is defined (verl's ``register_adv_est`` form):

    @credit_rule("draco", DracoOptions, needs={Need.REWARD_ADVANTAGE, Need.VERDICTS})
    def draco_rule(options: DracoOptions) -> CreditRule: ...

``CREDIT_RULES`` holds the ``spec.CreditSpec`` under that name; ``get_credit_rule`` validates
the options against it and wraps the factory's rule with what every rule needs, so a rule
body never repeats it: the group check (one advantage per trajectory, and one score per
trajectory when the group carries scores or the rule reads them) and the step boundary.
A credit step is one code block (the paper's step): a rule sees turns without code with no
tokens and no citations of their own (``core.credit_view``), and their tokens then get what
``turns_without_code`` says (``core.TurnsWithoutCode``). The decorator returns the factory
itself, unwrapped.

The rule modules (``uniform``, ``draco``, ``trace``, ``trca``, ``prover``) are imported by
the package, so every name is registered once ``draco_gym.algos.credit`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from draco_gym.algos.credit.core import (TURNS_WITHOUT_CODE, CreditRule, TurnsWithoutCode, credit_owners, credit_view,
                                         from_credit_steps, uncredited_citations)
from draco_gym.algos.credit.spec import CreditSpec, Need, NeedsDecl, RuleOptions, check_option_labels
from draco_gym.registry import Registry
from draco_gym.types import GroupScore, Trajectory


@dataclass(frozen=True)
class RegisteredRule:
    """A rule's declaration and its factory, as ``CREDIT_RULES`` holds them."""

    spec: CreditSpec
    factory: Callable[..., CreditRule]


CREDIT_RULES: Registry[RegisteredRule] = Registry("credit rule")

Factory = TypeVar("Factory", bound=Callable[..., CreditRule])


def credit_rule(name: str, options: type[RuleOptions], *, needs: NeedsDecl,
                inputs: Sequence[str] = ()) -> Callable[[Factory], Factory]:
    """Register the decorated factory in ``CREDIT_RULES`` as ``name``: it is called with its
    validated ``options`` model and, by keyword, those of ``inputs`` that were given; ``needs``
    (``spec.Need``s, or a function of the options giving them) says what the trainer supplies;
    ``Need.VERDICTS`` among them refuses a group without one score per trajectory."""
    check_option_labels(options)
    overlap = set(inputs) & set(options.model_fields)
    if overlap:
        raise ValueError(f"credit {name!r}: {sorted(overlap)} are both options and inputs")

    def add(factory: Factory) -> Factory:
        CREDIT_RULES.register(name)(RegisteredRule(CreditSpec(name, options, needs, tuple(inputs)), factory))
        return factory

    return add


def credit_spec(name: str) -> CreditSpec:
    """The declaration of the rule registered as ``name``."""
    return CREDIT_RULES.get(name).spec


def get_credit_rule(name: str, *, turns_without_code: TurnsWithoutCode = "trajectory", **options) -> CheckedRule:
    """The credit rule registered as ``name``, built with its ``options`` (validated against
    its options model; its inputs passed through); ``turns_without_code`` (one of
    ``core.TURNS_WITHOUT_CODE``) says where the tokens of a turn without code get their
    advantage."""
    entry = CREDIT_RULES.get(name)
    validated, inputs = entry.spec.parse(options)
    return CheckedRule(entry.factory(validated, **inputs), Need.VERDICTS in entry.spec.needs(validated),
                       turns_without_code, options=validated)


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

    def __init__(self, rule: CreditRule, reads_scores: bool, turns_without_code: str = "trajectory",
                 options: RuleOptions | None = None) -> None:
        self.rule = rule
        self.reads_scores = reads_scores
        self.options = options
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
        base = self.base_advantages(trajectories, group, advantages)
        if self.turns_without_code == "gap":  # a turn in no step is a gap: no credit
            base = [0.0] * len(trajectories)
        return [from_credit_steps(a_steps, o, a) for a_steps, o, a in zip(per_step, owners, base)]

    def base_advantages(self, trajectories: Sequence[Trajectory], group: GroupScore,
                        advantages: Sequence[float]) -> list[float]:
        """The A_i the rule builds on: its own where it has one (TRCA's and ProVer's: the
        outcome's, ``episode_advantages``), else the group's ``advantages``. What the tokens of
        a turn without code get, and what the inert share compares against."""
        episode = getattr(self.rule, "episode_advantages", None)
        return [float(a) for a in (episode(trajectories, group, advantages) if episode is not None else advantages)]

    def uncredited_citations(self, trajectories: Sequence[Trajectory], group: GroupScore) -> int:
        """Citations in ``group`` of turns without code that reach no credit step."""
        scores = list(group.scores) or [None] * len(trajectories)
        return sum(uncredited_citations(t, s, credit_owners(t, self.turns_without_code))
                   for t, s in zip(trajectories, scores))

    def __getattr__(self, name: str):
        return getattr(self.rule, name)
