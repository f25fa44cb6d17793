"""Rubrics combined by weight (rule + outcome), and ProVer's segment as a judge stage."""

from __future__ import annotations

import math

import pytest

from draco_gym.reward import JudgeClient, OutcomeReward, RuleRubricReward, UsageMeter, WeightedReward, build_reward
from draco_gym.reward.base import run_sync
from draco_gym.reward.stages import Segment, segment
from draco_gym.types import Step, Task, Trajectory

TASK = Task(id="t", instruction="Submit the total.")


def traj(success, *, error: bool) -> Trajectory:
    info = {"parse": {"n_blocks": 1, "error": None, "warning": None}, "exec_error": "KeyError" if error else None}
    steps = [Step(index=1, text="a", code="x = f()", observation="KeyError" if error else "42", info=info, n_tokens=3),
             Step(index=2, text="b", code="submit(x)", observation="done", info={**info, "exec_error": None,
                                                                              "submitted": True}, n_tokens=3),
             Step(index=3, text="Done.", n_tokens=1)]
    metrics = {} if success is None else {"success": success}
    return Trajectory(task=TASK, steps=steps, termination="no_code", metrics=metrics)


GROUP = [traj(True, error=False), traj(False, error=True), traj(None, error=False)]


def test_weighted_sum_of_rule_and_outcome():
    rule, outcome = RuleRubricReward().score_group(TASK, GROUP), OutcomeReward().score_group(TASK, GROUP)
    combined = WeightedReward([(RuleRubricReward(), 0.25), (OutcomeReward(), 2.0)]).score_group(TASK, GROUP)
    for i in range(3):
        assert math.isclose(combined.rewards[i], 0.25 * rule.rewards[i] + 2.0 * outcome.rewards[i])
        # the rule part's verdicts (and their step citations) are kept for DRACO credit
        assert combined.scores[i].verdicts == rule.scores[i].verdicts
        # and the passes on criteria dropout removed, which the rubric pass rate counts
        assert combined.scores[i].dropped_passes == rule.scores[i].dropped_passes
    assert sum(s.dropped_passes for s in rule.scores) > 0
    assert combined.criteria == rule.criteria
    # the outcome part's missing metric is a fallback, named by its part
    assert combined.fallbacks == [f"outcome: {f}" for f in outcome.fallbacks] and combined.fallbacks


def test_weighted_reward_from_a_yaml_config():
    reward = build_reward("weighted", parts=[{"name": "rule", "weight": 0.5},
                                             {"name": "outcome", "weight": 0.5, "options": {"metric": "success"}}])
    assert [(name, w) for name, _, w in reward.parts] == [("rule", 0.5), ("outcome", 0.5)]
    assert len(reward.score_group(TASK, GROUP).rewards) == 3
    same = build_reward("weighted", parts=[{"name": "outcome"}, {"name": "outcome", "weight": -1}])
    assert [name for name, _, _ in same.parts] == ["outcome1", "outcome2"]
    assert same.score_group(TASK, GROUP).rewards == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("parts, error, match", [
    ([], ValueError, "at least one part"),
    ([{"name": "rule", "wieght": 1}], ValueError, r"parts\[0\] must be \{name, weight, options\}"),
    ([{"name": "rule", "weight": float("nan")}], ValueError, r"parts\[0\]: weight must be finite"),
    ([("rule", 1.0)], TypeError, r"parts\[0\]\[0\] must be a RubricReward"),
    ([{"name": "rubric"}], KeyError, "unknown reward 'rubric'"),
])
def test_weighted_reward_rejects_bad_parts(parts, error, match):
    with pytest.raises(error, match=match):
        WeightedReward(parts)


def test_segment_is_a_stage_with_its_own_template():
    seen = []

    def judge(messages):
        seen.append(messages)
        return '{"start": 1, "end": 2, "reason": "fetches, then submits"}' if len(seen) > 1 else '{"start": 2, "end": 4}'

    meter = UsageMeter()
    long_run = Trajectory(task=TASK, steps=[*GROUP[0].steps, Step(index=4, text="Bye.")])
    assert run_sync(segment(JudgeClient(judge_fn(judge)), meter, long_run, max_len=4)) == Segment(1, 2)
    system, user = seen[0][0]["content"], seen[0][1]["content"]
    assert "Stage segment" in system and "pivotal" in system
    assert '<step n="4">' in user and "at most 3" in user  # the final step is excluded
    assert "end=4 reaches the final step 4" in seen[1][-1]["content"]  # the repair names the mistake
    assert meter.stages["segment"].calls == 2


def judge_fn(fn):
    from draco_gym.reward import FunctionJudge

    return FunctionJudge(fn)
