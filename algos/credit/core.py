"""What every credit rule shares: group advantages, which turns are credit steps (and the
wrapper that runs every rule over them, ``CheckedRule``), steps to tokens.

Pure Python and numpy. A rule maps (a group's trajectories, its scores, the group
advantages A_i) to one advantage per step of each trajectory (``CreditRule``); each rule
lives in its own module and joins ``CREDIT_RULES`` there, by decorator (``registry.py``).

Whose is each value (paper: the DRACO paper; ours: this project's choice):

    A_i = (R_i - mean R) / (std R + eps)                                    paper (GRPO's)
    the std is the population std (divide by G)                             ours: the paper
        writes only "std" (sigma_g), which does not say population or sample
    eps = 1e-6; a group with no spread gives every A_i = 0                  ours
    a credit step is one code block                                         paper
    gap tokens (prompt, observations) get 0 and are outside N               paper ("gap tokens
        receive no credit and are excluded from the reallocation")
    a turn without code gets A_i ("trajectory", the default)                ours: the paper's
        steps are code blocks and it does not say what the closing message's tokens get;
        A_i is what GRPO gives them, and a full share (Q-bar over a few tokens) gave
        "Done." twice the per-token push of the step that computed the answer
    "attach": such a turn joins the preceding code step                     ours (an option)
    "gap": such a turn's tokens are gap tokens (advantage 0)                the paper's letter
        (a token outside every step gets none), an option
    a citation of a turn without code (trajectory, gap) moves no credit      ours: no step holds
        it; ``uncredited_citations`` counts them for the metrics
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Protocol, get_args

import numpy as np

from draco_gym.algos.credit.spec import RuleOptions
from draco_gym.metrics import group_advantages as group_advantages  # re-exported: the report uses the same A_i
from draco_gym.types import GAP, GroupScore, Trajectory, TrajectoryScore


class CreditRule(Protocol):
    def __call__(
        self, trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float]
    ) -> list[list[float]]: ...


# -- checks ------------------------------------------------------------------------------


def check_finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def outcome_number(trajectory: Trajectory, key: str, i: int) -> float:
    """``trajectory.metrics[key]`` (the environment's outcome) as a finite float, or a
    ValueError naming the trajectory and the metric; the caller decides what a missing
    metric means."""
    value = trajectory.metrics[key]
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"trajectories[{i}].metrics[{key!r}] must be a number or bool, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"trajectories[{i}].metrics[{key!r}] must be finite, got {value}")
    return value


def check_counts(values: Sequence[int], name: str, length: int | None = None) -> list[int]:
    if length is not None and len(values) != length:
        raise ValueError(f"{name} has {len(values)} entries, expected one per step ({length})")
    out = []
    for j, v in enumerate(values):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"{name}[{j}] must be a non-negative integer, got {v!r}")
        out.append(int(v))
    return out


# -- where a rule's base advantage comes from ---------------------------------------------------

BaseAdvantage = Literal["outcome", "reward"]
"""Where a rule with a ``base_advantage`` option (TRACE's A_out, ProVer's GRPO advantage) takes
its base: the group advantage of the environment's verifiable outcome, as in its paper
("outcome", the default), or, said on purpose, whatever reward the run uses ("reward"). The
run config refuses "outcome" with a reward other than ``outcome`` (``Need.OUTCOME_REWARD``)."""


# -- which turns are credit steps ------------------------------------------------------------

TurnsWithoutCode = Literal["trajectory", "attach", "gap"]
"""What credit does with a turn that has no code block (the closing message, ...):
"trajectory": it is no credit step, its tokens get the trajectory's A_i, as in GRPO (the
paper's step is one code block; the default); "attach": its tokens and the verdicts citing it
join the preceding code step (a turn before any code step still gets A_i); "gap": its tokens
are gap tokens and get advantage 0, the paper's letter (a token in no step gets no credit),
so a trajectory without any code step is not trained on at all. Under "trajectory" and
"gap" a verdict's citation of such a turn reaches no step (``uncredited_citations``). The run
schema's ``credit.turns_without_code`` is this same type."""

TURNS_WITHOUT_CODE: tuple[str, ...] = get_args(TurnsWithoutCode)


def credit_owners(trajectory: Trajectory, turns_without_code: str = "trajectory") -> list[int | None]:
    """For each step, the 1-based credit step whose advantage its tokens take: itself for a
    code step; for a turn without code, None (no step: A_i, or 0 under "gap") or, with
    "attach", the preceding code step."""
    if turns_without_code not in TURNS_WITHOUT_CODE:
        raise ValueError(f"turns_without_code must be one of {TURNS_WITHOUT_CODE}, got {turns_without_code!r}")
    owners: list[int | None] = []
    last: int | None = None
    for step in trajectory.steps:
        if step.is_credit_step:
            last = step.index
            owners.append(last)
        else:
            owners.append(last if turns_without_code == "attach" else None)
    return owners


def credit_view(trajectory: Trajectory, score: TrajectoryScore | None,
                owners: Sequence[int | None]) -> tuple[Trajectory, TrajectoryScore | None]:
    """The trajectory and its verdicts as a credit rule sees them: every turn keeps its number
    and text (TRACE renders them, ProVer replays them), but a turn without code has no tokens
    of its own (they count for its owner, if any) and no citations (those move to its owner,
    or are dropped). A rule therefore gives such a turn no share of the trajectory's push."""
    if all(owner == step.index for owner, step in zip(owners, trajectory.steps)):
        return trajectory, score
    if not any(step.is_credit_step for step in trajectory.steps):
        return trajectory, score  # nothing to redistribute over; every turn gets A_i afterwards
    tokens = [0] * len(trajectory.steps)
    for step, owner in zip(trajectory.steps, owners):
        if owner is not None:
            tokens[owner - 1] += step.n_tokens
    steps = [step.model_copy(update={"n_tokens": n}) for step, n in zip(trajectory.steps, tokens)]
    view = trajectory.model_copy(update={"steps": steps})
    if score is None:
        return view, None
    verdicts = []
    for v in score.verdicts:
        cited = sorted({owners[s - 1] for s in v.cited_steps if s <= len(owners) and owners[s - 1] is not None}
                       | {s for s in v.cited_steps if s > len(owners)})  # out of range: the rule reports it
        verdicts.append(v.model_copy(update={"cited_steps": cited}))
    return view, score.model_copy(update={"verdicts": verdicts})


def uncredited_citations(trajectory: Trajectory, score: TrajectoryScore | None, owners: Sequence[int | None]) -> int:
    """How many (verdict, cited turn) pairs of ``score`` point at a turn that has no credit
    step (``owners[j]`` None): citations that move no credit."""
    if score is None:
        return 0
    return sum(1 for v in score.verdicts for s in v.cited_steps if 1 <= s <= len(owners) and owners[s - 1] is None)


def from_credit_steps(step_advantages: Sequence[float], owners: Sequence[int | None], advantage: float) -> list[float]:
    """Each turn's advantage: its owner's a_j, or ``advantage`` where it has none (the
    trajectory's A_i; 0 under "gap")."""
    if len(step_advantages) != len(owners):
        raise ValueError(f"the rule gave {len(step_advantages)} step advantages for {len(owners)} steps")
    return [float(advantage) if owner is None else float(step_advantages[owner - 1]) for owner in owners]


# -- every rule, over credit steps -------------------------------------------------------


def check_group(trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float], *,
                reads_scores: bool) -> None:
    sizes = {"trajectories": len(trajectories), "advantages": len(advantages)}
    if reads_scores or group.scores:
        sizes["scores"] = len(group.scores)
    if len(set(sizes.values())) > 1:
        raise ValueError("group sizes differ: " + ", ".join(f"{n} {what}" for what, n in sizes.items()))


class CheckedRule:
    """A rule that checks its group and runs over credit steps only (``get_credit_rule`` wraps
    every rule in one): a rule sees turns without code with no tokens and no citations of
    their own (``credit_view``), and their tokens then get what ``turns_without_code`` says.
    Any other attribute is the rule's own (ProVer's ``stats`` and ``last``)."""

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


# -- steps to tokens -----------------------------------------------------------------------


def token_advantages(step_advantages: Sequence[float], token_step_index: Sequence[int]) -> list[float]:
    """Spread step advantages over tokens: a token of step j (1-based) gets a_j, a gap
    token (-1) gets 0. Vectorised: a long multi-turn batch has millions of tokens."""
    a = [check_finite(x, f"step_advantages[{j}]") for j, x in enumerate(step_advantages)]
    index = np.asarray(token_step_index)
    if not index.size:  # a trajectory without tokens (no policy tokenizer ran over it)
        return []
    if index.dtype.kind not in "iu":
        raise ValueError(f"token_step_index must hold integers, got dtype {index.dtype}")
    bad = np.flatnonzero((index != GAP) & ((index < 1) | (index > len(a))))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"token_step_index[{t}] is {index[t]}; expected -1 (gap) or a step in 1..{len(a)}")
    lookup = np.concatenate([[0.0], np.asarray(a, dtype=np.float64)])
    return lookup[np.where(index == GAP, 0, index)].tolist()
