"""TRCA: step credit from rule rubrics on each transition, on top of the outcome.

A rule rubric checks every transition (one code step and what it produced) against the
task's operator library (``draco_gym.reward.rules.rule_library``): items in three families,
Evidence (+, the step surfaced information the task needs), Execution (+, the step carried
out one of the task's subgoals) and Invalidity (-, the step was malformed, failed or wasted
a turn). TRCA turns the items hit into rewards per step, adds the environment's reward, and
compares the resulting returns between steps of the group that faced the same situation:

    s_c      = B_c / M_c                 score of one item of family c (budget over item count)
    r^F_t    = sum_c sign_c * s_c * |hit_t(c)|            foundational: what step t did
    Phi_t    = sum_{c positive} s_c * |covered_t(c)|      potential: items ever hit up to t
    r^B_t    = Phi_t - Phi_{t-1},  Phi_0 = 0              breakthrough: items hit for the first time
    r_t      = (1 - lambda) * r^F_t + lambda * r^B_t      the TRCA reward
    R_t      = sum_{k >= t} gamma^(k-t) * (r_env_k + r_k) the return
    A_i      = (o_i - mean o) / (std o + eps), 0 for every rollout of a group with no success
    a_t      = A_i + w * (R_t - mean_s R) / (std_s R + eps)

where o_i is the rollout's outcome (``metrics["success"]``) and the mean and std of the
step term run over the group's steps that share a context key s: the state the step was
taken in (GiGPO's anchor states), which the environment names in ``Step.info["state_key"]``
(``draco_gym.types.STATE_KEY``); where an environment names none, the observation the step
answered stands in. A key seen fewer than twice, or with no spread, gives 0.

Repetition earns nothing new: re-reading the same record hits an Evidence item again (r^F)
but covers nothing new (r^B = 0); with lambda = 0.8 most of the reward is breakthrough.

Whose number each default is:
    lambda = 0.8                       paper
    gamma = 0.95                       paper
    R_t sums r_env and r_TRCA          paper
    A_i from the outcome, 0 in a
      group with no success            paper
    steps grouped by environment
      state                            paper (GiGPO's anchor states)
    r_env = the outcome at the last
      step, 0 before                   ours: our environments' Gymnasium reward is 0, so the
                                       sparse reward the paper's environments give is read
                                       from the episode's outcome
    family budgets B_c = 1             ours (the paper gives none)
    the items                          ours: the paper's operator libraries are per
                                       benchmark; ours are built from each task
                                       (``rule_library``), generic items as the fallback
    the state keys                     ours, per environment (see their docstrings)
    step_weight w = 1 (a plain sum)    ours
    eps = 1e-6, 0 for a lone or
      spreadless key                   ours
    success = outcome >= 1             ours (``success_threshold``)
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import field_validator

from draco_gym.algos.credit.core import CreditRule, group_advantages, outcome_number
from draco_gym.algos.credit.registry import credit_rule
from draco_gym.algos.credit.spec import Need, RuleOptions, option
from draco_gym.types import STATE_KEY, GroupScore, Step, Task, Trajectory

__all__ = [
    "CONTEXT_KEYS",
    "RuleFamily",
    "TRCAOptions",
    "TRCARule",
    "outcome_advantages",
    "discounted_returns",
    "normalise_by_key",
    "trca_credit",
    "trca_step_rewards",
]


# -- context keys: which steps of a group count as comparable ------------------------------


def _digest(text: str | None) -> str:
    return hashlib.sha1((text or "").encode("utf-8", "replace")).hexdigest()[:16]


def _answered(traj: Trajectory, step: Step) -> str:
    """A digest of the observation the step answered (the agent prompt for step 1)."""
    return _digest(traj.steps[step.index - 2].observation if step.index > 1 else traj.task.agent_prompt)


def _state(traj: Trajectory, step: Step) -> Hashable:
    key = step.info.get(STATE_KEY)
    return ("state", key) if isinstance(key, str) else ("answered", _answered(traj, step))


CONTEXT_KEYS: dict[str, Callable[[Trajectory, Step], Hashable]] = {
    # the environment state the step was taken in (the paper's grouping, GiGPO's anchor
    # states): Step.info["state_key"], or the observation it answered where the env names none
    "state": _state,
    # the same turn number across rollouts
    "index": lambda traj, step: step.index,
    # the same observation answered (the prompt for step 1)
    "context": _answered,
    # the same action: identical code, wherever it ran
    "code": lambda traj, step: _digest(step.code),
}


# -- the options ---------------------------------------------------------------------------


class TRCAOptions(RuleOptions):
    """TRCA's options (``credit.options`` of a run config), each labelled with whose value its
    default is."""

    lam: float = option(0.8, "paper", "r = (1 - lam) r^F + lam r^B", ge=0, le=1)
    gamma: float = option(0.95, "paper", "discount of the return of r_env + r_TRCA", ge=0, le=1)
    step_weight: float = option(1.0, "ours", "a_t = A_i + step_weight * normalised return (1: a plain sum; the paper writes no weight)",
                                allow_inf_nan=False)
    context_key: str | Callable[[Trajectory, Step], Hashable] = option(
        "state", "paper", "which steps are compared: state (the env's Step.info['state_key'], else the "
                          "observation answered; GiGPO's anchor states), index (the turn number), context (the "
                          "observation answered), code (identical code), or a callable (trajectory, step) -> key")
    episode_advantage: Literal["outcome", "reward"] = option(
        "outcome", "paper", "A_i from the outcome, 0 in a group with no success (reward: the reward's A_i)")
    env_reward: Literal["outcome", "none"] = option(
        "outcome", "ours", "r_env: the outcome at the last step, for envs whose Gymnasium reward is 0 (none: no r_env)")
    outcome_key: str = option("success", "ours", "the Trajectory.metrics entry holding the outcome")
    success_threshold: float = option(1.0, "ours", "a rollout succeeded when its outcome is at least this",
                                      allow_inf_nan=False)

    @field_validator("context_key")
    @classmethod
    def _known_key(cls, value):
        if not callable(value) and value not in CONTEXT_KEYS:
            raise ValueError(f"context_key must be a callable or one of {sorted(CONTEXT_KEYS)}, got {value!r}")
        return value


DEFAULTS = TRCAOptions()


def trca_needs(options: TRCAOptions) -> set[Need]:
    """The outcome where the episode advantage or r_env comes from it; the reward's A_i where
    the episode advantage does."""
    needs = set()
    if "outcome" in (options.episode_advantage, options.env_reward):
        needs.add(Need.OUTCOME)
    if options.episode_advantage == "reward":
        needs.add(Need.REWARD_ADVANTAGE)
    return needs


# -- the arithmetic ------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleFamily:
    """One family of rule items. ``sign`` is +1 for a rewarded family, -1 for a penalised
    one; ``budget`` B_c is the most the family can give (or take) if every item is hit."""

    name: str
    sign: int
    budget: float
    items: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.sign not in (1, -1):
            raise ValueError(f"family {self.name!r}: sign must be +1 or -1, got {self.sign!r}")
        if not (math.isfinite(self.budget) and self.budget >= 0):
            raise ValueError(f"family {self.name!r}: budget must be a finite number >= 0, got {self.budget!r}")
        if not self.items:
            raise ValueError(f"family {self.name!r}: items must not be empty")
        if len(set(self.items)) != len(self.items):
            raise ValueError(f"family {self.name!r}: items must be distinct, got {list(self.items)}")

    @property
    def item_score(self) -> float:
        """s_c = B_c / M_c."""
        return self.budget / len(self.items)


StepHits = Mapping[str, Collection[str]]
"""The items one transition hit, per family name (a family not listed hit nothing)."""


def _families_by_name(families: Sequence[RuleFamily]) -> dict[str, RuleFamily]:
    by_name: dict[str, RuleFamily] = {}
    for fam in families:
        if fam.name in by_name:
            raise ValueError(f"families: {fam.name!r} appears twice")
        by_name[fam.name] = fam
    if not by_name:
        raise ValueError("families must not be empty")
    return by_name


def trca_step_rewards(
    hits: Sequence[StepHits], families: Sequence[RuleFamily] | None = None, lam: float = DEFAULTS.lam
) -> tuple[list[float], list[float], list[float]]:
    """Per-step (r^F, r^B, r) for one trajectory; ``hits[t]`` are the items step t+1 hit.
    ``families`` default to the reward layer's rule families."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    fams = _families_by_name(families_from_reward() if families is None else families)
    covered: dict[str, set[str]] = {name: set() for name, f in fams.items() if f.sign > 0}
    r_f, r_b, r = [], [], []
    phi_prev = 0.0
    for t, step_hits in enumerate(hits, start=1):
        foundational = 0.0
        for name, items in step_hits.items():
            fam = fams.get(name)
            if fam is None:
                raise ValueError(f"hits[{t - 1}]: unknown family {name!r}; known: {sorted(fams)}")
            items = set(items)
            unknown = items - set(fam.items)
            if unknown:
                raise ValueError(f"hits[{t - 1}][{name!r}]: unknown items {sorted(unknown)}; known: {list(fam.items)}")
            foundational += fam.sign * fam.item_score * len(items)
            if fam.sign > 0:
                covered[name] |= items
        phi = sum(fams[name].item_score * len(c) for name, c in covered.items())
        breakthrough = phi - phi_prev
        phi_prev = phi
        r_f.append(foundational)
        r_b.append(breakthrough)
        r.append((1.0 - lam) * foundational + lam * breakthrough)
    return r_f, r_b, r


def discounted_returns(rewards: Sequence[float], gamma: float = DEFAULTS.gamma) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, G_{T+1} = 0."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    out, g = [], 0.0
    for x in reversed(rewards):
        g = float(x) + gamma * g
        out.append(g)
    return out[::-1]


def normalise_by_key(
    values: Sequence[Sequence[float]], keys: Sequence[Sequence[Hashable]], eps: float = 1e-6
) -> list[list[float]]:
    """(v - mean_k) / (std_k + eps) over all steps of the group that share key k
    (population std); 0 for a key with fewer than two steps or no spread."""
    if len(values) != len(keys):
        raise ValueError(f"values has {len(values)} trajectories but keys has {len(keys)}")
    pools: dict[Hashable, list[float]] = defaultdict(list)
    for i, (vs, ks) in enumerate(zip(values, keys)):
        if len(vs) != len(ks):
            raise ValueError(f"trajectory {i}: {len(vs)} values but {len(ks)} keys")
        for v, k in zip(vs, ks):
            pools[k].append(float(v))
    stats = {}
    for k, pool in pools.items():
        mean = sum(pool) / len(pool)
        std = math.sqrt(sum((x - mean) ** 2 for x in pool) / len(pool))
        stats[k] = (mean, std) if len(pool) >= 2 and std > 1e-12 else None
    return [
        [0.0 if stats[k] is None else (v - stats[k][0]) / (stats[k][1] + eps) for v, k in zip(vs, ks)]
        for vs, ks in zip(values, keys)
    ]


def trca_credit(
    group_hits: Sequence[Sequence[StepHits]],
    advantages: Sequence[float],
    keys: Sequence[Sequence[Hashable]] | None = None,
    families: Sequence[RuleFamily] | None = None,
    lam: float = DEFAULTS.lam,
    gamma: float = DEFAULTS.gamma,
    step_weight: float = DEFAULTS.step_weight,
    env_rewards: Sequence[Sequence[float]] | None = None,
) -> list[list[float]]:
    """a_t = A_i + w * normalised R_t for every step of every trajectory of one group, with
    R_t the discounted return of r_env + r_TRCA (``env_rewards[i][t]``, 0 when None).

    ``keys`` default to the step number (1, 2, ...): step t is compared with step t of the
    other rollouts.
    """
    if len(group_hits) != len(advantages):
        raise ValueError(f"group_hits has {len(group_hits)} trajectories but advantages has {len(advantages)}")
    if not math.isfinite(step_weight):
        raise ValueError(f"step_weight must be finite, got {step_weight!r}")
    if env_rewards is None:
        env_rewards = [[0.0] * len(h) for h in group_hits]
    if len(env_rewards) != len(group_hits):
        raise ValueError(f"env_rewards has {len(env_rewards)} trajectories but group_hits has {len(group_hits)}")
    families = families_from_reward() if families is None else families
    returns = []
    for i, (hits, r_env) in enumerate(zip(group_hits, env_rewards)):
        if len(r_env) != len(hits):
            raise ValueError(f"trajectory {i}: {len(r_env)} env rewards but {len(hits)} steps")
        r_trca = trca_step_rewards(hits, families, lam)[2]
        returns.append(discounted_returns([float(e) + r for e, r in zip(r_env, r_trca)], gamma))
    if keys is None:
        keys = [list(range(1, len(h) + 1)) for h in group_hits]
    step_adv = normalise_by_key(returns, keys)
    out = []
    for i, (a, s) in enumerate(zip(advantages, step_adv)):
        a = float(a)
        if not math.isfinite(a):
            raise ValueError(f"advantages[{i}] must be finite, got {a}")
        out.append([a + step_weight * x for x in s])
    return out


def outcome_advantages(outcomes: Sequence[float], success_threshold: float = DEFAULTS.success_threshold) -> list[float]:
    """TRCA's episode advantage: the group-relative advantage of the outcome, and 0 for every
    rollout of a group where none succeeded (outcome >= ``success_threshold``), so partial
    outcomes (a share of tests passed) move nothing until some rollout succeeds."""
    if not any(o >= success_threshold for o in outcomes):
        return [0.0] * len(outcomes)
    return group_advantages(outcomes)


def _resolve_key(key: str | Callable[[Trajectory, Step], Hashable]) -> Callable[[Trajectory, Step], Hashable]:
    if callable(key):
        return key
    try:
        return CONTEXT_KEYS[key]
    except KeyError:
        raise ValueError(f"context_key must be a callable or one of {sorted(CONTEXT_KEYS)}, got {key!r}") from None


def hits_from_step_info(traj: Trajectory, info_key: str = "rule_items") -> list[dict[str, list[str]]]:
    """Items per step from ``step.info[info_key]`` ({family: [items]}), where a rule rubric
    that annotates steps leaves them."""
    out = []
    for step in traj.steps:
        value = step.info.get(info_key, {})
        if not isinstance(value, Mapping):
            raise ValueError(f"steps[{step.index - 1}].info[{info_key!r}] must map family -> items, got {type(value).__name__}")
        out.append({k: list(v) for k, v in value.items()})
    return out


def families_from_reward(task: Task | None = None) -> tuple[RuleFamily, ...]:
    """The reward layer's rule families for ``task`` (its operator library,
    ``draco_gym.reward.rules.rule_library``), or the generic ones, as TRCA's."""
    from draco_gym.reward.rules import FAMILIES, rule_library

    fams = FAMILIES if task is None else rule_library(task).families
    return tuple(RuleFamily(name, f.sign, f.budget, tuple(f.items)) for name, f in fams.items())


def _outcome(traj: Trajectory, key: str, i: int) -> float:
    if key not in traj.metrics:
        raise ValueError(
            f"trajectories[{i}].metrics[{key!r}] is missing: TRCA's episode advantage and environment reward come "
            f"from the outcome (the paper's reading). Use an environment that reports {key!r}, name another metric "
            "with outcome_key, or set episode_advantage='reward' and env_reward='none' for an outcome-blind variant"
        )
    return outcome_number(traj, key, i)


# -- the registry entry --------------------------------------------------------------------


@credit_rule("trca", TRCAOptions, needs=trca_needs, inputs=("families", "hits"))
def trca_rule(options: TRCAOptions, *, families: Sequence[RuleFamily] | None = None,
              hits: Callable[[Trajectory], Sequence[StepHits]] | None = None) -> CreditRule:
    """TRCA over the task's operator library (``rule_library``) unless ``hits`` and
    ``families`` say otherwise; see ``TRCAOptions`` for the rest."""
    return TRCARule(options, families, hits)


class TRCARule:
    """TRCA for one group (a ``CreditRule``). ``episode_advantages`` gives the A_i it builds
    on, for whoever assigns a trajectory-level advantage outside the steps it credits (the
    tokens of a turn without code get A_i): under the paper's reading that is the outcome's
    A_i, not the rubric reward's that the trainer passes in."""

    def __init__(self, opts: TRCAOptions, families: Sequence[RuleFamily] | None = None,
                 hits: Callable[[Trajectory], Sequence[StepHits]] | None = None) -> None:
        self.opts = opts
        self.families = tuple(families) if families is not None else None
        self.hits = hits
        self.key_of = _resolve_key(opts.context_key)

    def _outcomes(self, trajectories: Sequence[Trajectory]) -> list[float]:
        return [_outcome(t, self.opts.outcome_key, i) for i, t in enumerate(trajectories)]

    def episode_advantages(self, trajectories: Sequence[Trajectory], group: GroupScore,
                           advantages: Sequence[float]) -> list[float]:
        """A_i: from the outcome (0 in a group with no success), or ``advantages`` as given."""
        if self.opts.episode_advantage == "reward":
            return [float(a) for a in advantages]
        return outcome_advantages(self._outcomes(trajectories), self.opts.success_threshold)

    def __call__(self, trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float]) -> list[list[float]]:
        if not trajectories:
            return []
        opts = self.opts
        if self.hits is None:
            from draco_gym.reward.rules import rule_library

            library = rule_library(trajectories[0].task)
            group_hits = [library.transition_items(t) for t in trajectories]
        else:
            group_hits = [self.hits(t) for t in trajectories]
        fams = self.families if self.families is not None else families_from_reward(trajectories[0].task)
        episode = self.episode_advantages(trajectories, group, advantages)
        env = None
        if opts.env_reward == "outcome":  # sparse: the outcome arrives with the last step
            env = [[0.0] * (len(t.steps) - 1) + [o] if t.steps else []
                   for t, o in zip(trajectories, self._outcomes(trajectories))]
        keys = [[self.key_of(t, s) for s in t.steps] for t in trajectories]
        return trca_credit(group_hits, episode, keys, fams, opts.lam, opts.gamma, opts.step_weight, env)
