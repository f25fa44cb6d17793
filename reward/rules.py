"""Judge-free transition rules after TRCA, and the rubric reward built on them.

Each step (transition) is checked against rule items grouped in three families:

    Evidence    (+)  the step gathered information the agent did not have
    Execution   (+)  the step ran and moved the task forward
    Invalidity  (-)  the step was malformed, failed, or repeated itself

A hit item scores its family's budget divided by the family's item count (negative for
Invalidity), so each family weighs the same whatever its number of items.

Public pieces, for TRCA credit and any other consumer:

    FAMILIES                      family name -> Family(sign, budget, items)
    transition_items(trajectory)  per step: {family: [item names hit]}
    item_score(family, item)      the signed score one hit of an item is worth
    foundational_rewards(traj)    per step: r^F = sum of the scores of its hit items

``RuleRubricReward`` turns the same hits into DRACO verdicts with step citations, so
the offline quickstart runs the whole pipeline (dropout, R_i, DRACO credit) with no judge:
a positive item PASSes if any step hit it (citing those steps) and otherwise FAILs at the
last step that ran code (where the missing behaviour mattered most); an Invalidity item
FAILs citing the steps that hit it and otherwise PASSes citing the steps that ran code.

Rules read ``Step.info`` when the environment filled it (``parse.error``,
``exec_error``, ``submitted``) and fall back to the text (a traceback in the observation),
so trajectories built outside our environments (e.g. from TRL completions) work too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group
from draco_gym.types import Criterion, GroupScore, Step, Task, Trajectory, Verdict


@dataclass(frozen=True)
class Family:
    sign: int
    budget: float
    items: tuple[str, ...]

    def item_score(self) -> float:
        return self.sign * self.budget / len(self.items)


FAMILIES: dict[str, Family] = {
    "evidence": Family(+1, 1.0, ("reads_documentation", "observes_output", "novel_observation")),
    "execution": Family(+1, 1.0, ("runs_cleanly", "recovers_from_error", "submits")),
    "invalidity": Family(-1, 1.0, ("malformed_block", "execution_error", "repeats_action", "missing_block")),
}

ITEM_TITLES: dict[str, str] = {
    "reads_documentation": "Reads API documentation before use",
    "observes_output": "Observes the output of its code",
    "novel_observation": "Obtains information not seen before",
    "runs_cleanly": "Runs code without errors",
    "recovers_from_error": "Changes approach after an error",
    "submits": "Signals that the task is complete",
    "malformed_block": "Writes a malformed code block",
    "execution_error": "Runs code that raises an error",
    "repeats_action": "Repeats an earlier action unchanged",
    "missing_block": "Sends a turn with no code",
}

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(?:Error|Exception)\b[:(]", re.MULTILINE)
_DOCS = re.compile(r"\bapi_docs\b|\bhelp\(|\bshow_api_(?:doc|descriptions)\b|\bdocumentation\b", re.IGNORECASE)


def _parse_error(step: Step) -> str | None:
    parse = step.info.get("parse") if isinstance(step.info, dict) else None
    return parse.get("error") if isinstance(parse, dict) else None


def _exec_error(step: Step) -> bool:
    if step.code is None:
        return False
    if "exec_error" in step.info:
        return step.info["exec_error"] is not None
    return bool(_TRACEBACK.search(step.observation))


def _normalized(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())


Rule = Callable[[Trajectory, int], bool]


def _reads_documentation(t: Trajectory, j: int) -> bool:
    step = t.steps[j]
    return step.code is not None and bool(_DOCS.search(step.code)) and not _exec_error(step)


def _observes_output(t: Trajectory, j: int) -> bool:
    step = t.steps[j]
    return step.code is not None and not _exec_error(step) and bool(step.observation.strip())


def _novel_observation(t: Trajectory, j: int) -> bool:
    step = t.steps[j]
    if not _observes_output(t, j):
        return False
    seen = {s.observation.strip() for s in t.steps[:j]}
    return step.observation.strip() not in seen


def _runs_cleanly(t: Trajectory, j: int) -> bool:
    return t.steps[j].code is not None and not _exec_error(t.steps[j])


def _recovers_from_error(t: Trajectory, j: int) -> bool:
    if j == 0 or not _runs_cleanly(t, j):
        return False
    previous = t.steps[j - 1]
    failed = _exec_error(previous) or _parse_error(previous) is not None
    return failed and (previous.code is None or _normalized(previous.code) != _normalized(t.steps[j].code))


def _submits(t: Trajectory, j: int) -> bool:
    return bool(t.steps[j].info.get("submitted"))


def _malformed_block(t: Trajectory, j: int) -> bool:
    return _parse_error(t.steps[j]) is not None


def _execution_error(t: Trajectory, j: int) -> bool:
    return _exec_error(t.steps[j])


def _repeats_action(t: Trajectory, j: int) -> bool:
    code = t.steps[j].code
    if code is None:
        return False
    mine = _normalized(code)
    return any(s.code is not None and _normalized(s.code) == mine for s in t.steps[:j])


def _missing_block(t: Trajectory, j: int) -> bool:
    # A turn without code is the normal ending under DRACO's no_code rule; anywhere else
    # (or under the task_completed rule, where the episode goes on) it is a wasted turn.
    step = t.steps[j]
    if step.code is not None or _parse_error(step) is not None:
        return False
    is_last = j == len(t.steps) - 1
    return not is_last or t.termination != "no_code"


RULES: dict[str, Rule] = {
    "reads_documentation": _reads_documentation,
    "observes_output": _observes_output,
    "novel_observation": _novel_observation,
    "runs_cleanly": _runs_cleanly,
    "recovers_from_error": _recovers_from_error,
    "submits": _submits,
    "malformed_block": _malformed_block,
    "execution_error": _execution_error,
    "repeats_action": _repeats_action,
    "missing_block": _missing_block,
}


def transition_items(trajectory: Trajectory) -> list[dict[str, list[str]]]:
    """For each step (index 0 is step 1): ``{family: [names of the items it hit]}``,
    every family present, items in the family's order."""
    return [
        {family: [item for item in spec.items if RULES[item](trajectory, j)] for family, spec in FAMILIES.items()}
        for j in range(len(trajectory.steps))
    ]


def item_score(family: str, item: str) -> float:
    """What one hit of ``item`` scores: +-(family budget / family item count)."""
    spec = FAMILIES[family]
    if item not in spec.items:
        raise KeyError(f"{item!r} is not an item of family {family!r}; items: {spec.items}")
    return spec.item_score()


def foundational_rewards(trajectory: Trajectory) -> list[float]:
    """TRCA's foundational reward r^F per step: the sum of its hit items' scores."""
    return [
        sum(FAMILIES[family].item_score() * len(items) for family, items in hits.items())
        for hits in transition_items(trajectory)
    ]


RULE_CRITERIA: tuple[Criterion, ...] = tuple(
    Criterion(
        title=ITEM_TITLES[item],
        description=f"{family.capitalize()} rule '{item}' ({'rewarded' if spec.sign > 0 else 'penalised'}).",
        evaluator_instruction="Decided by code from the step's code, observation and environment info.",
        origin="rule",
    )
    for family, spec in FAMILIES.items()
    for item in spec.items
)


def _had_error(trajectory: Trajectory) -> bool:
    return any(_exec_error(s) or _parse_error(s) is not None for s in trajectory.steps)


def rule_verdicts(trajectory: Trajectory) -> list[Verdict]:
    """One verdict per rule item (in ``RULE_CRITERIA`` order), citing the steps behind it.

    A positive item never hit FAILs at the last step that ran code: the action that ended
    the work without it (the closing message after it did nothing). "Changes approach after
    an error" is not applicable when nothing failed.
    """
    hits = transition_items(trajectory)
    n = len(trajectory.steps)
    with_code = [j + 1 for j in range(n) if trajectory.steps[j].code is not None] or list(range(1, n + 1))
    last_action = [with_code[-1]] if n else []
    verdicts = []
    for family, spec in FAMILIES.items():
        for item in spec.items:
            steps = [j + 1 for j, h in enumerate(hits) if item in h[family]]
            title = ITEM_TITLES[item]
            if spec.sign > 0:
                if steps:
                    verdicts.append(Verdict(criterion=title, score=1, cited_steps=steps, evidence=f"hit at steps {steps}"))
                elif item == "recovers_from_error" and not _had_error(trajectory):
                    verdicts.append(Verdict(criterion=title, score=0, evidence="no step failed"))
                else:
                    verdicts.append(Verdict(criterion=title, score=-1, cited_steps=last_action,
                                            evidence="never hit", justification="missing when the agent stopped acting"))
            elif steps:
                verdicts.append(Verdict(criterion=title, score=-1, cited_steps=steps, evidence=f"hit at steps {steps}"))
            else:
                verdicts.append(Verdict(criterion=title, score=1, cited_steps=with_code if n else [], evidence="never hit"))
    return verdicts


@REWARDS.register("rule")
class RuleRubricReward(RubricReward):
    """Judge-free rubric reward from the transition rules (see the module docstring):
    microseconds per trajectory, no network, verdicts with step citations."""

    name = "rule"

    def __init__(self, *, dropout: bool = True) -> None:
        self.dropout = dropout

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return self.score_group(task, trajectories)

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        verdicts = [rule_verdicts(t) for t in trajectories]
        return finalize_group(list(RULE_CRITERIA), verdicts, dropout=self.dropout)
