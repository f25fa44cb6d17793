"""The rule rubric against the cheapest ways to look busy, through the real environments: on
every shipped task family with reference solutions, the reference must outrank a no-op, a
print-only and a comment-only attempt (the reference commented out, then a wrong answer
submitted) on at least 95% of tasks, the four scored as one group, dropout included (the
attempts and episodes: ``rubric_hacks.py``).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from rubric_hacks import RANKED_SHARE, sweep


def check(misses: list[str], rewards: dict[str, list[float]]) -> None:
    ranked = 1 - len(misses) / len(rewards)
    detail = {t: rewards[t] for t in misses}
    assert ranked >= RANKED_SHARE, (f"the reference outranks [no-op, print-only, comment-only] on {ranked:.0%} of "
                                    f"{len(rewards)} tasks; rewards [reference, no-op, print, comment]: {detail}")


@pytest.mark.slow
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
