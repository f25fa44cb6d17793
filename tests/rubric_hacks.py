"""The cheapest ways to look busy, as data: attempts that a rubric must rank below a task's
reference solution when the four are scored as one group, and the episodes that play them
through a real environment. Used by ``tests/test_reward_rules_sweep.py`` and by the reward-hack
catalogue (``bench/reward_hacks.py``: ``sys.path.insert(0, "tests")``).

The rubric reads only what the environment recorded (``Step.info["tool_calls"]``); an
environment that records no tool calls leaves it nothing to tell these attempts apart by,
which ``ToolCallsNotRecorded`` names.
"""

from __future__ import annotations

import gymnasium as gym

from draco_gym.codeblock import parse_message
from draco_gym.envs import play_messages
from draco_gym.reward.rules import RuleRubricReward
from draco_gym.types import TOOL_CALLS

RANKED_SHARE = 0.95


class ToolCallsNotRecorded(AssertionError):
    """The environment's reference episode carries no ``Step.info["tool_calls"]``."""


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def attempts(reference: list[str], submit: str, closing: list[str]) -> dict[str, list[str]]:
    """The reference's messages and the three cheap attempts, each as the messages it sends;
    ``closing`` ends an episode under the no_code rule."""
    blocks = [parse_message(m).code for m in reference]
    commented = "\n".join("# " + line for block in blocks if block for line in block.splitlines())
    return {
        "reference": reference,
        "no-op": [fence("pass")] + closing,
        "print-only": [fence(f"print('hi')\n{submit}")] + closing,
        "comment-only": [fence(f"{commented}\n{submit}")] + closing,
    }


def sweep(env: gym.Env, task_ids: list[str], submit: str, closing: list[str]) -> tuple[list[str], dict[str, list[float]]]:
    """(tasks the reference does not outrank every cheap attempt on, rewards per task)."""
    reward = RuleRubricReward()
    misses, rewards = [], {}
    for n, task_id in enumerate(task_ids):
        plays = {name: play_messages(env, task_id, messages)
                 for name, messages in attempts(env.unwrapped.reference_messages(task_id), submit, closing).items()}
        reference = plays["reference"]
        assert reference.metrics.get("success"), (task_id, reference.metrics)
        if n == 0 and not any(TOOL_CALLS in s.info for s in reference.steps if s.code is not None):
            raise ToolCallsNotRecorded(f"{type(env.unwrapped).__name__} records no Step.info[{TOOL_CALLS!r}]: "
                                       "the rule rubric has no tool call to read")
        group = reward.score_group(reference.task, list(plays.values()))
        rewards[task_id] = group.rewards
        if not group.rewards[0] > max(group.rewards[1:]):
            misses.append(task_id)
    return misses, rewards
