"""Judge-free transition rules after TRCA, and the rubric reward built on them.

Each step (transition) is checked against rule items grouped in three families:

    Evidence    (+)  the step surfaced information the task needs
    Execution   (+)  the step carried out one of the task's subgoals
    Invalidity  (-)  the step was malformed, failed, or wasted a turn

A hit item scores its family's budget divided by the family's item count (negative for
Invalidity), so each family weighs the same whatever its number of items. The budgets (1.0
each) are ours: the paper gives no values.

**Measured from what ran, never from the code's text.** Agent code is under optimisation
pressure: a comment naming a tool calls nothing, and ``print('hi')`` shows output without
learning anything. So an item reads only what the environment recorded outside the agent's
process: the tool calls a block made (``Step.info["tool_calls"]``, ``draco_gym.types.
TOOL_CALLS``: name and whether the tool returned, in call order), whether the block raised
(``exec_error``), whether the environment saw the task submitted (``submitted``), and
whether the message held a well-formed block (``parse.error``). A trajectory from an
environment that records no tool calls (``TOOL_CALLS`` absent, e.g. TRL completions that
nothing ran) hits no tool item: no text stands in for a call.

Which items a task gets is its operator library (``rule_library(task)``), as in TRCA's
per-benchmark operator libraries: items that test task-relevant evidence and subgoals, built
from what the environment declares in ``Task.metadata``:

    metadata["operators"]  {"evidence": [tool names], "execution": [tool names]}: the calls
                           the task needs, e.g. AppWorld's ``apis.venmo.show_transactions``
                           (evidence) and ``apis.venmo.create_transaction`` (execution),
                           built by the environment from the task (the offline suite's
                           reference solution, real AppWorld's API set). An item "calls X"
                           is hit by a step that made a recorded call of X that returned
                           (a name matches with or without AppWorld's ``apis.`` prefix).
                           A declaration may name the call's target as keyword arguments of
                           plain values, ``get_product(product_id='P109')``: then only a
                           recorded call with those arguments (``"arguments"`` of
                           ``TOOL_CALLS``, as the tool received them) hits it, and where it
                           is never hit its FAIL cites the steps that called X with other
                           arguments (the wrong lookup), not nothing.
    metadata["api_docs"]   True when the environment has API documentation the agent is
                           meant to read (AppWorld's ``apis.api_docs``); only then is
                           "Reads the API documentation" an item (a recorded call of an
                           ``api_docs`` tool that returned).

Without operators the generic items below are the positive families' fallback (Invalidity
is always generic): "Gets a result from a tool" is hit by a recorded call that returned and
is neither the submission (a call the environment marks ``"submits": True``, or named
``submit`` / ``complete_task``: PythonTools' and AppWorld's) nor documentation. Repetition
is not an item: re-running an action covers nothing new, so TRCA's breakthrough reward (the
rise in coverage) gives it nothing, and that is where the paper scores it.

**The outcome, where the environment checks it.** Which calls ran cannot tell a right
answer from a wrong one: a right lookup then a wrong ``submit`` hits every item the reference
hits. So a group whose rollouts carry the environment's own check (a boolean
``metrics["success"]``: the shop's exact answer, AppWorld's tests on the end state) gets
``OUTCOME_CRITERION`` first, "Submits the right answer", PASS or FAIL by that check, cited at
the step that handed the result in; a wrong solution then always FAILs a criterion the
reference PASSes, so the rubric never ranks it at or above a correct one. It is a verdict,
not a transition item: TRCA's rule families never read the outcome.

A criterion's title says what passing means: a positive item PASSes if some step hit it
(citing those steps) and otherwise FAILs citing no step (an omission: no step did it, so none
is held responsible); an Invalidity item ("Writes no code that raises an error") PASSes
citing the steps that ran code when no step hit it, and otherwise FAILs citing the steps
that did.

Why an omission cites nothing: DRACO's step quality Q_j counts only the verdicts that cite
step j, so an uncited FAIL lowers R_i (and A_i) and leaves the redistribution over the steps
as the steps' own verdicts decide it. Cited at one step, it would make that step carry the
whole omission: a loser's step suppressed for what never happened, and a winner's other
steps pushed harder (a short step that raised took 4.25 A_i per token in
``tests/test_reward_rules.py::test_an_omission_moves_no_step_credit``; 2.83 A_i uncited).
A judge has read the rollout and cites an absence where it mattered most (DRACO's stage 5);
code that only sees which calls were made has no such place to point at.

Public pieces, for TRCA credit and any other consumer:

    rule_library(task)            the task's RuleLibrary: families, item titles, rules
    FAMILIES                      the generic families (no operators, no API docs)
    transition_items(trajectory)  per step: {family: [item names hit]} (the task's library)
    item_score(family, item)      the signed score one hit of a generic item is worth
    foundational_rewards(traj)    per step: r^F = sum of the scores of its hit items

``RuleRubricReward`` turns the same hits into DRACO verdicts with step citations, so
the offline quickstart runs the whole pipeline (dropout, R_i, DRACO credit) with no judge.

Where a trajectory lacks ``exec_error`` (built outside our environments), a traceback in
the observation (the environment's output, not the code) marks the block as failed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group
from draco_gym.types import TOOL_CALLS, Criterion, GroupScore, Step, Task, Trajectory, Verdict


@dataclass(frozen=True)
class Family:
    sign: int
    budget: float
    items: tuple[str, ...]

    def item_score(self) -> float:
        return self.sign * self.budget / len(self.items)


BUDGET = 1.0
"""Every family's budget B_c (ours: the paper states none)."""

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(?:Error|Exception)\b[:(]", re.MULTILINE)

SUBMIT_TOOLS = ("submit", "complete_task")
"""Names (the last dotted part) of the tools that hand in the task: PythonTools' ``submit``,
AppWorld's ``apis.supervisor.complete_task``. Submitting is not evidence."""
DOC_TOOL_PART = "api_docs"
"""A dotted name part that marks a documentation tool (AppWorld's ``apis.api_docs.*``)."""


def tool_name(name: str) -> str:
    """A recorded or declared tool name without AppWorld's ``apis.`` prefix, so that
    ``apis.venmo.show_transactions`` and ``venmo.show_transactions`` name one tool."""
    return name.removeprefix("apis.")


def tool_calls(step: Step) -> list[dict] | None:
    """The step's recorded tool calls (None: the environment records none). A malformed
    record is the environment's bug and raises, naming the step."""
    calls = step.info.get(TOOL_CALLS) if isinstance(step.info, dict) else None
    if calls is None:
        return None
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("ok"), bool) for c in calls):
        raise ValueError(f"step {step.index}: info[{TOOL_CALLS!r}] must be a list of {{'name': str, 'ok': bool}} "
                         f"(draco_gym.types.TOOL_CALLS), got {calls!r}")
    return calls


def _returned(step: Step) -> list[str]:
    """Names of the step's recorded calls that returned (no prefix), in call order."""
    return [tool_name(c["name"]) for c in tool_calls(step) or [] if c["ok"]]


def _submits_call(call: dict) -> bool:
    return call.get("submits") is True or tool_name(call["name"]).rsplit(".", 1)[-1] in SUBMIT_TOOLS


def _is_docs(name: str) -> bool:
    return DOC_TOOL_PART in tool_name(name).split(".")


def _parse_error(step: Step) -> str | None:
    parse = step.info.get("parse") if isinstance(step.info, dict) else None
    return parse.get("error") if isinstance(parse, dict) else None


def _exec_error(step: Step) -> bool:
    if step.code is None:
        return False
    if "exec_error" in step.info:
        return step.info["exec_error"] is not None
    return bool(_TRACEBACK.search(step.observation))


Rule = Callable[[Trajectory, int], bool]


def _reads_documentation(t: Trajectory, j: int) -> bool:
    return any(_is_docs(name) for name in _returned(t.steps[j]))


def _gets_tool_result(t: Trajectory, j: int) -> bool:
    return any(c["ok"] and not _submits_call(c) and not _is_docs(c["name"]) for c in tool_calls(t.steps[j]) or [])


def _runs_cleanly(t: Trajectory, j: int) -> bool:
    return t.steps[j].code is not None and not _exec_error(t.steps[j])


def _failed(step: Step) -> bool:
    return _exec_error(step) or _parse_error(step) is not None or any(not c["ok"] for c in tool_calls(step) or [])


def _recovers_from_error(t: Trajectory, j: int) -> bool:
    """After a failed step, one that works: runs cleanly and, where the environment records
    tool calls, gets a result from a tool (an empty block runs cleanly too)."""
    if j == 0 or not _failed(t.steps[j - 1]) or not _runs_cleanly(t, j):
        return False
    return tool_calls(t.steps[j]) is None or _gets_tool_result(t, j)


def _submits(t: Trajectory, j: int) -> bool:
    return bool(t.steps[j].info.get("submitted"))


def _malformed_block(t: Trajectory, j: int) -> bool:
    return _parse_error(t.steps[j]) is not None


def _execution_error(t: Trajectory, j: int) -> bool:
    return _exec_error(t.steps[j])


def _tool_error(t: Trajectory, j: int) -> bool:
    return any(not c["ok"] for c in tool_calls(t.steps[j]) or [])


def _missing_block(t: Trajectory, j: int) -> bool:
    # A turn without code is the normal ending under DRACO's no_code rule; anywhere else
    # (or under the task_completed rule, where the episode goes on) it is a wasted turn.
    step = t.steps[j]
    if step.code is not None or _parse_error(step) is not None:
        return False
    is_last = j == len(t.steps) - 1
    return not is_last or t.termination != "no_code"


# name -> (title saying what PASS means, rule saying whether a step hit the item)
GENERIC_ITEMS: dict[str, tuple[str, Rule]] = {
    "reads_documentation": ("Reads the API documentation", _reads_documentation),
    "gets_tool_result": ("Gets a result from a tool", _gets_tool_result),
    "runs_cleanly": ("Has code that runs without errors", _runs_cleanly),
    "recovers_from_error": ("After a failed step, takes one that works", _recovers_from_error),
    "submits": ("Submits the task", _submits),
    "malformed_block": ("Writes no malformed code block", _malformed_block),
    "execution_error": ("Writes no code that raises an error", _execution_error),
    "tool_error": ("Makes no tool call that fails", _tool_error),
    "missing_block": ("Leaves no turn without code before the end", _missing_block),
}

GENERIC_FAMILIES: dict[str, tuple[str, ...]] = {
    "evidence": ("gets_tool_result",),
    "execution": ("runs_cleanly", "recovers_from_error", "submits"),
    "invalidity": ("malformed_block", "execution_error", "tool_error", "missing_block"),
}
SIGNS = {"evidence": +1, "execution": +1, "invalidity": -1}
OPERATOR_FAMILIES = ("evidence", "execution")
OPERATOR_PREFIX = "calls:"
"""Operator items are named ``calls:<tool>``, e.g. ``calls:apis.venmo.show_transactions``."""


@dataclass(frozen=True)
class Operator:
    """One call a task needs, as declared: a tool name, and optionally the keyword
    arguments it must be called with (``get_product(product_id='P109')``: the lookup of
    that product, not of any)."""

    text: str
    name: str
    arguments: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, text: str, where: str) -> Operator:
        if re.fullmatch(r"[A-Za-z_][\w.]*", text):
            return cls(text, text)
        try:
            call = ast.parse(text, mode="eval").body
            if not isinstance(call, ast.Call) or call.args or not re.fullmatch(r"[A-Za-z_][\w.]*", ast.unparse(call.func)):
                raise ValueError
            arguments = tuple((k.arg, ast.literal_eval(k.value)) for k in call.keywords)
            if any(k is None or not (v is None or isinstance(v, (str, int, float, bool))) for k, v in arguments):
                raise ValueError
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            raise ValueError(f"{where}: {text[:200]!r} is neither a callable name like 'apis.app.api' nor a call with "
                             "keyword arguments of plain values like \"get_product(product_id='P101')\"") from None
        return cls(text, ast.unparse(call.func), arguments)

    def called(self, call: dict) -> bool:
        """The recorded call is of this operator's tool."""
        return tool_name(call["name"]) == tool_name(self.name)

    def matches(self, call: dict) -> bool:
        """The recorded call is of this tool, with the declared arguments (text compared
        case- and space-insensitively), as the environment recorded them (``"arguments"``
        of ``TOOL_CALLS``: an environment that records none matches no declared argument)."""
        if not self.called(call):
            return False
        recorded = call.get("arguments")
        if not self.arguments:
            return True
        return isinstance(recorded, dict) and all(k in recorded and _same(v, recorded[k]) for k, v in self.arguments)


def _same(declared: object, recorded: object) -> bool:
    if isinstance(declared, str) and isinstance(recorded, str):
        return " ".join(declared.split()).casefold() == " ".join(recorded.split()).casefold()
    return type(declared) is type(recorded) and declared == recorded or (
        isinstance(declared, (int, float)) and isinstance(recorded, (int, float))
        and not isinstance(declared, bool) and not isinstance(recorded, bool) and declared == recorded)


def _calls(operator: Operator) -> Rule:
    """A step hits "calls X" when it made a recorded call of X (with the declared arguments,
    if any) that returned; a submitting tool (``SUBMIT_TOOLS``) is also hit where the
    environment saw the step submit, for environments that record the submission but not
    as a tool call."""
    submitting = tool_name(operator.name).rsplit(".", 1)[-1] in SUBMIT_TOOLS and not operator.arguments

    def rule(t: Trajectory, j: int) -> bool:
        return any(c["ok"] and operator.matches(c) for c in tool_calls(t.steps[j]) or []) or (
            submitting and _submits(t, j))

    return rule


def _calls_elsewhere(operator: Operator) -> Rule:
    """A step that called the operator's tool with other arguments (or whose call of it
    raised): where a rollout looked up the wrong thing, the step an unmet "calls
    X(arguments)" is cited at."""
    def rule(t: Trajectory, j: int) -> bool:
        return any(operator.called(c) and not (c["ok"] and operator.matches(c)) for c in tool_calls(t.steps[j]) or [])

    return rule


@dataclass(frozen=True)
class RuleLibrary:
    """One task's rule items: ``families`` (name -> Family), and per item its title and rule."""

    families: dict[str, Family]
    titles: dict[str, str]
    rules: dict[str, Rule] = field(repr=False)
    misses: dict[str, Rule] = field(default_factory=dict, repr=False)
    """Per positive item that names a target (a call with arguments): the steps that
    attempted it and missed, which its FAIL cites (otherwise an unmet item is an omission)."""

    @property
    def criteria(self) -> list[Criterion]:
        return [
            Criterion(
                title=self.titles[item],
                description=f"{name.capitalize()} rule '{item}' ({'rewarded' if spec.sign > 0 else 'penalised'}).",
                evaluator_instruction="Decided by code from what the environment recorded: the tool calls each "
                                      "step made, whether its block raised, whether it submitted.",
                origin="rule",
            )
            for name, spec in self.families.items()
            for item in spec.items
        ]

    def transition_items(self, trajectory: Trajectory) -> list[dict[str, list[str]]]:
        """For each step (index 0 is step 1): ``{family: [names of the items it hit]}``,
        every family present, items in the family's order."""
        return [
            {name: [item for item in spec.items if self.rules[item](trajectory, j)] for name, spec in self.families.items()}
            for j in range(len(trajectory.steps))
        ]


def _operators(task: Task) -> dict[str, list[Operator]]:
    declared = task.metadata.get("operators")
    if declared is None:
        return {}
    where = f"task {task.id!r}: metadata['operators']"
    if not isinstance(declared, dict) or set(declared) - set(OPERATOR_FAMILIES):
        raise ValueError(f"{where} must map 'evidence' and/or 'execution' to lists of callable names, got {declared!r}")
    out = {}
    for family, names in declared.items():
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}[{family!r}] must be a list of callable names like 'apis.app.api', got {names!r}")
        out[family] = [Operator.parse(n, f"{where}[{family!r}]") for n in dict.fromkeys(names)]
    return out


def rule_library(task: Task) -> RuleLibrary:
    """The task's operator library (see the module docstring), generic items as the fallback."""
    operators = _operators(task)
    families: dict[str, Family] = {}
    titles = {name: title for name, (title, _) in GENERIC_ITEMS.items()}
    rules = {name: rule for name, (_, rule) in GENERIC_ITEMS.items()}
    for family, generic in GENERIC_FAMILIES.items():
        items = [OPERATOR_PREFIX + op.text for op in operators.get(family, [])] or list(generic)
        if family == "evidence" and task.metadata.get("api_docs"):
            items.insert(0, "reads_documentation")
        families[family] = Family(SIGNS[family], BUDGET, tuple(items))
    misses: dict[str, Rule] = {}
    for family, ops in operators.items():
        verb = "Gets data from" if family == "evidence" else "Calls"
        for op in ops:
            titles[OPERATOR_PREFIX + op.text] = f"{verb} {op.text}"
            rules[OPERATOR_PREFIX + op.text] = _calls(op)
            if op.arguments:
                misses[OPERATOR_PREFIX + op.text] = _calls_elsewhere(op)
    return RuleLibrary(families, titles, rules, misses)


_GENERIC = rule_library(Task(id="generic", instruction=""))
FAMILIES: dict[str, Family] = _GENERIC.families
"""The generic families: what a task with no operators and no API docs gets."""
ITEM_TITLES: dict[str, str] = {name: title for name, (title, _) in GENERIC_ITEMS.items()}
RULE_CRITERIA: tuple[Criterion, ...] = tuple(_GENERIC.criteria)


def transition_items(trajectory: Trajectory) -> list[dict[str, list[str]]]:
    """For each step (index 0 is step 1): ``{family: [names of the items it hit]}`` under
    the library of the trajectory's task, every family present, items in the family's order."""
    return rule_library(trajectory.task).transition_items(trajectory)


def item_score(family: str, item: str, task: Task | None = None) -> float:
    """What one hit of ``item`` scores: +-(family budget / family item count), under the
    library of ``task`` (the generic one by default)."""
    spec = (FAMILIES if task is None else rule_library(task).families)[family]
    if item not in spec.items:
        raise KeyError(f"{item!r} is not an item of family {family!r}; items: {spec.items}")
    return spec.item_score()


def foundational_rewards(trajectory: Trajectory) -> list[float]:
    """TRCA's foundational reward r^F per step: the sum of its hit items' scores."""
    library = rule_library(trajectory.task)
    return [
        sum(library.families[family].item_score() * len(items) for family, items in hits.items())
        for hits in library.transition_items(trajectory)
    ]


def _had_error(trajectory: Trajectory) -> bool:
    return any(_failed(s) for s in trajectory.steps)


OUTCOME_CRITERION = Criterion(
    title="Submits the right answer",
    description="Outcome: the environment's own check of what the rollout handed in (metrics['success']).",
    evaluator_instruction="Decided by the environment's check of the submitted result (the answer matches the "
                          "task's; on AppWorld, the task's tests on the end state), never by the code's text.",
    origin="rule",
)
"""The rubric's outcome criterion, where the environment checks the result: a group whose
trajectories carry a boolean ``metrics["success"]`` gets it first. Without it the other
items, which read only which calls ran, pay a wrong answer as much as the right one (a
right lookup then a wrong ``submit``)."""


def checkable(trajectories: Sequence[Trajectory]) -> bool:
    """The environment checked the result of some rollout: a boolean ``metrics["success"]``."""
    return any(isinstance(t.metrics.get("success"), bool) for t in trajectories)


def _submitting_steps(trajectory: Trajectory) -> list[int]:
    return [j + 1 for j, s in enumerate(trajectory.steps)
            if s.info.get("submitted") or any(_submits_call(c) for c in tool_calls(s) or [])]


def outcome_verdict(trajectory: Trajectory) -> Verdict:
    """PASS or FAIL by the environment's check, cited at the steps that handed the result in
    (the step that decided it); never handed in, a FAIL citing nothing (an omission);
    not applicable where the environment recorded no check for this rollout."""
    success = trajectory.metrics.get("success")
    title = OUTCOME_CRITERION.title
    if not isinstance(success, bool):
        return Verdict(criterion=title, score=0, evidence="the environment recorded no success check")
    steps = _submitting_steps(trajectory)
    if not steps and success:  # checked without a recorded submission: the last step with code ran last
        steps = [j + 1 for j, s in enumerate(trajectory.steps) if s.code is not None][-1:]
    if success:
        return Verdict(criterion=title, score=1, cited_steps=steps, evidence="the environment's check passed")
    if steps:
        return Verdict(criterion=title, score=-1, cited_steps=steps,
                       evidence=f"handed in at steps {steps}; the environment's check failed")
    return Verdict(criterion=title, score=-1, evidence="nothing handed in", justification="an omission: no step did it")


def rule_verdicts(trajectory: Trajectory, library: RuleLibrary | None = None, *, outcome: bool = False) -> list[Verdict]:
    """One verdict per rule item (in the library's criteria order), citing the steps behind
    it; first, with ``outcome``, the verdict on ``OUTCOME_CRITERION``.

    A positive item never hit FAILs citing no step (an omission moves R_i, never one step's
    credit, see the module docstring), unless it names a target and some step attempted it
    and missed (a lookup of the wrong product): then it FAILs citing those steps. "After a
    failed step, takes one that works" is not applicable when nothing failed.
    """
    library = library or rule_library(trajectory.task)
    hits = library.transition_items(trajectory)
    n = len(trajectory.steps)
    with_code = [j + 1 for j in range(n) if trajectory.steps[j].code is not None] or list(range(1, n + 1))
    verdicts = [outcome_verdict(trajectory)] if outcome else []
    for family, spec in library.families.items():
        for item in spec.items:
            steps = [j + 1 for j, h in enumerate(hits) if item in h[family]]
            title = library.titles[item]
            if spec.sign > 0:
                missed = [j + 1 for j in range(n) if item in library.misses and library.misses[item](trajectory, j)]
                if steps:
                    verdicts.append(Verdict(criterion=title, score=1, cited_steps=steps, evidence=f"hit at steps {steps}"))
                elif item == "recovers_from_error" and not _had_error(trajectory):
                    verdicts.append(Verdict(criterion=title, score=0, evidence="no step failed"))
                elif missed:
                    verdicts.append(Verdict(criterion=title, score=-1, cited_steps=missed,
                                            evidence=f"attempted with other arguments, or raised, at steps {missed}"))
                else:
                    verdicts.append(Verdict(criterion=title, score=-1, evidence="never hit",
                                            justification="an omission: no step did it"))
            elif steps:
                verdicts.append(Verdict(criterion=title, score=-1, cited_steps=steps, evidence=f"hit at steps {steps}"))
            else:
                verdicts.append(Verdict(criterion=title, score=1, cited_steps=with_code if n else [], evidence="never hit"))
    return verdicts


@REWARDS.register("rule")
class RuleRubricReward(RubricReward):
    """Judge-free rubric reward from the task's transition rules (see the module docstring):
    microseconds per trajectory, no network, verdicts with step citations."""

    name = "rule"

    def __init__(self, *, dropout: bool = True) -> None:
        self.dropout = dropout

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return self.score_group(task, trajectories)

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        library = rule_library(trajectories[0].task if trajectories else task)
        outcome = checkable(trajectories)
        verdicts = [rule_verdicts(t, library, outcome=outcome) for t in trajectories]
        criteria = [OUTCOME_CRITERION, *library.criteria] if outcome else library.criteria
        return finalize_group(criteria, verdicts, dropout=self.dropout)
