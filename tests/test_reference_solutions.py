"""Reference solutions as demonstrations: what ``draco-gym sft`` (and the quickstart's
warm start) trains on must actually solve its task through the real environment."""

from __future__ import annotations

import pytest

from draco_gym.envs.appworld.env import AppWorldEnv
from draco_gym.envs.appworld.runtime import AppWorldRuntime, print_progress
from draco_gym.envs.appworld.suite import ensure_offline_suite, ground_truth
from draco_gym.envs.python_tools import PythonToolsEnv
from draco_gym.envs.shop import order_item_split, order_item_tasks, purchase_split, purchase_tasks


def play(env, task_id: str, messages: list[str]) -> dict:
    """The episode's end metrics after sending ``messages``; it must end with the last one."""
    env.reset(options={"task_id": task_id})
    for k, message in enumerate(messages):
        _, _, terminated, truncated, info = env.step(message)
        assert (terminated or truncated) == (k == len(messages) - 1), (task_id, k, info.get("exec_error"))
    return info["metrics"]


@pytest.fixture(scope="module")
def source():
    return ensure_offline_suite(AppWorldRuntime(), progress=print_progress)


@pytest.mark.parametrize("end_rule", ["no_code", "task_completed"])
def test_appworld_reference_messages_solve_every_train_task(source, end_rule):
    env = AppWorldEnv("train", data_root=source.data_dir, end_rule=end_rule, show_progress=False)
    try:
        failed = {t: m["failed_requirements"] for t in env.task_ids
                  if not (m := play(env, t, env.reference_messages(t)))["success"]}
    finally:
        env.close()
    assert len(env.task_ids) == 24 and not failed, failed


def test_ground_truth_reads_reference_and_wrong_solutions(source):
    truth = ground_truth("notes-tag-count_2", source.data_dir)
    assert truth.task_id == "notes-tag-count_2" and len(truth.reference_blocks) == 3
    assert "tags=[\"recipe\"]" in truth.reference_blocks[1]
    assert truth.wrong_blocks and truth.wrong_blocks != truth.reference_blocks and truth.wrong_fails
    with pytest.raises(ValueError, match="unknown AppWorld task id 'notes-tag-count_9'"):
        ground_truth("notes-tag-count_9", source.data_dir)


def test_shop_purchase_tier_references_solve_their_tasks():
    env = PythonToolsEnv(tools=["draco_gym.envs.shop:get_product"], tasks="draco_gym.envs.shop:purchase_tasks",
                         end_rule="task_completed", max_turns=2)
    try:
        results = {t: play(env, t, env.reference_messages(t))["success"] for t in env.task_ids}
    finally:
        env.close()
    assert len(results) == 40 and all(results.values()), [t for t, ok in results.items() if not ok]
    split = purchase_split()
    assert sorted(split["train"] + split["test"]) == sorted(results) and not set(split["train"]) & set(split["test"])
    held_out_answers = {t["answer"] for t in purchase_tasks() if t["id"] in split["test"]}
    assert not held_out_answers & {t["answer"] for t in purchase_tasks() if t["id"] in split["train"]}


def test_shop_order_item_tier_references_solve_their_tasks_in_four_dependent_turns():
    """The quickstart's tasks: every reference solves its task in four turns, each but the
    last one lookup fed by what the one before returned, and the split shares no customer
    and no order."""
    env = PythonToolsEnv(tools=["draco_gym.envs.shop:find_customer", "draco_gym.envs.shop:list_orders",
                                "draco_gym.envs.shop:get_product"], tasks="draco_gym.envs.shop:order_item_tasks",
                         end_rule="task_completed", max_turns=5)
    calls = {}
    try:
        for t in env.task_ids:
            messages = env.reference_messages(t)
            assert len(messages) == 4, t
            assert play(env, t, messages)["success"], t
            calls[t] = [[c["name"] for c in s.info["tool_calls"]] for s in env.trajectory().steps]
    finally:
        env.close()
    assert len(calls) == 40 and all(c == [["find_customer"], ["list_orders"], ["get_product"], ["submit"]]
                                    for c in calls.values())
    tasks = {t["id"]: t for t in order_item_tasks()}
    split = order_item_split()
    assert sorted(split["train"] + split["test"]) == sorted(tasks) and len(split["test"]) == 20
    for key in ("customer_id", "order_id"):
        assert not {tasks[t]["metadata"][key] for t in split["train"]} & {tasks[t]["metadata"][key] for t in split["test"]}
    # a wrong ordinal gives another answer: the k-th order must be the one looked up
    by_customer = {}
    for t in tasks.values():
        by_customer.setdefault(t["metadata"]["customer_id"], []).append(t["answer"])
    assert all(len(set(a)) == len(a) for a in by_customer.values())


def test_tasks_given_by_name_must_be_importable():
    with pytest.raises(ValueError, match="tasks 'draco_gym.envs.shop:nope'"):
        PythonToolsEnv(tools=["draco_gym.envs.shop:get_product"], tasks="draco_gym.envs.shop:nope")
