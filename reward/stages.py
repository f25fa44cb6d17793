"""The judge's stages, each a function over a ``JudgeClient``.

A stage renders its prompt (``prompts/<stage>.j2``), narrows its answer's JSON schema to
this call, and gets one validated answer through ``JudgeClient.ask`` (limits, retries,
repair, cache, cost), timed into the group's ``UsageMeter``. A stage that gets no usable
answer raises ``StageFailed``; what happens instead is the rubric's decision
(``dynamic.py``, ``static.py``), so a rubric is a composition of stages.

    propose          task                           -> criteria (at most 15)
    augment          task, criteria, one rollout    -> criteria only execution reveals (10)
    merge            task, candidates, all rollouts -> the group's criteria (24)
    score            task, criteria, one rollout    -> verdicts, uncited
    attribute        ... and the scored verdicts    -> final verdicts with their steps
    score_attribute  task, criteria, one rollout    -> final verdicts with steps, one call
    segment          a success and the failures     -> the success's pivotal segment (ProVer)

``final_verdicts`` composes score and attribute (or the fused stage) for a group, with the
self-judge's k samples and the fallbacks both judged rubrics share.

``closing_turn`` (every stage; True by default, as under the environments' default
``end_rule: no_code``): the episode ends on a message without code, and every prompt opens
with the paper's caveat that a brief closing turn after the task is done is correct and must
not be penalised. False for an environment whose episodes end on submission
(``end_rule: task_completed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ValidationError

from draco_gym.reward.answers import (
    TITLE_WORDS,
    VERDICT_SCORES,
    InvalidAnswer,
    answer_schema,
    check_attributions,
    check_augmented,
    check_fused,
    check_merged,
    check_proposed,
    check_scores,
    extract_json,
    parse_answer,
)
from draco_gym.reward.judge_client import JudgeClient, StageFailed, UsageMeter
from draco_gym.reward.render import criteria_json, render_task, render_trajectory, stage_messages, verdicts_json
from draco_gym.types import Criterion, Trajectory, Verdict

JudgingMode = Literal["separate", "fused"]
MODES = ("separate", "fused")

END_RULES = ("no_code", "task_completed")
"""The environments' end rules (``envs.base.EndRule``; the reward layer never imports envs):
the judged rubrics' ``end_rule`` says which one the rollouts ended under."""

SELF_JUDGE_SAMPLES = 3
"""The self-judge scores k = 3 times; a criterion passes only if all three pass."""


@dataclass(frozen=True)
class View:
    """How much of a rollout the judge reads: each step's message and observation (None: as
    the agent saw it, the paper's reading; a number caps it, head and tail kept), and the
    whole rollout (every step shortened alike when over, numbers kept; ours, so that G
    rollouts fit a judge's context)."""

    max_message_chars: int | None = None
    max_observation_chars: int | None = None
    max_trajectory_chars: int = 60_000

    def render(self, trajectory: Trajectory, label: str | None = None, observation_chars: int | None = None,
               max_chars: int | None = None) -> str:
        return render_trajectory(
            trajectory, label=label, max_message_chars=self.max_message_chars,
            max_observation_chars=self.max_observation_chars if observation_chars is None else observation_chars,
            max_chars=self.max_trajectory_chars if max_chars is None else max_chars,
        )


async def _ask(client: JudgeClient, meter: UsageMeter, stage: str, messages, schema, check, sample: int = 0):
    with meter.timed(stage):
        return await client.ask(stage, messages, schema, check, meter, sample=sample)


# -- stages 1-3: the rubric ----------------------------------------------------------------


async def propose(client: JudgeClient, meter: UsageMeter, task: str, *, limit: int = 15,
                  closing_turn: bool = True) -> list[Criterion]:
    """Stage 1: criteria from the task alone."""
    messages = stage_messages("propose", task=task, limit=limit, title_words=TITLE_WORDS, closing_turn=closing_turn)
    return await _ask(client, meter, "propose", messages, answer_schema("propose", max_items=limit),
                      lambda text: check_proposed(parse_answer("propose", text), limit))


async def augment(client: JudgeClient, meter: UsageMeter, task: str, proposed: list[Criterion], rollout: str, *,
                  limit: int = 10, closing_turn: bool = True) -> list[Criterion]:
    """Stage 2: criteria only this rollout's execution reveals, each anchored on its evidence."""
    messages = stage_messages("augment", task=task, criteria=criteria_json(proposed), trajectory=rollout,
                              limit=limit, title_words=TITLE_WORDS, closing_turn=closing_turn)
    return await _ask(client, meter, "augment", messages, answer_schema("augment", max_items=limit),
                      lambda text: check_augmented(parse_answer("augment", text), proposed, limit))


async def merge(client: JudgeClient, meter: UsageMeter, task: str, candidates: list[Criterion],
                rollouts: list[str], *, limit: int = 24, closing_turn: bool = True) -> list[Criterion]:
    """Stage 3: the group's rubric from every candidate, seeing all G rollouts."""
    messages = stage_messages("merge", task=task, criteria=criteria_json(candidates, with_evidence=True),
                              trajectories=rollouts, n_rollouts=len(rollouts), limit=limit, title_words=TITLE_WORDS,
                              closing_turn=closing_turn)
    return await _ask(client, meter, "merge", messages, answer_schema("merge", max_items=limit),
                      lambda text: check_merged(parse_answer("merge", text), limit))


# -- stages 4-5: verdicts ------------------------------------------------------------------


def _verdict_inputs(task: str, criteria: list[Criterion], rollout: str, n_steps: int, closing_turn: bool) -> dict:
    return {"task": task, "criteria": criteria_json(criteria), "trajectory": rollout,
            "n_criteria": len(criteria), "n_steps": n_steps, "closing_turn": closing_turn}


async def score(client: JudgeClient, meter: UsageMeter, task: str, criteria: list[Criterion], rollout: str,
                n_steps: int, *, sample: int = 0, closing_turn: bool = True) -> list[Verdict]:
    """Stage 4: +1 / -1 / 0 on every criterion, with evidence; no steps yet."""
    titles = [c.title for c in criteria]

    def check(text: str) -> list[Verdict]:
        items = check_scores(parse_answer("score", text), titles)
        return [Verdict(criterion=t, score=i.score, evidence=i.evidence, justification=i.justification)
                for t, i in zip(titles, items, strict=True)]

    messages = stage_messages("score", **_verdict_inputs(task, criteria, rollout, n_steps, closing_turn))
    return await _ask(client, meter, "score", messages, answer_schema("score", titles=titles, n_steps=n_steps),
                      check, sample)


async def attribute(client: JudgeClient, meter: UsageMeter, task: str, criteria: list[Criterion], rollout: str,
                    n_steps: int, scored: list[Verdict], *, unanimous: bool = False,
                    closing_turn: bool = True) -> list[Verdict]:
    """Stage 5: the final verdict on each criterion (confirming or overruling stage 4) and
    the steps causally responsible for it.

    ``unanimous``: ``scored`` combines k > 1 samples that had to agree on every PASS (the
    self-judge). One attribution call must not undo that: it cannot turn a FAIL or a
    NOT_APPLICABLE into a PASS (the scored verdict stands, with its own citations); it may
    still cite steps and turn a PASS into a FAIL."""
    titles = [c.title for c in criteria]
    messages = stage_messages("attribute", **_verdict_inputs(task, criteria, rollout, n_steps, closing_turn),
                              verdicts=verdicts_json(scored))
    items = await _ask(client, meter, "attribute", messages,
                       answer_schema("attribute", titles=titles, n_steps=n_steps),
                       lambda text: check_attributions(parse_answer("attribute", text), titles, n_steps))
    final = []
    for verdict, item in zip(scored, items, strict=True):
        value = VERDICT_SCORES[item.verdict]
        if unanimous and value == 1 and verdict.score != 1:
            final.append(verdict.model_copy(update={
                "justification": verdict.justification + " [attribution's PASS not taken: the samples did not all pass]"}))
            continue
        note = "" if value == verdict.score else f" [attribution overruled: {item.reason.strip()}]"
        final.append(Verdict(criterion=verdict.criterion, score=value, cited_steps=item.steps if value != 0 else [],
                             evidence=verdict.evidence, justification=verdict.justification + note))
    return final


async def score_attribute(client: JudgeClient, meter: UsageMeter, task: str, criteria: list[Criterion],
                          rollout: str, n_steps: int, *, sample: int = 0, closing_turn: bool = True) -> list[Verdict]:
    """Stages 4 and 5 in one call: final verdicts with their steps."""
    titles = [c.title for c in criteria]
    messages = stage_messages("score_attribute", **_verdict_inputs(task, criteria, rollout, n_steps, closing_turn))
    return await _ask(client, meter, "score_attribute", messages,
                      answer_schema("score_attribute", titles=titles, n_steps=n_steps),
                      lambda text: check_fused(parse_answer("score_attribute", text), titles, n_steps), sample)


def combine_samples(samples: Sequence[Sequence[Verdict] | None]) -> list[Verdict]:
    """k verdict lists over the same criteria -> one list: pass only if all k pass.

    A failed sample (None: the judge gave no usable answer) counts as not passing: with one,
    no criterion passes. Any FAIL, or a PASS/NOT_APPLICABLE disagreement, or a PASS beside a
    failed sample, is a FAIL (torn between -1 and 0, choose -1); NOT_APPLICABLE in every
    answered sample stays 0. Citations and evidence come from the samples that agree with
    the combined verdict. At least one sample must have an answer.
    """
    answered = [s for s in samples if s is not None]
    if not answered:
        raise ValueError("combine_samples needs at least one answered sample")
    failed = len(samples) - len(answered)
    combined = []
    for per_criterion in zip(*answered, strict=True):
        scores = {v.score for v in per_criterion}
        value = 0 if scores == {0} else 1 if scores == {1} and not failed else -1
        agreeing = [v for v in per_criterion if v.score == value] or list(per_criterion)
        steps = sorted({s for v in agreeing for s in v.cited_steps}) if value != 0 else []
        first = agreeing[0]
        note = "" if len(samples) == 1 else \
            f" [{sum(v.score == 1 for v in per_criterion)}/{len(samples)} samples passed" + \
            (f", {failed} failed" if failed else "") + "]"
        combined.append(Verdict(criterion=first.criterion, score=value, cited_steps=steps, evidence=first.evidence,
                                justification=first.justification + note))
    return combined


async def final_verdicts(client: JudgeClient, meter: UsageMeter, fallbacks: list[str], task: str,
                         criteria: list[Criterion], trajectories: Sequence[Trajectory], *, view: View,
                         mode: JudgingMode = "separate", samples: int = 1,
                         closing_turn: bool = True) -> list[list[Verdict]] | None:
    """Stages 4-5 for a group, each rollout on its own chain (none waits for the group's
    slowest score). ``samples`` = k > 1 scores k times and keeps a PASS only if all k pass;
    the attribution afterwards cannot turn a combined FAIL or NOT_APPLICABLE into a PASS.

    Fallbacks, recorded in ``fallbacks``: a failed sample counts as not passing (no
    criterion of that rollout passes); a rollout with no sample answered makes the group
    unscorable (None); a failed attribution keeps the stage-4 verdicts uncited (that
    rollout's credit falls back to uniform).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    async def one(index: int, trajectory: Trajectory) -> list[Verdict] | None:
        rollout, n_steps = view.render(trajectory), len(trajectory.steps)
        stage = score if mode == "separate" else score_attribute

        async def sample(k: int) -> list[Verdict] | StageFailed:
            try:
                return await stage(client, meter, task, criteria, rollout, n_steps, sample=k, closing_turn=closing_turn)
            except StageFailed as exc:
                return exc

        # one sample is awaited directly: its rollout's attribute call then queues for the
        # judge's slot in the same turn of the event loop as the score call ends (SlotGate)
        results = [await sample(0)] if samples == 1 else await asyncio.gather(*(sample(k) for k in range(samples)))
        answered = any(not isinstance(r, StageFailed) for r in results)
        for k, r in enumerate(results):
            if isinstance(r, StageFailed):
                what = f"sample {k + 1} of {samples}" if samples > 1 else "call"
                action = "counted as not passing" if answered else "trajectory unscored"
                fallbacks.append(f"{stage.__name__}[{index + 1}]: {what} failed ({r.reason}); {action}")
        if not answered:
            return None
        verdicts = combine_samples([None if isinstance(r, StageFailed) else r for r in results])
        if mode == "fused":
            return verdicts
        try:
            return await attribute(client, meter, task, criteria, rollout, n_steps, verdicts, unanimous=samples > 1,
                                   closing_turn=closing_turn)
        except StageFailed as exc:
            fallbacks.append(f"attribute[{index + 1}]: {exc.reason}; kept the stage-4 verdicts without step citations")
            return verdicts

    rows = await asyncio.gather(*(one(i, t) for i, t in enumerate(trajectories)))
    return None if any(row is None for row in rows) else list(rows)


# -- ProVer's pivotal segment --------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Steps ``start..end`` of a trajectory, 1-based and inclusive."""

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start + 1


def check_segment(start, end, n_steps: int, max_len: int = 4) -> Segment:
    """The segment if it is usable (at most ``max_len`` steps, ending before the final step);
    otherwise a ValueError whose message tells the judge what to fix."""
    for name, v in (("start", start), ("end", end)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer step number, got {v!r}")
    if n_steps < 2:
        raise ValueError(f"the trajectory has {n_steps} step(s); a non-terminal segment needs at least 2")
    if not 1 <= start <= end:
        raise ValueError(f"need 1 <= start <= end, got start={start}, end={end}")
    if end >= n_steps:
        raise ValueError(f"end={end} reaches the final step {n_steps}; the segment must end before it "
                         f"(end <= {n_steps - 1})")
    if end - start + 1 > max_len:
        raise ValueError(f"the segment {start}..{end} has {end - start + 1} steps; at most {max_len} are allowed")
    return Segment(start, end)


class _SegmentAnswer(BaseModel):
    start: int
    end: int
    reason: str = ""


SEGMENT_SCHEMA = {
    "type": "object",
    "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}, "reason": {"type": "string"}},
    "required": ["start", "end"],
}


async def segment(client: JudgeClient, meter: UsageMeter, trajectory: Trajectory, *, max_len: int = 4,
                  view: View = View(1500, 1500, 60_000), failures: Sequence[Trajectory] = (),
                  closing_turn: bool = True) -> Segment:
    """ProVer's pivotal segment of a successful rollout: at most ``max_len`` consecutive
    action steps that most made it succeed, ending before the final step. ``failures``, the
    group's failed rollouts, are shown beside it (as in the paper), sharing half the
    success's character budget, so the judge can see what the success did that they did not."""
    n_steps = len(trajectory.steps)
    each = view.max_trajectory_chars // (2 * len(failures)) if failures else 0
    failed = [view.render(t, label=f"failed-{i}", max_chars=each) for i, t in enumerate(failures, start=1)]

    def check(text: str) -> Segment:
        data = extract_json(text)
        try:
            answer = _SegmentAnswer.model_validate(data)
        except ValidationError as exc:
            raise InvalidAnswer(['the answer must be a JSON object with integer "start" and "end"'
                                 f" ({exc.error_count()} problem(s))"]) from None
        try:
            return check_segment(answer.start, answer.end, n_steps, max_len)
        except ValueError as exc:
            raise InvalidAnswer([str(exc)]) from None

    messages = stage_messages("segment", task=render_task(trajectory.task.instruction),
                              trajectory=view.render(trajectory, label="success" if failed else None),
                              failures=failed, n_steps=n_steps, max_len=max_len, closing_turn=closing_turn)
    return await _ask(client, meter, "segment", messages, SEGMENT_SCHEMA, check)


__all__ = [
    "END_RULES",
    "MODES",
    "SELF_JUDGE_SAMPLES",
    "JudgingMode",
    "Segment",
    "View",
    "attribute",
    "augment",
    "check_segment",
    "combine_samples",
    "final_verdicts",
    "merge",
    "propose",
    "score",
    "score_attribute",
    "segment",
]
