"""Properties of stages 6-7 on random verdict matrices, and the sync API inside a running
event loop."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from judge_server import JudgeServer, ScriptedJudge
from reward_fixtures import EXPECTED_REWARDS, TASK, group, script

from draco_gym.reward import DynamicRubricReward, OpenAIJudge, finalize_group
from draco_gym.types import Criterion, Verdict

matrices = st.integers(1, 6).flatmap(
    lambda n_criteria: st.lists(st.lists(st.sampled_from([-1, 0, 1]), min_size=n_criteria, max_size=n_criteria), min_size=1, max_size=8)
)


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_dropout_and_reward_properties(matrix):
    n = len(matrix[0])
    criteria = [Criterion(title=f"criterion number {j}") for j in range(n)]
    verdicts = [[Verdict(criterion=c.title, score=s, cited_steps=[1] if s else []) for c, s in zip(criteria, row, strict=True)] for row in matrix]
    group = finalize_group(criteria, verdicts)
    kept = [j for j in range(n) if any(row[j] == -1 for row in matrix)]
    assert [c.title for c in group.criteria] == [criteria[j].title for j in kept]
    assert len(group.criteria) + len(group.dropped) == n
    for row, score in zip(matrix, group.scores, strict=True):
        p = sum(row[j] == 1 for j in kept)
        f = sum(row[j] == -1 for j in kept)
        assert (score.p, score.f) == (p, f)
        assert score.reward == (0.0 if p + f == 0 else (p - f) / (p + f))
        assert -1.0 <= score.reward <= 1.0
    # someone failed every surviving criterion, so no group is all +1 unless nothing survived
    if group.criteria:
        assert min(group.rewards) < 1.0


def test_sync_api_works_inside_a_running_event_loop():
    with JudgeServer(ScriptedJudge(script())) as server:
        reward = DynamicRubricReward(OpenAIJudge("test-judge", base_url=server.base_url, api_key="k"))

        async def notebook_cell():
            return reward.score_group(TASK, group())  # sync call from async code

        result = asyncio.run(notebook_cell())
    assert result.rewards == pytest.approx(EXPECTED_REWARDS)
