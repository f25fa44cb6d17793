"""DRACO's seven stages end to end, over real HTTP, against a scripted judge: rewards,
dropout, citations and call counts checked against the hand-worked group in
reward_fixtures.py; then caching and the fused and self-judge modes."""

from __future__ import annotations

import math

import pytest
from judge_server import JudgeServer, RuleJudge, ScriptedJudge
from reward_fixtures import (
    EXPECTED_REWARDS,
    P1,
    P2,
    T1,
    TASK,
    assert_hand_computed,
    fused_answer,
    group,
    script,
)

from draco_gym.algos.credit import get_credit_rule, group_advantages
from draco_gym.reward import DynamicRubricReward, OpenAIJudge, build_reward, combine_samples
from draco_gym.types import Verdict


def make_reward(server: JudgeServer, **options) -> DynamicRubricReward:
    judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test", request_timeout_s=5, max_retries=2)
    options.setdefault("retry_wait_s", 0.01)
    return DynamicRubricReward(judge, **options)


def test_separate_stages_match_the_hand_computed_group():
    with JudgeServer(ScriptedJudge(script("separate"))) as server:
        result = make_reward(server).score_group(TASK, group())
    assert not server.errors
    assert result.fallbacks == []
    assert_hand_computed(result)
    # 3G+2 calls: 1 propose, G augment, 1 merge, G score, G attribute
    assert {s: server.calls(s) for s in ("propose", "augment", "merge", "score", "attribute")} == {
        "propose": 1, "augment": 3, "merge": 1, "score": 3, "attribute": 3}
    assert result.total_usage.calls == 11
    assert result.usage["score"].calls == 3 and result.usage["score"].prompt_tokens > 0
    # attribution is final: stage 4 passed C on P2, stage 5 overruled it
    c_p2 = next(v for v in result.scores[2].verdicts if v.criterion == P2)
    assert c_p2.score == -1 and c_p2.cited_steps == [4] and "overruled" in c_p2.justification
    origins = {c.title: c.origin for c in result.criteria}
    assert origins[T1] == "trajectory" and origins[P1] == "instruction"


def test_verdicts_feed_draco_credit():
    with JudgeServer(ScriptedJudge(script("separate"))) as server:
        result = make_reward(server).score_group(TASK, group())
    trajectories = group()
    advantages = group_advantages(result.rewards)
    steps = get_credit_rule("draco")(trajectories, result, advantages)
    # conservation: sum_j n_j a_j = A_i N_i, for every rollout
    for traj, a, per_step in zip(trajectories, advantages, steps, strict=True):
        n = traj.step_tokens
        assert math.isclose(sum(nj * aj for nj, aj in zip(n, per_step, strict=True)), a * sum(n), rel_tol=1e-9, abs_tol=1e-12)


def test_fused_mode_gives_the_same_group_in_2g_plus_2_calls():
    with JudgeServer(ScriptedJudge(script("fused"))) as server:
        result = make_reward(server, mode="fused").score_group(TASK, group())
    assert not server.errors and result.fallbacks == []
    assert_hand_computed(result)
    assert server.calls() == 2 * 3 + 2
    assert server.calls("score_attribute") == 3 and server.calls("score") == 0


def test_proposal_is_cached_per_task():
    with JudgeServer(ScriptedJudge(script())) as server:
        reward = make_reward(server)
        reward.score_group(TASK, group())
        second = reward.score_group(TASK, group())
    assert server.calls("propose") == 1
    assert second.usage["propose"].cache_hits == 1 and second.usage["propose"].calls == 0
    assert_hand_computed(second)


def test_disk_cache_makes_a_resumed_run_free(tmp_path):
    with JudgeServer(ScriptedJudge(script())) as server:
        first = make_reward(server, cache_dir=str(tmp_path)).score_group(TASK, group())
        server.reset_log()
        resumed = make_reward(server, cache_dir=str(tmp_path)).score_group(TASK, group())
    assert server.calls(status=None) == 0
    assert resumed.total_usage.calls == 0 and resumed.total_usage.cache_hits == 11
    assert resumed.rewards == first.rewards and resumed.scores == first.scores
    assert first.total_usage.cost == 0.0


def test_cost_uses_the_price_table():
    with JudgeServer(ScriptedJudge(script())) as server:
        result = make_reward(server, prices={"test-judge": [2.0, 8.0]}).score_group(TASK, group())
    usage = result.total_usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert math.isclose(usage.cost, (usage.prompt_tokens * 2.0 + usage.completion_tokens * 8.0) / 1e6)


def test_several_groups_share_one_event_loop():
    with JudgeServer(ScriptedJudge(script())) as server:
        results = make_reward(server).score_groups([(TASK, group()), (TASK, group())])
    for result in results:
        assert_hand_computed(result)


def test_server_without_json_schema_support_gets_json_object_requests():
    with JudgeServer(ScriptedJudge(script()), json_schema=False) as server:
        reward = make_reward(server)
        result = reward.score_group(TASK, group())
    assert_hand_computed(result)
    assert reward.client.judge.format == "json_object_schema"
    assert server.calls(status=400) == 1  # rejected once, then remembered


def test_self_judge_passes_only_what_all_three_samples_pass():
    answers = script("fused")
    # ROLL-A: P1 passes in two samples and fails in one -> FAIL; everything else agrees
    failing = fused_answer("ROLL-A")
    for row in failing["verdicts"]:
        if row["criterion"] == P1:
            row["verdict"], row["steps"] = "FAIL", [1]
    answers[("score_attribute", "ROLL-A")] = [fused_answer("ROLL-A"), failing, fused_answer("ROLL-A")]
    with JudgeServer(ScriptedJudge(answers)) as server:
        result = make_reward(server, mode="fused", self_judge=True).score_group(TASK, group())
    assert server.calls("score_attribute") == 9  # k=3 per rollout
    a_p1 = next(v for v in result.scores[0].verdicts if v.criterion == P1)
    assert a_p1.score == -1 and a_p1.cited_steps == [1] and "[2/3 samples passed]" in a_p1.justification
    # A: P1 F, P2 P, P3 F, T1 n/a -> p=1 f=2
    assert math.isclose(result.rewards[0], -1 / 3)
    assert result.rewards[1:] == EXPECTED_REWARDS[1:]


def test_combine_samples_rule():
    def v(score, steps):
        return Verdict(criterion="c", score=score, cited_steps=steps)

    assert combine_samples([[v(1, [1])], [v(1, [2])], [v(1, [2])]])[0].model_dump(include={"score", "cited_steps"}) == {
        "score": 1, "cited_steps": [1, 2]}
    assert combine_samples([[v(1, [1])], [v(-1, [3])], [v(1, [2])]])[0].cited_steps == [3]
    assert combine_samples([[v(0, [])], [v(0, [])], [v(0, [])]])[0].score == 0
    assert combine_samples([[v(0, [])], [v(1, [2])], [v(1, [2])]])[0].score == -1  # torn: choose -1


def test_generic_judge_through_the_registry():
    judge = RuleJudge(["Prints the final answer", "Uses the search tool"], lambda title, text: "ROLL-A" in text)
    with JudgeServer(judge) as server:
        reward = build_reward("dynamic", judge={"name": "openai", "model": "m", "base_url": server.base_url, "api_key": "k"})
        result = reward.score_group(TASK, group())
    assert not server.errors
    assert result.rewards == [1.0, -1.0, -1.0]
    assert [v.cited_steps for v in result.scores[2].verdicts] == [[4], [4]]


@pytest.mark.parametrize("bad, error, match", [
    ([], ValueError, "a group needs at least one trajectory"),
    (["only", "one"], TypeError, r"trajectories\[0\] is a str, expected Trajectory"),
])
def test_group_is_checked(bad, error, match):
    reward = DynamicRubricReward(OpenAIJudge("m", base_url="http://127.0.0.1:9/v1", api_key="k"))
    with pytest.raises(error, match=match):
        reward.score_group(TASK, bad)


def test_judge_adapts_to_reasoning_model_parameters():
    with JudgeServer(ScriptedJudge(script()), reject_params=("max_tokens", "temperature")) as server:
        reward = make_reward(server)
        result = reward.score_group(TASK, group())
    assert_hand_computed(result)
    judge = reward.client.judge
    assert judge._token_param == "max_completion_tokens" and judge._send_temperature is False
    assert server.calls(status=400) == 2  # one rejection per parameter, then remembered


def test_unrelated_bad_request_is_not_mistaken_for_a_format_problem():
    with JudgeServer(ScriptedJudge(script()), reject_params=("messages",)) as server:
        result = make_reward(server, retries=0).score_group(TASK, group())
    assert result.rewards == [0.0, 0.0, 0.0]
    assert result.fallbacks[0].startswith("propose: judge unavailable") and result.fallbacks[-1].startswith("group: ")
