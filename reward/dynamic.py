"""DRACO's dynamic rubric reward: seven stages from a task and G rollouts to G rewards,
composed from the judge stages of ``stages.py``.

    1 propose     from the task alone, at most 15 criteria (cached per task)   1 call
    2 augment     per rollout, at most 10 criteria only execution reveals      G calls, parallel
    3 merge       all candidates, seeing all G rollouts, at most 24             1 call
    4 score       each rollout on every criterion: +1 / -1 / 0                  G calls, parallel
    5 attribute   final verdict and the 1-based steps behind it                 G calls, parallel
    6 dropout     drop criteria no rollout failed                               (code)
    7 reward      R_i = (p_i - f_i) / (p_i + f_i) over surviving verdicts       (code)

3G+2 calls in five dependent rounds (four once the task's proposal is cached); the fused
mode merges 4 and 5 into one call (2G+2 calls, four rounds).

Every stage that fails after retries and repairs falls back explicitly, recorded in
``GroupScore.fallbacks``:
  propose    -> the static rubric stands in for the proposal
  augment i  -> nothing added from rollout i
  merge      -> the de-duplicated union of the candidates, proposed first, cut at 24
  score i    -> the group is not scored: every R_i = 0 (no update from it)
  attribute i-> rollout i keeps its stage-4 verdicts, uncited (its credit falls back to uniform)
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from draco_gym.reward import stages
from draco_gym.reward.answers import first_of_each
from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group, zero_group
from draco_gym.reward.judge_client import JudgeClient, StageFailed, UsageMeter, as_client
from draco_gym.reward.render import render_task
from draco_gym.reward.stages import END_RULES, SELF_JUDGE_SAMPLES, JudgingMode, View
from draco_gym.types import Criterion, GroupScore, Task, Trajectory

@REWARDS.register("dynamic")
class DynamicRubricReward(RubricReward):
    """DRACO's reward (see the module docstring).

    judge          a Judge, a JudgeClient, a dict for ``build_judge``
                   (``{"name": "openai", "model": "...", "base_url": "..."}``) or a
                   function ``fn(messages) -> text``
    mode           "separate" (paper, default) or "fused" (score and cite in one call)
    self_judge     the judge is the policy itself: score k = 3 times, pass only if all pass
    score_samples  k, when set explicitly
    max_proposed, max_augmented, max_criteria
                   stage limits 15, 10, 24
    dropout        discriminative dropout (stage 6); off only for ablations
    max_message_chars, max_observation_chars, max_prompt_chars
                   caps (characters, head and tail kept) on what the judge reads of one
                   step's message and observation and of the agent prompt; None (the
                   default): as the agent saw them, the paper's reading. A cap saves judge
                   tokens (this project used 6000, 2000 and 3000 before) at the price of
                   verdicts on text the judge did not see
    max_trajectory_chars
                   the whole rollout (ours, 60000: G rollouts must fit the judge's context;
                   over it every step is shortened alike); merge_observation_chars and
                   merge_trajectory_chars the same for the merge prompt, which holds all G
    end_rule       the environment's (``no_code``, the default, or ``task_completed``): under
                   ``no_code`` every judge prompt says that a brief closing turn after the
                   task is done is correct and must not be penalised (the paper's caveat)
    **settings     JudgeSettings fields: temperature, max_concurrency, requests_per_minute,
                   tokens_per_minute, deadline_s, retries, max_repairs, cache_dir, prices
    """

    name = "dynamic"

    def __init__(
        self,
        judge: Any = None,
        *,
        mode: JudgingMode = "separate",
        self_judge: bool = False,
        score_samples: int | None = None,
        max_proposed: int = 15,
        max_augmented: int = 10,
        max_criteria: int = 24,
        dropout: bool = True,
        max_message_chars: int | None = None,
        max_observation_chars: int | None = None,
        max_trajectory_chars: int = 60_000,
        merge_observation_chars: int = 600,
        merge_trajectory_chars: int = 16_000,
        max_prompt_chars: int | None = None,
        end_rule: str = "no_code",
        **settings: Any,
    ) -> None:
        for name, value in (("max_proposed", max_proposed), ("max_augmented", max_augmented), ("max_criteria", max_criteria)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if mode not in stages.MODES:
            raise ValueError(f"mode must be one of {stages.MODES}, got {mode!r}")
        self.samples = score_samples if score_samples is not None else (SELF_JUDGE_SAMPLES if self_judge else 1)
        if self.samples < 1:
            raise ValueError(f"score_samples must be >= 1, got {self.samples}")
        self.client: JudgeClient = as_client(judge, **settings)
        self.mode = mode
        self.view = View(max_message_chars, max_observation_chars, max_trajectory_chars)
        self.max_proposed, self.max_augmented, self.max_criteria = max_proposed, max_augmented, max_criteria
        self.dropout = dropout
        self.merge_observation_chars = merge_observation_chars
        self.merge_trajectory_chars = merge_trajectory_chars
        self.max_prompt_chars = max_prompt_chars
        if end_rule not in END_RULES:
            raise ValueError(f"end_rule must be one of {END_RULES} (the environment's), got {end_rule!r}")
        self.closing_turn = end_rule == "no_code"
        self._proposals: OrderedDict[str, list[Criterion]] = OrderedDict()

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        client, meter, fallbacks = self.client, UsageMeter(), []
        task_text = render_task(task.instruction, task.agent_prompt, self.max_prompt_chars)

        proposed = await self._propose(task, task_text, meter, fallbacks)
        added = await asyncio.gather(*(self._augment(task_text, proposed, t, i, meter, fallbacks)
                                       for i, t in enumerate(trajectories)))
        criteria = await self._merge(task_text, [*proposed, *(c for extra in added for c in extra)], trajectories,
                                     meter, fallbacks)
        if not criteria:
            return meter.onto(zero_group(len(trajectories), "group: no criteria to score against; every reward set "
                                         "to 0", usage=meter.stages, fallbacks=fallbacks))
        verdicts = await stages.final_verdicts(client, meter, fallbacks, task_text, criteria, trajectories,
                                               view=self.view, mode=self.mode, samples=self.samples,
                                               closing_turn=self.closing_turn)
        if verdicts is None:
            return meter.onto(zero_group(len(trajectories), "group: a rollout could not be scored; every reward set "
                                         "to 0", usage=meter.stages, fallbacks=fallbacks))
        return meter.onto(finalize_group(criteria, verdicts, usage=meter.stages, fallbacks=fallbacks,
                                         dropout=self.dropout))

    async def _propose(self, task: Task, task_text: str, meter: UsageMeter, fallbacks: list[str]) -> list[Criterion]:
        """Stage 1, cached per task; on failure the static rubric stands in."""
        key = _task_key(task)
        if key in self._proposals:
            self._proposals.move_to_end(key)
            meter.book("propose", cache_hits=1)
            return self._proposals[key]
        try:
            proposed = await stages.propose(self.client, meter, task_text, limit=self.max_proposed,
                                            closing_turn=self.closing_turn)
        except StageFailed as exc:
            from draco_gym.reward.static import STATIC_CRITERIA

            fallbacks.append(f"propose: {exc.reason}; used the static rubric instead")
            return list(STATIC_CRITERIA)
        self._proposals[key] = proposed
        while len(self._proposals) > 4096:
            self._proposals.popitem(last=False)
        return proposed

    async def _augment(self, task_text: str, proposed: list[Criterion], trajectory: Trajectory, index: int,
                       meter: UsageMeter, fallbacks: list[str]) -> list[Criterion]:
        """Stage 2 for one rollout; on failure nothing is added from it."""
        try:
            return await stages.augment(self.client, meter, task_text, proposed, self.view.render(trajectory),
                                        limit=self.max_augmented, closing_turn=self.closing_turn)
        except StageFailed as exc:
            fallbacks.append(f"augment[{index + 1}]: {exc.reason}; added nothing from this rollout")
            return []

    async def _merge(self, task_text: str, candidates: list[Criterion], trajectories: list[Trajectory],
                     meter: UsageMeter, fallbacks: list[str]) -> list[Criterion]:
        """Stage 3; on failure the de-duplicated union of the candidates, proposed first."""
        rollouts = [self.view.render(t, label=f"attempt {i + 1}", observation_chars=self.merge_observation_chars,
                                     max_chars=self.merge_trajectory_chars) for i, t in enumerate(trajectories)]
        try:
            return await stages.merge(self.client, meter, task_text, candidates, rollouts, limit=self.max_criteria,
                                      closing_turn=self.closing_turn)
        except StageFailed as exc:
            union = first_of_each(candidates)[: self.max_criteria]
            fallbacks.append(
                f"merge: {exc.reason}; used the de-duplicated union of {len(candidates)} candidates ({len(union)} kept)"
            )
            return union


def _task_key(task: Task) -> str:
    digest = hashlib.sha256(f"{task.instruction}\x00{task.agent_prompt}".encode()).hexdigest()[:16]
    return f"{task.id}:{digest}"
