"""The table of credit rules by name, and the decorator a rule's module registers with.

A rule's module declares its options (a ``spec.RuleOptions`` model, each default labelled
with whose it is) and what it needs from the trainer (``spec.Need``), and registers its
factory where it is defined (verl's ``register_adv_est`` form):

    @credit_rule("draco", DracoOptions, needs={Need.REWARD_ADVANTAGE, Need.VERDICTS})
    def draco_rule(options: DracoOptions) -> CreditRule: ...

``CREDIT_RULES`` holds the ``spec.CreditSpec`` under that name; ``get_credit_rule`` validates
the options against it and wraps the factory's rule in ``core.CheckedRule``: what every rule
needs, so a rule body never repeats it (the group check and the step boundary). The
decorator returns the factory itself, unwrapped.

The rule modules (``uniform``, ``draco``, ``trace``, ``trca``, ``prover``) are imported by
the package, so every name is registered once ``draco_gym.algos.credit`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from draco_gym.algos.credit.core import CheckedRule, CreditRule, TurnsWithoutCode
from draco_gym.algos.credit.spec import CreditSpec, Need, NeedsDecl, RuleOptions, check_option_labels
from draco_gym.registry import Registry


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
