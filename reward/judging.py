"""DRACO stages 4 and 5 for one trajectory: score every criterion, then cite the steps.

Shared by every judged rubric (dynamic and static). Two modes:
  - ``"separate"`` (the paper, default): a score call, then an attribute call that sees the
    scores and gives the final verdict with its steps. 2 calls per trajectory.
  - ``"fused"``: one call that scores and cites at once. 1 call per trajectory; a group
    costs 2G+2 calls instead of 3G+2.
Each trajectory runs its own score -> attribute chain, so no trajectory waits for the
slowest score of the group before its attribution starts.

Self-judging (``samples`` = k > 1) asks the scoring question k times and keeps a PASS only
if all k samples pass; any FAIL, or a PASS/NOT_APPLICABLE disagreement, is a FAIL (when
torn between -1 and 0, choose -1), and all-NOT_APPLICABLE stays 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from draco_gym.reward.answers import (
    VERDICT_SCORES,
    InvalidAnswer,
    answer_schema,
    check_attributions,
    check_fused,
    check_scores,
    parse_answer,
)
from draco_gym.reward.client import JudgeClient, StageFailed, UsageMeter
from draco_gym.reward.render import criteria_json, render_trajectory, stage_messages, verdicts_json
from draco_gym.types import Criterion, Trajectory, Verdict

JudgingMode = Literal["separate", "fused"]
MODES = ("separate", "fused")


def combine_samples(samples: Sequence[Sequence[Verdict]]) -> list[Verdict]:
    """k verdict lists over the same criteria -> one list: pass only if all k pass.

    Citations and evidence come from the samples that agree with the combined verdict.
    """
    combined = []
    for per_criterion in zip(*samples, strict=True):
        scores = {v.score for v in per_criterion}
        if scores == {1}:
            score = 1
        elif scores == {0}:
            score = 0
        else:
            score = -1
        agreeing = [v for v in per_criterion if v.score == score] or list(per_criterion)
        steps = sorted({s for v in agreeing for s in v.cited_steps}) if score != 0 else []
        first = agreeing[0]
        note = "" if len(per_criterion) == 1 else f" [{sum(v.score == 1 for v in per_criterion)}/{len(per_criterion)} samples passed]"
        combined.append(
            Verdict(criterion=first.criterion, score=score, cited_steps=steps, evidence=first.evidence,
                    justification=first.justification + note)
        )
    return combined


class TrajectoryJudging:
    """Stages 4-5 with one judge client. ``judge`` returns the final verdicts of one
    trajectory, or None when it could not be scored (the caller zeroes the group)."""

    def __init__(
        self,
        client: JudgeClient,
        *,
        mode: JudgingMode = "separate",
        samples: int = 1,
        max_message_chars: int = 6000,
        max_observation_chars: int = 2000,
        max_trajectory_chars: int = 60_000,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.client = client
        self.mode = mode
        self.samples = samples
        self.max_message_chars = max_message_chars
        self.max_observation_chars = max_observation_chars
        self.max_trajectory_chars = max_trajectory_chars

    def render(
        self, trajectory: Trajectory, label: str | None = None, observation_chars: int | None = None, max_chars: int | None = None
    ) -> str:
        return render_trajectory(
            trajectory,
            label=label,
            max_message_chars=self.max_message_chars,
            max_observation_chars=self.max_observation_chars if observation_chars is None else observation_chars,
            max_chars=self.max_trajectory_chars if max_chars is None else max_chars,
        )

    async def judge_group(
        self, task_text: str, criteria: list[Criterion], trajectories: Sequence[Trajectory], meter: UsageMeter, fallbacks: list[str]
    ) -> list[list[Verdict]] | None:
        rows = await asyncio.gather(
            *(self.judge(task_text, criteria, t, i, meter, fallbacks) for i, t in enumerate(trajectories))
        )
        return None if any(row is None for row in rows) else list(rows)

    async def judge(
        self, task_text: str, criteria: list[Criterion], trajectory: Trajectory, index: int, meter: UsageMeter, fallbacks: list[str]
    ) -> list[Verdict] | None:
        titles = [c.title for c in criteria]
        n_steps = len(trajectory.steps)
        base = {
            "task": task_text,
            "criteria": criteria_json(criteria),
            "trajectory": self.render(trajectory),
            "n_criteria": len(criteria),
            "n_steps": n_steps,
        }
        stage = "score" if self.mode == "separate" else "score_attribute"
        schema = answer_schema(stage, titles=titles, n_steps=n_steps)
        messages = stage_messages(stage, **base)
        if self.mode == "separate":
            check = lambda text: _score_verdicts(parse_answer("score", text), titles)  # noqa: E731
        else:
            check = lambda text: check_fused(parse_answer("score_attribute", text), titles, n_steps)  # noqa: E731

        async def one_sample(k: int) -> list[Verdict] | StageFailed:
            with meter.timed(stage):
                try:
                    return await self.client.ask(stage, messages, schema, check, meter, sample=k)
                except StageFailed as exc:
                    return exc

        results = await asyncio.gather(*(one_sample(k) for k in range(self.samples)))
        good = [r for r in results if not isinstance(r, StageFailed)]
        for k, r in enumerate(results):
            if isinstance(r, StageFailed):
                what = "sample %d of %d" % (k + 1, self.samples) if self.samples > 1 else "call"
                action = "combined the other samples" if good else "trajectory unscored"
                fallbacks.append(f"{stage}[{index + 1}]: {what} failed ({r.reason}); {action}")
        if not good:
            return None
        verdicts = combine_samples(good)
        if self.mode == "fused":
            return verdicts
        return await self._attribute(base, criteria, verdicts, n_steps, index, meter, fallbacks)

    async def _attribute(
        self, base: dict, criteria: list[Criterion], scored: list[Verdict], n_steps: int, index: int, meter: UsageMeter, fallbacks: list[str]
    ) -> list[Verdict]:
        titles = [c.title for c in criteria]
        messages = stage_messages("attribute", **base, verdicts=verdicts_json(scored))
        schema = answer_schema("attribute", titles=titles, n_steps=n_steps)
        check = lambda text: check_attributions(parse_answer("attribute", text), titles, n_steps)  # noqa: E731
        with meter.timed("attribute"):
            try:
                items = await self.client.ask("attribute", messages, schema, check, meter)
            except StageFailed as exc:
                fallbacks.append(f"attribute[{index + 1}]: {exc.reason}; kept the stage-4 verdicts without step citations")
                return scored
        final = []
        for verdict, item in zip(scored, items, strict=True):
            score = VERDICT_SCORES[item.verdict]
            reason = item.reason.strip()
            justification = verdict.justification if score == verdict.score else f"{verdict.justification} [attribution overruled: {reason}]"
            final.append(
                Verdict(
                    criterion=verdict.criterion,
                    score=score,
                    cited_steps=item.steps if score != 0 else [],
                    evidence=verdict.evidence,
                    justification=justification,
                )
            )
        return final


def _score_verdicts(answer, titles: list[str]) -> list[Verdict]:
    items = check_scores(answer, titles)
    return [
        Verdict(criterion=title, score=item.score, evidence=item.evidence, justification=item.justification)
        for title, item in zip(titles, items, strict=True)
    ]


__all__ = ["MODES", "InvalidAnswer", "JudgingMode", "TrajectoryJudging", "combine_samples"]
