"""Agent code cannot forge AppWorld's outcome (issue 23).

Every hack of ``appworld_hacks.HACKS`` is played through ``gym.make("draco_gym/AppWorld-v0",
sandbox="bwrap")`` (AppWorld's only mode: guard mode is refused, ``test_appworld_units.py``)
on the process-wide pool, as a user would: the hacked episode, a no-op
episode after it on the same server, one in a new environment, more resets. Then the
pieces that make it hold: the relayed API calls recorded outside the agent's process,
the world refusing what is not an app's API, a protocol breach ending only its episode,
and a shell without capabilities, task files or ground truth.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from appworld_hacks import HACKS, HACK_TASK, by_name, fence, run_hack
from draco_gym.envs import os_sandbox
from draco_gym.envs.appworld import AppWorldRuntime, ensure_offline_suite
from draco_gym.types import TOOL_CALLS, Termination

needs_bwrap = pytest.mark.skipif(os_sandbox.bwrap_problem() is not None, reason=f"bubblewrap: {os_sandbox.bwrap_problem()}")


@pytest.fixture(scope="module")
def source():
    return ensure_offline_suite(AppWorldRuntime())


def maker(source):
    return lambda: gym.make("draco_gym/AppWorld-v0", data_root=str(source.data_dir), sandbox="bwrap",
                            step_timeout_s=20, show_progress=False)


@needs_bwrap
@pytest.mark.parametrize("name", [hack.name for hack in HACKS])
def test_hack_does_not_forge_the_outcome(name, source):
    outcome = run_hack(maker(source), by_name(name))
    assert not outcome.forged, outcome
    if name in ("forged_replies", "malformed_line", "flooded_line"):
        assert outcome.termination == Termination.ENV_ERROR, outcome
        assert "protocol" in outcome.observations[-1], outcome.observations[-1][:300]
    if name == "ground_truth_from_disk":  # the shell's sandbox has no task files to read
        assert "answer None" in outcome.observations[0], outcome.observations[0][:500]


@needs_bwrap
def test_api_calls_are_recorded_outside_the_agent_process(source):
    """Each step's ``tool_calls`` are the world's answers to the calls the relay carried,
    in order, failed ones included; what the agent's code claims does not enter them."""
    env = maker(source)()
    try:
        env.reset(options={"task_id": "notes-tag-count_1"})
        blocks = source.ground_truth_file("notes-tag-count_1", "reference_solution.json")
        _, _, _, _, info = env.step(fence(blocks[0]))
        assert [c["name"] for c in info[TOOL_CALLS]] == [
            "supervisor.show_account_passwords", "supervisor.show_profile", "simple_note.login"]
        assert all(c["ok"] for c in info[TOOL_CALLS])
        _, _, _, _, info = env.step(fence(
            "try:\n    apis.simple_note.login(username='mara.whitfield@gmail.com', password='wrong')\n"
            "except Exception as e:\n    print('refused')\n"
            "print({'tool_calls': [{'name': 'supervisor.complete_task', 'ok': True}]})"))
        assert [(c["name"], c["ok"]) for c in info[TOOL_CALLS]] == [("simple_note.login", False)]
        _, _, _, _, info = env.step(fence("x = 1"))
        assert info[TOOL_CALLS] == []
    finally:
        env.close()


@needs_bwrap
def test_the_world_answers_only_the_tasks_apps(source):
    """The API server's own routes (set databases, seed, save to a path) and the payment
    admin app are refused by the world; agent code reaches them only through the relay."""
    env = maker(source)()
    try:
        env.reset(options={"task_id": HACK_TASK})
        code = ("for url in ['/dbs', '/seed', '/dbs/save', '/admin/credit']:\n"
                "    try:\n        requester.post(url, data={'seed': 3})\n        print('served', url)\n"
                "    except Exception as e:\n        print('refused', url)")
        observation, _, _, _, info = env.step(fence(code))
        assert "served" not in observation and observation.count("refused") == 4, observation
        assert [(c["name"], c["ok"]) for c in info[TOOL_CALLS]] == [
            ("dbs", False), ("seed", False), ("dbs/save", False), ("admin/credit", False)]
    finally:
        env.close()


@needs_bwrap
def test_the_shell_has_no_capabilities_no_task_files_and_no_ground_truth(source):
    """bubblewrap started by root keeps every capability unless told not to (a process could
    then remount a read-only folder writable); the shell's data folder holds the API docs
    and its own task's specs, nothing else; its task carries no ground truth."""
    env = maker(source)()
    try:
        env.reset(options={"task_id": HACK_TASK})
        code = ("o = __import__('posix')\nstatus = o.read(o.open('/proc/self/status', o.O_RDONLY), 1 << 16).decode()\n"
                "print([l for l in status.splitlines() if l.startswith('CapEff')])\n"
                "root = o.environ[b'APPWORLD_ROOT'].decode() + '/data'\nprint(sorted(o.listdir(root)), o.listdir(root + '/tasks'))\n"
                "print(sorted(o.listdir(root + '/tasks/" + HACK_TASK + "')))\n"
                "g = __import__('gc')\nprint([type(o).__name__ for o in g.get_objects() "
                "if type(o).__name__ in ('GroundTruth', 'ModelCollection')])")
        observation, *_ = env.step(fence(code))
        lines = observation.strip().splitlines()
        # AppWorld's print shows a lone list as JSON
        assert json.loads(lines[0]) == ["CapEff:\t0000000000000000"], observation
        assert lines[1] == f"['api_docs', 'tasks'] ['{HACK_TASK}']", observation
        assert json.loads(lines[2]) == ["specs.json"] and json.loads(lines[3]) == [], observation
    finally:
        env.close()
