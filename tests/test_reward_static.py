"""The static rubric (stages 4-7 against one fixed rubric) and the plain-function API,
over HTTP, against numbers worked by hand."""

from __future__ import annotations

import pytest
from judge_server import JudgeServer, RuleJudge
from reward_fixtures import TASK, group

from draco_gym.reward import STATIC_CRITERIA, OpenAIJudge, StaticRubricReward, score_group
from draco_gym.types import Trajectory

T0, T1 = STATIC_CRITERIA[0].title, STATIC_CRITERIA[1].title


def fails(title: str, text: str) -> bool:
    """B fails the first two static criteria, C the first; A passes everything."""
    return ("ROLL-B" in text and title in (T0, T1)) or ("ROLL-C" in text and title == T0)


def judge_for(server):
    return OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test")


@pytest.mark.parametrize("mode", ["separate", "fused"])
def test_static_rubric_by_hand(mode):
    with JudgeServer(RuleJudge([], lambda t, x: not fails(t, x))) as server:
        result = StaticRubricReward(judge_for(server), mode=mode).score_group(TASK, group())
    assert not server.errors and result.fallbacks == []
    # only T0 and T1 were failed by someone: A: +,+ -> 1   B: -,- -> -1   C: -,+ -> 0
    assert [c.title for c in result.criteria] == [T0, T1]
    assert len(result.dropped) == len(STATIC_CRITERIA) - 2
    assert result.rewards == [1.0, -1.0, 0.0]
    assert all(c.origin == "static" for c in result.criteria)
    assert server.calls() == (6 if mode == "separate" else 3)
    assert server.calls("propose") == server.calls("merge") == 0
    assert len(STATIC_CRITERIA) >= 12


def test_plain_function_with_custom_criteria_and_an_empty_rollout():
    criteria = [{"title": "Answers the question asked", "description": "d", "evaluator_instruction": "e"},
                {"title": "Cites the source used", "description": "d", "evaluator_instruction": "e"}]
    empty = Trajectory(task=TASK, steps=[])
    with JudgeServer(RuleJudge([], lambda title, text: "ROLL-A" in text)) as server:
        result = score_group(TASK, [group()[0], empty], reward="static", criteria=criteria, judge=judge_for(server))
    assert not server.errors and result.fallbacks == []
    assert result.rewards == [1.0, -1.0]
    assert all(v.cited_steps == [] for v in result.scores[1].verdicts)  # nothing to cite


def test_static_rubric_rejects_duplicate_titles():
    twice = [{"title": "Same title here"}, {"title": "same title  here"}]
    with pytest.raises(ValueError, match="unique"):
        StaticRubricReward(OpenAIJudge("m", base_url="http://127.0.0.1:9/v1"), criteria=twice)
