"""One fixed rubric for every task: the ablation that shows what task-specific criteria add.

Two lists (``variant``):

- ``"paper"`` (the default): the 21 criteria of the DRACO paper's static rubric (its
  appendix C, Table 9), authored once for AppWorld from base-policy rollouts and frozen. The
  titles are the paper's, so per-criterion curves compare with its Figure 10; what each
  checks and how a judge decides it are written here in our words (the paper omits its
  evaluator instructions).
- ``"project"``: ours, 16 criteria written to cover the same behaviour families
  (protecting secrets, stopping after completion, fetching complete data, completing the
  task properly, computing from live data, handling time, authenticating, recovering from
  failures, using valid API calls) in wording that fits every environment here.

Stages 4-7 run as in the dynamic reward: score, attribute (or fused), discriminative dropout,
R_i: the same stages as the dynamic reward (``stages.final_verdicts``) without the
rubric-writing ones. A group costs 2G calls (G fused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draco_gym.reward import stages
from draco_gym.reward.answers import normalize_title
from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group, zero_group
from draco_gym.reward.judge_client import JudgeClient, UsageMeter, as_client
from draco_gym.reward.render import render_task
from draco_gym.reward.stages import END_RULES, SELF_JUDGE_SAMPLES, JudgingMode, View
from draco_gym.types import Criterion, GroupScore, Task, Trajectory


def _c(title: str, description: str, instruction: str) -> Criterion:
    return Criterion(title=title, description=description, evaluator_instruction=instruction, origin="static")


PAPER_STATIC_CRITERIA: tuple[Criterion, ...] = (
    _c("Protects secret values",
       "Passwords, access tokens and other secrets are used where a call needs them but never shown: not printed, "
       "echoed in a message or written into content.",
       "FAIL if a secret's value appears in the agent's printed output, messages or written data. Passing a secret as "
       "an argument to the API that needs it is fine."),
    _c("Stops after completion",
       "Once the task is marked complete, the agent sends no further code.",
       "FAIL if a code block follows the completion call. A short closing message without code is fine. "
       "NOT_APPLICABLE if the agent never marks the task complete."),
    _c("Fetches complete data",
       "Every record the decision depends on is collected first: later pages are read, details are looked up, and "
       "output that is visibly cut off is not taken as the whole.",
       "FAIL if the agent decides from a first page, a truncated listing or a summary when more data was needed and "
       "available. NOT_APPLICABLE if the task needs no lookup."),
    _c("Completes task properly",
       "The agent ends with exactly one completion call after the work is done, carrying only the requested value "
       "when an answer is asked for.",
       "FAIL if there is no completion call, several, one made before the work is done, or an answer padded with "
       "extra text or of the wrong type."),
    _c("Computes from live data",
       "Results come from the objects the environment returned, calculated in code where a calculation is needed.",
       "FAIL if the agent retypes values by hand, estimates by eye, or builds on an assumption the returned data "
       "does not support."),
    _c("Handles time correctly",
       "For a task about dates or periods, the current time is read from the environment and the period's "
       "boundaries are the right ones.",
       "FAIL on a hard-coded date, a guessed 'today', or a window that starts or ends on the wrong day. "
       "NOT_APPLICABLE if the task involves no time."),
    _c("Processes items completely",
       "The whole required set of items is covered, with duplicates and repeated occurrences handled as the task "
       "means them.",
       "FAIL if items are missed, counted twice, or handled once where each occurrence should count. "
       "NOT_APPLICABLE if the task concerns a single item."),
    _c("Targets exact items",
       "Changes hit exactly the intended items and leave the exceptions the task names untouched.",
       "FAIL if the agent changes the wrong item, more items than asked, or an item the task said to keep. "
       "NOT_APPLICABLE if the task changes nothing."),
    _c("Applies correct selection logic",
       "Targets are chosen by the task's exact conditions: the right filter, field, matching key and comparison.",
       "FAIL if a filter, field, key or comparison differs from what the task states (e.g. 'at least' read as "
       "'more than'). NOT_APPLICABLE if nothing has to be selected."),
    _c("Uses complete working set",
       "Everything that was fetched and matters is used in the later reasoning, not just part of it.",
       "FAIL if the agent fetched several pages or sources and then reasons over only some of them. "
       "NOT_APPLICABLE if only one fetch was needed."),
    _c("Performs required actions",
       "The requested change (create, update, delete, send, move, ...) is actually carried out, with the right kind "
       "of action.",
       "FAIL if the agent only lists or describes the targets, or uses a different kind of action than asked. "
       "NOT_APPLICABLE if the task asks only for information."),
    _c("Verifies action outcome",
       "After changing state, the agent confirms the change took effect.",
       "PASS on a follow-up read or a success response that directly shows the intended result; FAIL if the agent "
       "assumes success without either. NOT_APPLICABLE if nothing was changed."),
    _c("Uses exact action content",
       "Where an action needs exact text, names, amounts, paths or identities, those exact values are used.",
       "FAIL if a value is renamed, reworded, rounded or otherwise altered without being asked to. "
       "NOT_APPLICABLE if no action carries such content."),
    _c("Uses correct data source",
       "Evidence comes from the app, endpoint or set of objects the task refers to.",
       "FAIL if the agent reads from a different source whose data could change the result."),
    _c("Authenticates correctly",
       "Protected APIs are called after logging in with the documented identity fields, using the token returned.",
       "FAIL if the login is missing, uses the wrong fields, or its token is not passed on (count these as one "
       "failure here). NOT_APPLICABLE if no protected API is called."),
    _c("Retrieves needed credentials",
       "When a login is needed, the credentials come from where the environment keeps them (the supervisor's "
       "account data).",
       "FAIL if the agent guesses, invents or hard-codes a password or secret it never retrieved. "
       "NOT_APPLICABLE if no login is needed."),
    _c("Uses runnable Python",
       "The agent acts through code that runs in the interpreter.",
       "FAIL if a turn meant to act sends prose, pseudo-code or text that breaks the code's syntax."),
    _c("Checks docs when needed",
       "When the agent does not already know how to call something, it reads the app's or API's documentation "
       "first.",
       "FAIL if the agent guesses at an unfamiliar API repeatedly instead of looking it up. NOT_APPLICABLE if every "
       "API used was called correctly from the start."),
    _c("Recovers from failures",
       "After a failed call or error, the agent changes its approach and keeps making progress.",
       "FAIL if the agent repeats the same failing step, or keeps retrying a failure that persists. "
       "NOT_APPLICABLE if nothing failed."),
    _c("Uses valid API calls",
       "Calls go to documented endpoints with supported parameters.",
       "FAIL on an invented API, a wrong endpoint or an unsupported argument (these count as one kind of mistake)."),
    _c("Uses allowed tools only",
       "The agent stays within the provided app APIs and the Python tools it is allowed.",
       "FAIL on a forbidden import, access to the operating system, or a helper that does not exist."),
)
"""The paper's static rubric (Table 9): its titles, in its order (by failure rate on the 720
base-policy rollouts it was authored from), checks written in our words."""

PROJECT_STATIC_CRITERIA: tuple[Criterion, ...] = (
    # completes the task properly
    _c("Achieves the requested end state",
       "The final state of the environment matches what the task asked for, in full.",
       "Check the observations after the agent's last actions for confirmation that every part of the request was carried out. FAIL if any part is missing or only claimed, not shown."),
    _c("Answers with the correct value",
       "When the task asks a question, the answer given or submitted is the one the data supports.",
       "Compare the submitted answer with the values the observations show. NOT_APPLICABLE if the task asks for no answer."),
    _c("Does only what was asked",
       "No side effects beyond the request: no extra purchases, messages, deletions or edits.",
       "FAIL if any action changes state the task did not ask to change."),
    # stops after completion
    _c("Stops once the task is done",
       "After completing or submitting the task, the agent takes no further state-changing actions.",
       "Look at the steps after the completion signal. FAIL if the agent keeps acting on the environment."),
    _c("Submits or reports the result",
       "The agent signals completion the way the environment expects (the completion call or a final answer).",
       "FAIL if the episode ends without the completion signal or final answer the task requires."),
    # fetches complete data
    _c("Fetches every page of results",
       "Paginated or limited listings are read to the end before the agent relies on them.",
       "FAIL if the agent uses a listing that the observation shows was cut off (page limits, 'more results') without fetching the rest. NOT_APPLICABLE if no listing was limited."),
    _c("Reads the data it needs",
       "The agent retrieves every record the task depends on instead of assuming it.",
       "FAIL if the agent acts on a record, field or identifier it never retrieved."),
    # computes from live data
    _c("Computes from retrieved values",
       "Numbers, names and identifiers used in actions come from observations, not from guesses or examples.",
       "FAIL if a value used in an action does not appear in any earlier observation and cannot be derived from them."),
    _c("Checks the data before acting",
       "Before an irreversible action the agent confirms the target (the right item, person or amount).",
       "FAIL if an irreversible action targets something the agent did not verify. NOT_APPLICABLE if no irreversible action was needed."),
    # handles time
    _c("Interprets dates and times correctly",
       "Relative dates (today, last month, next Friday) and time zones are resolved from the environment's clock.",
       "FAIL if the agent resolves a date from its own assumption rather than the environment's date. NOT_APPLICABLE if the task involves no dates."),
    # authenticates
    _c("Authenticates before protected calls",
       "The agent obtains and uses the required credentials or tokens before calling protected APIs.",
       "FAIL if a protected call fails for lack of authentication and the agent does not fix it. NOT_APPLICABLE if no call needs authentication."),
    # protects secrets
    _c("Keeps secrets out of outputs",
       "Passwords, tokens and personal data are used only where needed, never printed in messages or shared.",
       "FAIL if a credential or unnecessary personal data appears in the agent's messages or in data sent to third parties."),
    # recovers from failures
    _c("Recovers from failed actions",
       "After an error the agent diagnoses it and changes its approach instead of repeating the same call.",
       "FAIL if the agent repeats a failing action unchanged or gives up. NOT_APPLICABLE if no action failed."),
    _c("Reports what could not be done",
       "When part of the task is impossible, the agent says so plainly instead of claiming success.",
       "FAIL if the agent claims success that the observations contradict. NOT_APPLICABLE if nothing was impossible."),
    # uses valid API calls
    _c("Uses documented API calls correctly",
       "Calls use APIs and parameters that exist, with valid argument types and values.",
       "FAIL if calls to nonexistent APIs or parameters, or with invalid arguments, are not corrected."),
    _c("Looks up unfamiliar APIs first",
       "Before using an API it has not seen, the agent reads its documentation or specification.",
       "FAIL if the agent guesses an API's parameters and that guess causes an error."),
)
"""The project's static rubric (``variant="project"``)."""

STATIC_VARIANTS: dict[str, tuple[Criterion, ...]] = {"paper": PAPER_STATIC_CRITERIA, "project": PROJECT_STATIC_CRITERIA}
STATIC_CRITERIA = PAPER_STATIC_CRITERIA
"""The default static rubric: the paper's."""


@REWARDS.register("static")
class StaticRubricReward(RubricReward):
    """Stages 4-7 of DRACO against one fixed rubric: ``criteria`` if given, else the
    ``variant``'s list ("paper", the default: the paper's 21; "project": ours). Options as in
    DynamicRubricReward."""

    name = "static"

    def __init__(
        self,
        judge: Any = None,
        *,
        criteria: Sequence[Criterion | dict] | None = None,
        variant: str = "paper",
        mode: JudgingMode = "separate",
        self_judge: bool = False,
        score_samples: int | None = None,
        dropout: bool = True,
        max_message_chars: int | None = None,
        max_observation_chars: int | None = None,
        max_trajectory_chars: int = 60_000,
        max_prompt_chars: int | None = None,
        end_rule: str = "no_code",
        **settings: Any,
    ) -> None:
        if variant not in STATIC_VARIANTS:
            raise ValueError(f"variant must be one of {sorted(STATIC_VARIANTS)} (the paper's static rubric or ours), "
                             f"got {variant!r}")
        self.client: JudgeClient = as_client(judge, **settings)
        chosen = criteria or STATIC_VARIANTS[variant]
        self.criteria = [c if isinstance(c, Criterion) else Criterion(origin="static", **c) for c in chosen]
        if not self.criteria:
            raise ValueError("a static rubric needs at least one criterion")
        titles = [normalize_title(c.title) for c in self.criteria]
        if len(set(titles)) != len(titles):
            raise ValueError("static criteria titles must be unique")
        if mode not in stages.MODES:
            raise ValueError(f"mode must be one of {stages.MODES}, got {mode!r}")
        self.samples = score_samples if score_samples is not None else (SELF_JUDGE_SAMPLES if self_judge else 1)
        if self.samples < 1:
            raise ValueError(f"score_samples must be >= 1, got {self.samples}")
        self.mode = mode
        self.view = View(max_message_chars, max_observation_chars, max_trajectory_chars)
        self.dropout = dropout
        self.max_prompt_chars = max_prompt_chars
        if end_rule not in END_RULES:
            raise ValueError(f"end_rule must be one of {END_RULES} (the environment's), got {end_rule!r}")
        self.closing_turn = end_rule == "no_code"

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        meter, fallbacks = UsageMeter(), []
        task_text = render_task(task.instruction, task.agent_prompt, self.max_prompt_chars)
        verdicts = await stages.final_verdicts(self.client, meter, fallbacks, task_text, self.criteria, trajectories,
                                               view=self.view, mode=self.mode, samples=self.samples,
                                               closing_turn=self.closing_turn)
        if verdicts is None:
            return meter.onto(zero_group(len(trajectories), "group: a rollout could not be scored; every reward set "
                                         "to 0", usage=meter.stages, fallbacks=fallbacks))
        return meter.onto(finalize_group(self.criteria, verdicts, usage=meter.stages, fallbacks=fallbacks,
                                         dropout=self.dropout))
