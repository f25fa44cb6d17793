"""What a credit rule declares where it is defined: what it needs from the trainer, and its
options, each with its default and whose value that default is.

    class TRCAOptions(RuleOptions):
        lam: float = option(0.8, "paper", "r = (1 - lam) r^F + lam r^B", ge=0, le=1)

    @credit_rule("trca", TRCAOptions, needs=trca_needs)
    def trca_rule(options: TRCAOptions, *, families=None, hits=None) -> CreditRule: ...

A rule's factory takes its validated options model and, by keyword, its ``inputs``: Python
objects no YAML file can hold (a scorer, a proposer, the trainer's continuations). Everyone
else reads the declaration instead of the factory: the run schema (``algos/config.py``)
validates ``credit.options`` against the options model, the RLlib trainer
(``algos/rllib/grpo.py``) and TRL's (``algos/trl.py``) supply what ``needs`` names, and
``docs/fidelity.md`` lists the labelled defaults (a test keeps the page and the models in step).

Whose each default is (``Origin``): "paper" where the rule's paper gives the value, "reference"
where its public reference implementation does and the paper does not, "ours" for this
project's choice (the field's description says why).

Pure Python and pydantic: importing this module never imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Origin = Literal["paper", "reference", "ours"]
ORIGINS: tuple[str, ...] = ("paper", "reference", "ours")


class Need(str, Enum):
    """What a rule needs from the trainer (or the run) besides the group's trajectories."""

    REWARD_ADVANTAGE = "reward_advantage"
    """it builds on the run reward's group advantages A_i, as handed in"""
    OUTCOME_REWARD = "outcome_reward"
    """the A_i it builds on is the environment's verifiable outcome's, as in its paper: the run's
    reward must be ``outcome`` on the rule's ``outcome_key``"""
    OUTCOME = "outcome"
    """it reads each trajectory's outcome itself (``metrics[outcome_key]``)"""
    VERDICTS = "verdicts"
    """one judge score per trajectory: the verdicts and the steps they cite"""
    GOLD_ANSWER = "gold_answer"
    """each task's gold answer (``task.metadata["answer"]``)"""
    BASE_POLICY = "base_policy"
    """a frozen reference model; the trainer gives its base model as ``reference_model``"""
    CONTINUATIONS = "continuations"
    """outcomes of the current policy continued from a restored prefix: ``continue_fn``"""


TRAINER_INPUTS: dict[Need, str] = {Need.BASE_POLICY: "reference_model", Need.CONTINUATIONS: "continue_fn"}
"""The keyword under which a trainer supplies what a need names, unless the options give it."""


def option(default: Any, origin: Origin, description: str, **bounds: Any) -> Any:
    """A rule option's field: its default, whose value the default is, and what it means
    (shown as "ORIGIN: DESCRIPTION" by ``python -m draco_gym.algos.config`` and in the docs)."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}, got {origin!r}")
    return Field(default, description=f"{origin}: {description}", json_schema_extra={"origin": origin}, **bounds)


class RuleOptions(BaseModel):
    """A rule's options: every field made with ``option``. Frozen, and an unknown key is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


NeedsDecl = Iterable[Need] | Callable[[Any], Iterable[Need]]


@dataclass(frozen=True)
class CreditSpec:
    """One rule's declaration (``credit_rule`` makes it): its ``options`` model, what it
    ``needs`` (a set, or a function of its validated options) and the ``inputs`` its factory
    takes by keyword."""

    name: str
    options: type[RuleOptions]
    needs_decl: NeedsDecl
    inputs: tuple[str, ...] = ()

    def needs(self, options: RuleOptions | None = None) -> frozenset[Need]:
        """What the rule needs with ``options`` (default: its defaults)."""
        decl = self.needs_decl
        if callable(decl):
            decl = decl(options if options is not None else self.options())
        return frozenset(decl)

    def option_names(self) -> list[str]:
        return list(self.options.model_fields)

    def accepted(self) -> list[str]:
        """Every key ``credit.options`` may hold: the options, then the inputs."""
        return [*self.option_names(), *self.inputs]

    def defaults(self) -> dict[str, tuple[Any, str, str]]:
        """option -> (default, origin, description without the origin)."""
        out = {}
        for name, field in self.options.model_fields.items():
            origin = (field.json_schema_extra or {}).get("origin", "ours")
            out[name] = (field.default, origin, (field.description or "").removeprefix(f"{origin}: "))
        return out

    def parse(self, given: Mapping[str, Any]) -> tuple[RuleOptions, dict[str, Any]]:
        """``given`` (a config's ``credit.options``) split into the validated options and the
        inputs; a ValueError names the rule, the key and what was wrong."""
        accepted = self.accepted()
        for key in given:
            if key not in accepted:
                hint = difflib.get_close_matches(str(key), accepted, n=1)
                raise ValueError(f"credit {self.name!r} takes no option {key!r}"
                                 + (f"; did you mean {hint[0]!r}?" if hint else "")
                                 + (f"; its options: {', '.join(accepted)}" if accepted else "; it takes none"))
        inputs = {k: v for k, v in given.items() if k in self.inputs}
        try:
            options = self.options(**{k: v for k, v in given.items() if k not in self.inputs})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e['input']!r})"
                                 for e in exc.errors())
            raise ValueError(f"credit {self.name!r} options: {problems}") from None
        return options, inputs

    def trainer_inputs(self, options: RuleOptions | None = None) -> dict[Need, str]:
        """The needs a trainer supplies for these options, each with its keyword."""
        return {need: TRAINER_INPUTS[need] for need in self.needs(options) if need in TRAINER_INPUTS}


def check_option_labels(options: type[RuleOptions]) -> None:
    """Every field of ``options`` was made with ``option`` (says whose its default is)."""
    for name, field in options.model_fields.items():
        if (field.json_schema_extra or {}).get("origin") not in ORIGINS:
            raise TypeError(f"{options.__name__}.{name}: declare it with credit.spec.option(default, origin, "
                            "description): whose value the default is must be said")
