"""CodeStepEnv's one action hook: an environment whose action is not a code block overrides
``_act`` and nothing else, and still gets the turn budget, truncation, counts and record."""

from __future__ import annotations

import gymnasium as gym
import pytest

from draco_gym.envs.base import CodeStepEnv, Execution, Outcome, WorldLost
from draco_gym.types import Task, Termination


class Echo(CodeStepEnv):
    """Says back what it hears; "stop" ends the episode, "bad" is a malformed action."""

    def _start(self, seed, options):
        return Task(id="echo", instruction="talk", agent_prompt="Say something.")

    def _act(self, action):
        if action == "bad":
            return Outcome("Error: not understood.", parse_error=True)
        if action == "stop":
            return Outcome("bye", termination=Termination.AGENT_STOP, info={"said": action})
        return Outcome("x" * 1000 + action, code=action, info={"said": action}, exec_error="oops" in action)


def test_one_hook_gets_the_whole_step():
    env = Echo(max_turns=10, max_observation_chars=200)
    env.reset()
    observation, reward, terminated, truncated, info = env.step("hello")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert len(observation) <= 200 and observation.endswith("hello") and "characters truncated" in observation
    assert info == {"task_id": "echo", "step": 1, "said": "hello"}
    env.step("bad")
    env.step("oops")
    _, _, terminated, truncated, info = env.step("stop")
    assert terminated and not truncated and env.termination == Termination.AGENT_STOP
    traj = info["trajectory"]
    assert [s.code for s in traj.steps] == ["hello", None, "oops", None]
    assert traj.metrics == {"parse_errors": 1, "exec_errors": 1}
    with pytest.raises(gym.error.ResetNeeded, match=r"the episode has ended \(agent_stop\)"):
        env.step("more")


def test_the_turn_budget_applies_to_an_overridden_action():
    env = Echo(max_turns=2)
    env.reset()
    env.step("a")
    _, _, terminated, truncated, info = env.step("b")
    assert truncated and not terminated and info["trajectory"].termination == Termination.MAX_TURNS


# -- state keys ----------------------------------------------------------------------------


class Rooms(Echo):
    """Names its states: a block "go(X)" moves to room X, unless it raised (X contains "oops")."""

    names_states = True

    def _state_key_after(self, code):
        return code[3:-1] if code.startswith("go(") else None


def test_each_step_carries_the_key_of_the_state_it_was_taken_in():
    """The key changes after a block that ran without error and named a new state; a failed
    block, a block naming none and a malformed message leave it; reset starts again."""
    from draco_gym.types import STATE_KEY

    env = Rooms(max_turns=10)
    env.reset()
    keys = [env.step(a)[4][STATE_KEY] for a in ["go(hall)", "look", "go(oops)", "bad", "go(kitchen)", "look"]]
    assert keys == ["start", "hall", "hall", "hall", "hall", "kitchen"]
    env.reset()
    assert env.step("look")[4][STATE_KEY] == "start"
    assert STATE_KEY not in _first_info(Echo())  # an env that names no states adds no key


def _first_info(env):
    env.reset()
    return env.step("go(hall)")[4]


# -- restart and replay -------------------------------------------------------------------


class Tally(CodeStepEnv):
    """A world (a list of the blocks run) held by a 'process' that the block "crash" kills;
    ``restart_fails`` makes every restart fail."""

    def __init__(self, restart_fails=False, **kwargs):
        super().__init__(**kwargs)
        self.restart_fails = restart_fails
        self.world: list[str] = []
        self.restarts = 0

    def _start(self, seed, options):
        self.world = []
        return Task(id="tally", instruction="count", agent_prompt="Run blocks.")

    def _run(self, code):
        if code == "crash":
            raise WorldLost("the process died", "process_died")
        self.world.append(code)
        return Execution(output=",".join(self.world))

    def _restart(self):
        self.restarts += 1
        if self.restart_fails:
            raise RuntimeError("no process could start")
        self.world = []


def block(code):
    return f"```python\n{code}\n```"


def test_a_lost_process_is_restarted_and_the_earlier_blocks_replayed():
    env = Tally()
    env.reset()
    env.step(block("a"))
    env.step(block("b"))
    observation, _, terminated, _, info = env.step(block("crash"))
    assert not terminated and info["exec_error"] == "process_died"
    assert "the process died" in observation and "re-run" in observation
    assert env.restarts == 1 and env.world == ["a", "b"]  # replayed, the lost block left out
    assert env.step(block("c"))[0] == "a,b,c"
    env.reset()  # a new episode replays nothing of the last one
    env.step(block("crash"))
    assert env.restarts == 2 and env.world == []


def test_a_failed_replay_ends_the_episode_as_env_error():
    env = Tally(restart_fails=True)
    env.reset()
    env.step(block("a"))
    observation, _, terminated, _, info = env.step(block("crash"))
    assert terminated and env.termination == Termination.ENV_ERROR
    assert "could not be restored" in observation and "no process could start" in observation
    assert info["trajectory"].termination == Termination.ENV_ERROR
