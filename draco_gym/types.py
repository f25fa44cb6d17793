"""The one data model carried from environment to reward to credit to trainer.

Episode data (Task, Step, Trajectory) and rubric data (Criterion, Verdict, TrajectoryScore,
GroupScore) are pydantic models so that rollouts and verdicts can be saved as JSON, replayed
and re-scored later with another judge or credit rule. A ``RolloutGroup`` (the G rollouts of
one task and their score) is what every layer hands on: the env runner samples it, the
reward scores it, credit, logging and evaluation read it; a ``RolloutRecord`` is one line of
``rollouts.jsonl``, the file the report reads. Validation happens here, once, so
that every layer can trust what it receives: a step numbered out of order or a citation
outside the trajectory is rejected when the object is built, naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from draco_gym.text import valid_data, valid_text

GAP = -1
"""Step index of a token that belongs to no step: prompt, observations, chat scaffolding."""

STATE_KEY = "state_key"
"""The ``Step.info`` entry where an environment names the state a step was taken in (its
decision context): a short string, equal for steps of a group's rollouts that faced the same
situation (AppWorld: the last API called; PythonTools: the last tool call; tau-bench: the last
tool and the conversation stage). TRCA compares the returns of steps sharing a key."""

TOOL_CALLS = "tool_calls"
"""The ``Step.info`` entry where an environment records the tool calls a step's code made, in
call order, as the environment saw them from outside the agent's process: one dict per call,
``{"name": str, "ok": bool}`` (``ok``: the tool returned rather than raised), plus what else
the environment knows. Rules that reward tool use read this, never the code's text: a comment
naming a tool calls nothing."""


class Termination:
    """Why an episode ended. Plain strings so that new environments can add their own."""

    SUBMITTED = "submitted"  # the environment's own completion signal (complete_task, submit, ...)
    NO_CODE = "no_code"  # the agent answered without a code block (DRACO's end rule)
    MAX_TURNS = "max_turns"  # the turn budget ran out
    LENGTH = "length"  # the context or response token budget ran out (set by the trainer)
    ENV_ERROR = "env_error"  # the environment failed and could not be recovered
    USER_STOP = "user_stop"  # a simulated user ended the conversation (tau-bench)
    AGENT_STOP = "agent_stop"  # the agent ended the conversation (tau-bench's ###STOP###)
    TOO_MANY_ERRORS = "too_many_errors"  # tau-bench's limit on failed tool calls
    MAX_STEPS = "max_steps"  # tau-bench's limit on messages of any role (a truncation)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


AgentText = Annotated[str, AfterValidator(valid_text)]
"""Text the agent controls (its message, its code, what the code printed): valid Unicode,
a lone surrogate replaced (``draco_gym.text``), so the tokenizer, the logs, the renderer
and the judges can encode it."""
AgentData = Annotated[dict[str, Any], BeforeValidator(valid_data)]
"""A dict that holds what the agent controls (tool calls, a submitted answer): valid text,
JSON-ready, bounded in depth and size (``draco_gym.text.valid_data``)."""


class Task(_Model):
    """What the agent is asked to do, and the system prompt exactly as it saw it."""

    id: str
    instruction: str
    agent_prompt: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


class Step(_Model):
    """One assistant turn. ``index`` is 1-based, the number the judge sees and cites.

    A turn that carries a code block is a *credit step*, a step in the paper's sense. A turn
    without one (the closing message after the task is done, a malformed reply, a τ-bench
    message to the user) keeps its number, and the judge reads and may cite it, but credit
    rules do not redistribute over it: its tokens keep the trajectory's advantage A_i, as in
    GRPO (or, as an option, join the preceding code step; ``algos/credit/core.py``).
    """

    index: int = Field(ge=1)
    text: AgentText
    code: AgentText | None = None
    observation: AgentText = ""
    n_tokens: int = Field(default=0, ge=0)
    info: AgentData = Field(default_factory=dict)

    @property
    def is_credit_step(self) -> bool:
        """True for a turn that emitted a code block."""
        return self.code is not None


class Trajectory(_Model):
    """One episode: the steps, why it ended, and the tokens the policy produced.

    ``token_step[t]`` is the 1-based step that token ``t`` belongs to, or ``GAP`` (-1) for
    tokens the policy did not write as part of a step. Credit rules give gap tokens zero
    advantage; the tokens of a turn without code carry that turn's number and get the
    trajectory's A_i (see ``Step``). ``metrics`` holds the environment's own evaluation (e.g. AppWorld tests
    passed): analysis only, never a reward unless the user picks the outcome reward.
    """

    task: Task
    steps: list[Step] = Field(default_factory=list)
    termination: str | None = None
    metrics: AgentData = Field(default_factory=dict)
    token_ids: list[int] = Field(default_factory=list)
    token_step: list[int] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Trajectory:
        for position, step in enumerate(self.steps, start=1):
            if step.index != position:
                raise ValueError(
                    f"steps[{position - 1}].index is {step.index}; steps must be numbered 1..M in order"
                )
        if len(self.token_step) != len(self.token_ids):
            raise ValueError(
                f"token_step has {len(self.token_step)} entries but token_ids has {len(self.token_ids)}"
            )
        if self.token_logprobs and len(self.token_logprobs) != len(self.token_ids):
            raise ValueError(
                f"token_logprobs has {len(self.token_logprobs)} entries but token_ids has {len(self.token_ids)}"
            )
        m = len(self.steps)
        for t, s in enumerate(self.token_step):
            if s != GAP and not 1 <= s <= m:
                raise ValueError(f"token_step[{t}] is {s}; expected -1 (gap) or a step in 1..{m}")
        return self

    @property
    def step_tokens(self) -> list[int]:
        return [step.n_tokens for step in self.steps]

    @property
    def credit_steps(self) -> list[int]:
        """The 1-based numbers of the steps that carry a code block (``Step.is_credit_step``)."""
        return [step.index for step in self.steps if step.is_credit_step]

    @property
    def executed_code(self) -> list[str]:
        """Code blocks in the order they ran: what restoring the episode's state replays."""
        return [step.code for step in self.steps if step.code is not None]


# ---------------------------------------------------------------------------------------
# Rubric data


CriterionOrigin = Literal["instruction", "trajectory", "static", "rule"]


class Criterion(_Model):
    """One rubric item. ``origin`` says which stage wrote it: proposed from the task
    (instruction), added after seeing a rollout (trajectory), a fixed rubric (static) or a
    judge-free transition rule (rule)."""

    title: str = Field(min_length=1)
    description: str = ""
    evaluator_instruction: str = ""
    origin: CriterionOrigin = "instruction"
    grounding_references: list[str] = Field(default_factory=list)
    trajectory_evidence: str | None = None


Score = Literal[-1, 0, 1]


class Verdict(_Model):
    """The judge's final word on one criterion for one trajectory: +1 pass, -1 fail,
    0 not applicable, with the steps it holds responsible."""

    criterion: str
    score: Score
    cited_steps: list[int] = Field(default_factory=list)
    evidence: str = ""
    justification: str = ""

    @field_validator("cited_steps")
    @classmethod
    def _positive(cls, steps: list[int]) -> list[int]:
        bad = [s for s in steps if s < 1]
        if bad:
            raise ValueError(f"cited_steps must be 1-based step numbers, got {bad}")
        return sorted(set(steps))


def rubric_reward(passes: int, fails: int) -> float:
    """DRACO's trajectory reward R = (p - f) / (p + f) over applicable verdicts; 0 if none."""
    if passes < 0 or fails < 0:
        raise ValueError(f"pass and fail counts must be >= 0, got p={passes}, f={fails}")
    total = passes + fails
    return 0.0 if total == 0 else (passes - fails) / total


class TrajectoryScore(_Model):
    """Verdicts for one trajectory over the group's surviving criteria, and its reward.

    ``dropped_passes`` counts its PASS verdicts on criteria that dropout removed (they carry
    no reward, but a pass rate over the whole rubric needs them: in a group that solves the
    task, dropout keeps only the criteria somebody failed)."""

    verdicts: list[Verdict] = Field(default_factory=list)
    p: int = Field(default=0, ge=0)
    f: int = Field(default=0, ge=0)
    reward: float = 0.0
    dropped_passes: int = Field(default=0, ge=0)

    @field_validator("reward")
    @classmethod
    def _finite(cls, reward: float) -> float:
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        return reward

    @classmethod
    def from_verdicts(cls, verdicts: list[Verdict]) -> TrajectoryScore:
        p = sum(v.score == 1 for v in verdicts)
        f = sum(v.score == -1 for v in verdicts)
        return cls(verdicts=verdicts, p=p, f=f, reward=rubric_reward(p, f))

    def step_counts(self, n_steps: int) -> tuple[list[int], list[int]]:
        """Per-step (p_j, f_j): how many PASS and FAIL verdicts cite step j (1..n_steps)."""
        passes, fails = [0] * n_steps, [0] * n_steps
        for v in self.verdicts:
            if v.score == 0:
                continue
            for s in v.cited_steps:
                if s > n_steps:
                    raise ValueError(
                        f"verdict on {v.criterion!r} cites step {s}, but the trajectory has {n_steps} steps"
                    )
                (passes if v.score == 1 else fails)[s - 1] += 1
        return passes, fails


class StageUsage(_Model):
    """What the judge cost in one stage of the pipeline (or in total)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    cache_hits: int = 0

    def add(self, other: StageUsage) -> StageUsage:
        return StageUsage(**{k: getattr(self, k) + getattr(other, k) for k in StageUsage.model_fields})


class JudgeFailure(_Model):
    """A judge stage request that got no usable answer after its retries and repairs: the
    stage, the judge's server (its base URL; an in-process judge's name) and the error."""

    stage: str
    server: str
    error: str


class GroupScore(_Model):
    """The reward for one group of G rollouts of one task.

    ``criteria`` are the ones that survived discriminative dropout; ``dropped`` names those
    removed by it. ``fallbacks`` lists every stage that failed and what was done instead:
    a fallback is always recorded, never silent. ``judge_answers`` counts the judge stage
    requests that got a usable answer and ``judge_failures`` records each that did not, so
    a judge that is down (every request failed) can be told from one that judged.
    """

    criteria: list[Criterion] = Field(default_factory=list)
    scores: list[TrajectoryScore] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    usage: dict[str, StageUsage] = Field(default_factory=dict)
    fallbacks: list[str] = Field(default_factory=list)
    judge_answers: int = 0
    judge_failures: list[JudgeFailure] = Field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.scores]

    @property
    def total_usage(self) -> StageUsage:
        total = StageUsage()
        for stage in self.usage.values():
            total = total.add(stage)
        return total


# ---------------------------------------------------------------------------------------
# What the layers hand on


class RolloutGroup(_Model):
    """The G rollouts of one task and, once the reward has run, their ``GroupScore``.

    The env runner samples groups, the reward scores them (``with_score`` returns the scored
    copy; a group is never scored in place), and credit, logging and evaluation read them. A
    score holds one ``TrajectoryScore`` per trajectory, in the same order. ``policy_version``
    is the number of updates the weights that drew the group had taken (training's; an
    iteration learning from version ``v`` at iteration ``k`` learns ``k - v`` updates late)."""

    task_id: str
    trajectories: list[Trajectory] = Field(min_length=1)
    score: GroupScore | None = None
    policy_version: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_score_per_trajectory(self) -> RolloutGroup:
        if self.score is not None and len(self.score.scores) != len(self.trajectories):
            raise ValueError(f"score has {len(self.score.scores)} trajectory scores for "
                             f"{len(self.trajectories)} trajectories of task {self.task_id!r}")
        return self

    @property
    def task(self) -> Task:
        """The task as the agent saw it (the first rollout's: a group's rollouts share it)."""
        return self.trajectories[0].task

    def with_score(self, score: GroupScore) -> RolloutGroup:
        """This group with ``score``, checked against its trajectories."""
        return RolloutGroup(task_id=self.task_id, trajectories=self.trajectories, score=score,
                            policy_version=self.policy_version)

    def drawn_by(self, policy_version: int) -> RolloutGroup:
        """This group, marked as drawn by the weights of ``policy_version`` updates."""
        return RolloutGroup(task_id=self.task_id, trajectories=self.trajectories, score=self.score,
                            policy_version=policy_version)


class RolloutRecord(_Model):
    """One line of ``rollouts.jsonl``: one rollout with its verdicts and, in training, its
    step credit, enough to replay it and re-score it with another judge or credit rule.

    ``index`` is the rollout's place in its group; ``criteria``, ``dropped`` and ``fallbacks``
    are the group's (repeated on each of its lines, so a line stands alone). An evaluation
    writes no ``iteration`` and, unscored, a null ``score``; ``step_advantages`` (a_j per
    step) are training's, written as computed (a non-finite value as ``NaN``). A criterion
    saved as its title alone (a string) has no known origin. ``policy_version`` is the group's
    (``RolloutGroup``): ``iteration - policy_version`` is how many updates late it was learned."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")

    iteration: int | None = None
    task_id: str
    index: int = Field(ge=0)
    trajectory: Trajectory
    score: TrajectoryScore | None = None
    criteria: list[Criterion | str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list)
    step_advantages: list[float] | None = None
    policy_version: int | None = Field(None, ge=0)

    @classmethod
    def of_group(cls, group: RolloutGroup, *, iteration: int | None = None,
                 step_advantages: Sequence[Sequence[float]] | None = None) -> list[RolloutRecord]:
        """The group's lines, one per rollout (``step_advantages``: one list per rollout)."""
        score = group.score
        shared = {} if score is None else {"criteria": score.criteria, "dropped": score.dropped,
                                           "fallbacks": score.fallbacks}
        return [cls(iteration=iteration, task_id=group.task_id, index=i, trajectory=traj,
                    policy_version=group.policy_version,
                    score=None if score is None else score.scores[i],
                    step_advantages=None if step_advantages is None else list(step_advantages[i]), **shared)
                for i, traj in enumerate(group.trajectories)]
