"""The rule rubric against the cheapest ways to look busy, through the real environments: on
every shipped task family with reference solutions, the reference must outrank a no-op, a
print-only and a comment-only attempt (the reference commented out, then a wrong answer
submitted) on at least 95% of tasks, the four scored as one group, dropout included.

The rubric reads only what the environment recorded (``Step.info["tool_calls"]``); an
environment that records no tool calls leaves it nothing to tell these attempts apart by,
which ``ToolCallsNotRecorded`` names.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from draco_gym.codeblock import parse_message
from draco_gym.reward.rules import RuleRubricReward
from draco_gym.types import TOOL_CALLS, Trajectory

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


def play(env: gym.Env, task_id: str, messages: list[str]) -> Trajectory:
    """The episode that sends ``messages`` (the last one again until the episode ends)."""
    env.reset(options={"task_id": task_id})
    for k in range(env.unwrapped.max_turns):
        _, _, terminated, truncated, info = env.step(messages[min(k, len(messages) - 1)])
        if terminated or truncated:
            return info["trajectory"]
    raise AssertionError(f"{task_id}: the episode did not end within max_turns")


def sweep(env: gym.Env, task_ids: list[str], submit: str, closing: list[str]) -> tuple[list[str], dict[str, list[float]]]:
    """(tasks the reference does not outrank every cheap attempt on, rewards per task)."""
    reward = RuleRubricReward()
    misses, rewards = [], {}
    for n, task_id in enumerate(task_ids):
        plays = {name: play(env, task_id, messages)
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


def check(misses: list[str], rewards: dict[str, list[float]]) -> None:
    ranked = 1 - len(misses) / len(rewards)
    detail = {t: rewards[t] for t in misses}
    assert ranked >= RANKED_SHARE, (f"the reference outranks [no-op, print-only, comment-only] on {ranked:.0%} of "
                                    f"{len(rewards)} tasks; rewards [reference, no-op, print, comment]: {detail}")


@pytest.mark.slow
@pytest.mark.xfail(raises=ToolCallsNotRecorded, strict=True,
                   reason="PythonTools records no Step.info['tool_calls'] yet (the pytools change): remove this mark "
                          "when it lands")
def test_shop_purchase_tier_reference_outranks_cheap_attempts():
    """The quickstart's env: the shop's purchase tier, ending at submit()."""
    env = gym.make("draco_gym/PythonTools-v0", tools=["draco_gym.envs.shop:get_product",
                                                      "draco_gym.envs.shop:list_products"],
                   tasks="draco_gym.envs.shop:purchase_tasks", end_rule="task_completed", max_turns=2)
    try:
        misses, rewards = sweep(env, env.unwrapped.task_ids, "submit(0)", [])
    finally:
        env.close()
    assert len(rewards) == 40
    check(misses, rewards)


@pytest.mark.slow
@pytest.mark.xfail(raises=ToolCallsNotRecorded, strict=True,
                   reason="AppWorld records no Step.info['tool_calls'] yet (the appworld change): remove this mark "
                          "when it lands")
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_appworld_offline_suite_reference_outranks_cheap_attempts(split):
    """Every task of the offline suite, under DRACO's no_code end rule."""
    from draco_gym.envs.appworld import ensure_offline_suite
    from draco_gym.envs.appworld.env import CLOSING_MESSAGE
    from draco_gym.envs.appworld.runtime import AppWorldRuntime

    source = ensure_offline_suite(AppWorldRuntime())
    env = gym.make("draco_gym/AppWorld-v0", split=split, data_root=source.data_dir, end_rule="no_code",
                   max_turns=12, show_progress=False)
    try:
        misses, rewards = sweep(env, env.unwrapped.task_ids, "apis.supervisor.complete_task(answer=0)",
                                [CLOSING_MESSAGE])
    finally:
        env.close()
    assert len(rewards) == {"train": 24, "dev": 12, "test": 12}[split]
    check(misses, rewards)
