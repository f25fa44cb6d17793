"""Every fault a judge server can throw ends in the hand-worked group (repaired or retried)
or in an explicit, counted fallback: never a crash, never a silent wrong reward."""

from __future__ import annotations

import math

import pytest
from judge_server import JudgeServer, ScriptedJudge
from reward_fixtures import EXPECTED_REWARDS, P1, P2, P3, T1, TASK, X, assert_hand_computed, group, script

from draco_gym.reward import DynamicRubricReward, OpenAIJudge


def reward_for(server: JudgeServer, *, request_timeout_s: float = 5.0, max_retries: int = 2, **options) -> DynamicRubricReward:
    judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test",
                        request_timeout_s=request_timeout_s, max_retries=max_retries)
    options.setdefault("retry_wait_s", 0.01)
    return DynamicRubricReward(judge, **options)


REPAIRABLE = [
    ("malformed_json", "score", "ROLL-B"),
    ("missing_fields", "propose", None),
    ("unknown_title", "score", "ROLL-A"),
    ("steps_out_of_range", "attribute", "ROLL-C"),
    ("pass_without_citation", "attribute", "ROLL-A"),
    ("malformed_json", "merge", None),
    ("missing_fields", "augment", "ROLL-B"),
]


@pytest.mark.parametrize(("fault", "stage", "marker"), REPAIRABLE)
def test_invalid_answers_are_repaired(fault, stage, marker):
    with JudgeServer(ScriptedJudge(script())) as server:
        server.inject(fault, stage=stage, marker=marker)
        result = reward_for(server).score_group(TASK, group())
    assert not server.errors
    assert result.fallbacks == []
    assert_hand_computed(result)
    faulted = [r for r in server.requests if r.fault == fault]
    repairs = [r for r in server.requests if r.repair]
    assert len(faulted) == 1 and faulted[0].stage == stage
    assert len(repairs) == 1 and repairs[0].stage == stage
    assert result.usage[stage].calls == server.calls(stage)


TRANSIENT = [
    ("rate_limit", "score", "ROLL-B", 2),
    ("server_error", "augment", "ROLL-A", 1),
    ("slow", "merge", None, 1),
    ("hang", "attribute", "ROLL-A", 1),
]


@pytest.mark.parametrize(("fault", "stage", "marker", "times"), TRANSIENT)
def test_transport_faults_are_retried(fault, stage, marker, times):
    with JudgeServer(ScriptedJudge(script()), slow_s=0.2, retry_after_s=0.05) as server:
        server.inject(fault, stage=stage, marker=marker, times=times)
        result = reward_for(server, request_timeout_s=3.0).score_group(TASK, group())
    assert result.fallbacks == []
    assert_hand_computed(result)
    assert sum(r.fault == fault for r in server.requests) == times


def test_a_rollout_that_cannot_be_scored_zeroes_the_group():
    with JudgeServer(ScriptedJudge(script())) as server:
        server.inject("malformed_json", stage="score", marker="ROLL-B", times=100)
        result = reward_for(server, max_repairs=2).score_group(TASK, group())
    assert result.rewards == [0.0, 0.0, 0.0]
    assert all(not s.verdicts for s in result.scores)
    assert len(result.fallbacks) == 2
    assert result.fallbacks[0].startswith("score[2]: ") and "invalid answer after 2 repairs" in result.fallbacks[0]
    assert result.fallbacks[1].startswith("group: ")
    assert server.calls("score") == 3 + 2  # B: first answer + 2 repairs; A and C once
    assert result.usage["score"].calls == 5


def test_failed_attribution_keeps_stage4_verdicts_uncited():
    with JudgeServer(ScriptedJudge(script())) as server:
        server.inject("pass_without_citation", stage="attribute", marker="ROLL-C", times=100)
        result = reward_for(server, max_repairs=1).score_group(TASK, group())
    assert result.fallbacks == [
        "attribute[3]: invalid answer after 1 repairs: 'Finds the cheapest flight option': a PASS must cite at least one step "
        "(cite an omission where it mattered most); kept the stage-4 verdicts without step citations"]
    # C now keeps stage 4's PASS on P2, so nobody fails P2 and dropout removes it too.
    # Survivors P1, P3, T1:  A: +,-,0 -> 0   B: -,+,- -> -1/3   C: +,-,- -> -1/3
    assert [c.title for c in result.criteria] == [P1, P3, T1]
    assert sorted(result.dropped) == sorted([P2, X])
    assert [round(r, 9) for r in result.rewards] == [0.0, round(-1 / 3, 9), round(-1 / 3, 9)]
    assert all(not v.cited_steps for v in result.scores[2].verdicts)
    assert result.scores[2].step_counts(4) == ([0] * 4, [0] * 4)  # credit falls back to uniform


def test_failed_proposal_falls_back_to_the_static_rubric():
    from draco_gym.reward import STATIC_CRITERIA

    scripted, seen = ScriptedJudge(script()), []

    def judge(request):
        seen.append(request)
        return scripted(request)

    with JudgeServer(judge) as server:
        server.inject("malformed_json", stage="propose", times=100)
        result = reward_for(server, max_repairs=0).score_group(TASK, group())
    assert len(result.fallbacks) == 1 and result.fallbacks[0].startswith("propose: ")
    assert "static rubric" in result.fallbacks[0]
    assert_hand_computed(result)  # the scripted merge still decides the final rubric
    # the effect: augment and merge worked from the static rubric in place of a proposal
    later = [r for r in seen if r.stage in ("augment", "merge")]
    assert len(later) == 4  # 3 augment + 1 merge
    for request in later:
        assert all(c.title in request.data for c in STATIC_CRITERIA)
        assert P1 not in request.data.rsplit("</trajectory>", 1)[-1]  # no proposed criterion reached them


def test_unavailable_augment_adds_nothing_from_that_rollout():
    with JudgeServer(ScriptedJudge(script())) as server:
        server.inject("server_error", stage="augment", marker="ROLL-B", times=100)
        result = reward_for(server, max_retries=1, retries=1).score_group(TASK, group())
    assert len(result.fallbacks) == 1 and result.fallbacks[0].startswith("augment[2]: judge unavailable after 2 attempts")
    assert server.calls("augment", status=500) == 4  # (1 + 1 client retry) x (1 + 1 pipeline retry)
    assert_hand_computed(result)


def test_failed_merge_uses_the_deduplicated_union():
    with JudgeServer(ScriptedJudge(script())) as server:
        server.inject("malformed_json", stage="merge", times=100)
        result = reward_for(server, max_repairs=1).score_group(TASK, group())
    assert len(result.fallbacks) == 1
    assert result.fallbacks[0].startswith("merge: ") and "union of 5 candidates (5 kept)" in result.fallbacks[0]
    assert_hand_computed(result)  # union = P1 P2 P3 X T1; X still dropped
    assert {c.title: c.origin for c in result.criteria}[T1] == "trajectory"


def test_a_judge_that_hangs_hits_the_deadline_and_falls_back():
    # 4 s per request, so that a loaded machine still answers every other request in time; the
    # hang outlasts it many times over (the server releases it when it stops)
    with JudgeServer(ScriptedJudge(script()), hang_s=60) as server:
        server.inject("hang", stage="attribute", marker="ROLL-A", times=100)
        result = reward_for(server, request_timeout_s=4.0, max_retries=0, retries=1).score_group(TASK, group())
    assert len(result.fallbacks) == 1 and result.fallbacks[0].startswith("attribute[1]: judge unavailable")
    assert "APITimeoutError" in result.fallbacks[0]
    assert math.isclose(result.rewards[2], EXPECTED_REWARDS[2])


def test_thirty_percent_faults_end_scored_or_explicit():
    """Random faults on 30% of calls: each group is either exactly the hand-worked one or
    carries its fallbacks; never a different reward without a recorded reason."""
    outcomes = []
    with JudgeServer(ScriptedJudge(script()), fault_rate=0.3, seed=7, retry_after_s=0.02) as server:
        reward = reward_for(server, max_repairs=2, retries=1)
        for _ in range(4):
            result = reward.score_group(TASK, group())
            if result.fallbacks:
                outcomes.append("fallback")
            else:
                assert_hand_computed(result)
                outcomes.append("scored")
    assert sum(r.fault is not None for r in server.requests) > 0
    assert "scored" in outcomes
