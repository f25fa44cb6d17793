"""One fixed rubric for every task: the ablation that shows what task-specific criteria add.

The criteria are ours, written to cover the behaviour families DRACO's static rubric
covers (protecting secrets, stopping after completion, fetching complete data, completing
the task properly, computing from live data, handling time, authenticating, recovering
from failures, using valid API calls). Stages 4-7 run as in the dynamic reward: score,
attribute (or fused), discriminative dropout, R_i: the same stages as the dynamic reward
(``stages.final_verdicts``) without the rubric-writing ones. A group costs 2G calls (G fused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draco_gym.reward import stages
from draco_gym.reward.answers import normalize_title
from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group, zero_group
from draco_gym.reward.judge_client import JudgeClient, UsageMeter, as_client
from draco_gym.reward.render import render_task
from draco_gym.reward.stages import SELF_JUDGE_SAMPLES, JudgingMode, View
from draco_gym.types import Criterion, GroupScore, Task, Trajectory


def _c(title: str, description: str, instruction: str) -> Criterion:
    return Criterion(title=title, description=description, evaluator_instruction=instruction, origin="static")


STATIC_CRITERIA: tuple[Criterion, ...] = (
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


@REWARDS.register("static")
class StaticRubricReward(RubricReward):
    """Stages 4-7 of DRACO against one fixed rubric (``criteria``, default
    ``STATIC_CRITERIA``). Options as in DynamicRubricReward."""

    name = "static"

    def __init__(
        self,
        judge: Any = None,
        *,
        criteria: Sequence[Criterion | dict] | None = None,
        mode: JudgingMode = "separate",
        self_judge: bool = False,
        score_samples: int | None = None,
        dropout: bool = True,
        max_message_chars: int = 6000,
        max_observation_chars: int = 2000,
        max_trajectory_chars: int = 60_000,
        max_prompt_chars: int = 3000,
        **settings: Any,
    ) -> None:
        self.client: JudgeClient = as_client(judge, **settings)
        self.criteria = [c if isinstance(c, Criterion) else Criterion(origin="static", **c) for c in (criteria or STATIC_CRITERIA)]
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

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        meter, fallbacks = UsageMeter(), []
        task_text = render_task(task.instruction, task.agent_prompt, self.max_prompt_chars)
        verdicts = await stages.final_verdicts(self.client, meter, fallbacks, task_text, self.criteria, trajectories,
                                               view=self.view, mode=self.mode, samples=self.samples)
        if verdicts is None:
            return meter.onto(zero_group(len(trajectories), "group: a rollout could not be scored; every reward set "
                                         "to 0", usage=meter.stages, fallbacks=fallbacks))
        return meter.onto(finalize_group(self.criteria, verdicts, usage=meter.stages, fallbacks=fallbacks,
                                         dropout=self.dropout))
