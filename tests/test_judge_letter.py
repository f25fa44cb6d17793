"""The paper's letter in what the judge reads: every stage's prompt opens with the closing-turn
caveat under ``end_rule: no_code``, and the judge reads each message, observation and agent
prompt as the agent saw it unless a cap is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from judge_server import JudgeServer, ScriptedJudge
from reward_fixtures import TASK, assert_hand_computed, group, script

from draco_gym.reward import DynamicRubricReward, OpenAIJudge, StaticRubricReward
from draco_gym.reward.render import PROMPTS_DIR, render_task, stage_messages
from draco_gym.reward.stages import View
from draco_gym.types import Step, Trajectory

CAVEAT = "a brief closing message without code is the correct way to end the episode: never penalise it"
STAGES = sorted(p.stem for p in Path(PROMPTS_DIR).glob("*.j2") if not p.stem.startswith("_"))
# every variable some stage's template reads
VARIABLES = {"task": "<task>t</task>", "criteria": "[]", "trajectory": "<trajectory/>", "trajectories": ["<trajectory/>"],
             "failures": [], "verdicts": "[]", "n_steps": 3, "n_criteria": 1, "n_rollouts": 1, "limit": 5, "max_len": 2}


def test_every_judge_prompt_carries_the_closing_turn_caveat_under_no_code():
    assert {"propose", "augment", "merge", "score", "attribute", "score_attribute", "segment"} <= set(STAGES)
    for stage in STAGES:
        system, _ = stage_messages(stage, closing_turn=True, **VARIABLES)
        assert CAVEAT in system["content"], stage
        assert system["content"].index(CAVEAT) < 800, f"{stage}: the caveat opens the prompt"
        system, _ = stage_messages(stage, closing_turn=False, **VARIABLES)
        assert CAVEAT not in system["content"], stage


def test_the_rubrics_say_it_to_the_judge_by_default_and_not_under_task_completed(tmp_path):
    scripted, seen = ScriptedJudge(script()), []

    def judge(request):
        seen.append(request)
        return scripted(request)

    with JudgeServer(judge) as server:
        client = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test")
        result = DynamicRubricReward(client, retry_wait_s=0.01).score_group(TASK, group())
        assert_hand_computed(result)
        assert {r.stage for r in seen} == {"propose", "augment", "merge", "score", "attribute"}
        assert all(CAVEAT in r.messages[0]["content"] for r in seen)
        seen.clear()
        DynamicRubricReward(client, retry_wait_s=0.01, end_rule="task_completed").score_group(TASK, group())
        assert seen and not any(CAVEAT in r.messages[0]["content"] for r in seen)
    with pytest.raises(ValueError, match="end_rule must be one of"):
        StaticRubricReward(lambda messages: "{}", end_rule="no-code")


def _long_trajectory() -> Trajectory:
    step = Step(index=1, text="M" * 7000 + "\n```python\nx = 1\n```", code="x = 1", observation="O" * 9000)
    return Trajectory(task=TASK, steps=[step], termination="no_code")


def test_the_judge_reads_the_rollout_as_the_agent_saw_it_unless_capped():
    traj = _long_trajectory()
    whole = View().render(traj)
    assert "M" * 7000 in whole and "O" * 9000 in whole and "truncated" not in whole
    capped = View(max_message_chars=6000, max_observation_chars=2000).render(traj)
    assert "O" * 2001 not in capped and "M" * 6001 not in capped and capped.count("characters truncated") == 2
    prompt = "P" * 5000
    assert "P" * 5000 in render_task("do it", prompt)
    assert "P" * 3001 not in render_task("do it", prompt, max_prompt_chars=3000)
    for rubric in (DynamicRubricReward(lambda messages: "{}"), StaticRubricReward(lambda messages: "{}")):
        assert (rubric.view.max_message_chars, rubric.view.max_observation_chars, rubric.max_prompt_chars) == \
            (None, None, None)
    assert DynamicRubricReward(lambda messages: "{}", max_observation_chars=2000).view.max_observation_chars == 2000
