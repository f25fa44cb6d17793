"""The static rubric (stages 4-7 against one fixed rubric) and the plain-function API,
over HTTP, against numbers worked by hand."""

from __future__ import annotations

import pytest
from judge_server import JudgeServer, RuleJudge
from reward_fixtures import TASK, group

from draco_gym.reward import STATIC_CRITERIA, OpenAIJudge, StaticRubricReward, score_group
from draco_gym.reward.static import PAPER_STATIC_CRITERIA, PROJECT_STATIC_CRITERIA
from draco_gym.types import Trajectory

# The DRACO paper's static rubric, Table 9, in its order.
PAPER_TITLES = [
    "Protects secret values", "Stops after completion", "Fetches complete data", "Completes task properly",
    "Computes from live data", "Handles time correctly", "Processes items completely", "Targets exact items",
    "Applies correct selection logic", "Uses complete working set", "Performs required actions",
    "Verifies action outcome", "Uses exact action content", "Uses correct data source", "Authenticates correctly",
    "Retrieves needed credentials", "Uses runnable Python", "Checks docs when needed", "Recovers from failures",
    "Uses valid API calls", "Uses allowed tools only",
]


def fails_first_two(criteria):
    """B fails the first two static criteria, C the first; A passes everything."""
    t0, t1 = criteria[0].title, criteria[1].title
    return lambda title, text: not (("ROLL-B" in text and title in (t0, t1)) or ("ROLL-C" in text and title == t0))


def judge_for(server):
    return OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test")


def test_the_paper_variant_is_the_papers_list_and_the_default():
    assert [c.title for c in PAPER_STATIC_CRITERIA] == PAPER_TITLES
    assert STATIC_CRITERIA is PAPER_STATIC_CRITERIA
    assert all(c.description and c.evaluator_instruction and c.origin == "static" for c in PAPER_STATIC_CRITERIA)
    judge = OpenAIJudge("m", base_url="http://127.0.0.1:9/v1")
    assert [c.title for c in StaticRubricReward(judge).criteria] == PAPER_TITLES
    assert StaticRubricReward(judge, variant="project").criteria == list(PROJECT_STATIC_CRITERIA)
    with pytest.raises(ValueError, match="variant must be one of \\['paper', 'project'\\]"):
        StaticRubricReward(judge, variant="appendix")


@pytest.mark.parametrize("mode, variant", [("separate", "paper"), ("fused", "paper"), ("separate", "project")])
def test_static_rubric_by_hand(mode, variant):
    criteria = PAPER_STATIC_CRITERIA if variant == "paper" else PROJECT_STATIC_CRITERIA
    with JudgeServer(RuleJudge([], fails_first_two(criteria))) as server:
        result = StaticRubricReward(judge_for(server), mode=mode, variant=variant).score_group(TASK, group())
    assert not server.errors and result.fallbacks == []
    # only the first two were failed by someone: A: +,+ -> 1   B: -,- -> -1   C: -,+ -> 0
    assert [c.title for c in result.criteria] == [criteria[0].title, criteria[1].title]
    assert len(result.dropped) == len(criteria) - 2
    assert result.rewards == [1.0, -1.0, 0.0]
    assert all(c.origin == "static" for c in result.criteria)
    assert server.calls() == (6 if mode == "separate" else 3)
    assert server.calls("propose") == server.calls("merge") == 0


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
