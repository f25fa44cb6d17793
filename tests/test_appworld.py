"""AppWorld on the real engine: the env, the offline suite, recovery and hostile code.

The session fixture creates the isolated runtime and builds the offline suite with the
project's own code when they are missing (a clean CI machine), and reuses them when cached.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from draco_gym.envs.appworld import AppWorldEnv, ServerPool, ensure_offline_suite, list_tasks, sgc, tgc
from draco_gym.envs.appworld.runtime import AppWorldRuntime, print_progress
from draco_gym.envs.appworld.suite import BUILDER_SCRIPT
from draco_gym.types import Termination


@pytest.fixture(scope="session")
def source():
    return ensure_offline_suite(AppWorldRuntime(), progress=print_progress)


@pytest.fixture()
def env(source):
    environment = AppWorldEnv("train", data_root=source.data_dir, step_timeout_s=30, show_progress=False)
    yield environment
    environment.close()


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def run_blocks(env: AppWorldEnv, task_id: str, blocks: list[str]) -> dict:
    env.reset(options={"task_id": task_id})
    for block in blocks:
        _, _, terminated, truncated, info = env.step(fence(block))
        assert not (terminated or truncated), info
    _, _, terminated, _, info = env.step("Done.")
    assert terminated and env.trajectory().termination == Termination.NO_CODE
    return info["metrics"]


# -- the suite ------------------------------------------------------------------------------


def test_suite_shape(source):
    ids = {split: list_tasks(split, source.data_dir) for split in ("train", "dev", "test")}
    assert {k: len(v) for k, v in ids.items()} == {"train": 24, "dev": 12, "test": 12}
    every = [t for v in ids.values() for t in v]
    assert len(set(every)) == 48
    scenarios: dict[str, list[str]] = {}
    for task_id in every:
        scenarios.setdefault(task_id.rsplit("_", 1)[0], []).append(task_id)
    assert all(len(tasks) == 3 for tasks in scenarios.values())
    split_of = {t.rsplit("_", 1)[0]: s for s, v in ids.items() for t in v}
    assert len(split_of) == len(scenarios)  # a scenario never straddles splits
    meta = [source.metadata(t) for t in every]
    assert {m["kind"] for m in meta} == {"question", "action"}
    assert len({app for m in meta for app in m["apps"]}) >= 4
    for task_id in every:
        assert len(source.ground_truth_file(task_id, "test_data.json")) >= 2
        assert source.ground_truth_file(task_id, "reference_solution.json")


def test_unknown_task_and_split_are_clear_errors(source):
    with pytest.raises(ValueError, match="unknown split 'nope'.*train"):
        list_tasks("nope", source.data_dir)
    env = AppWorldEnv("train", data_root=source.data_dir, show_progress=False)
    with pytest.raises(ValueError, match=r"unknown AppWorld task id 'photo-count_9'.*did you mean"):
        env.reset(options={"task_id": "photo-count_9"})
    with pytest.raises(ValueError, match="unknown AppWorld task id '../etc'"):
        env.reset(options={"task_id": "../etc"})
    env.close()


# -- episodes through gym.make ------------------------------------------------------------


def test_reference_and_wrong_solutions_through_gym_make(source):
    env = gym.make("draco_gym/AppWorld-v0", split="train", data_root=str(source.data_dir), show_progress=False)
    try:
        inner = env.unwrapped
        obs, info = env.reset(seed=3, options={"task_id": "delete-tagged-notes_2"})
        assert "Task: Delete every note tagged" in obs and "show_account_passwords" in obs and "```python" in obs
        assert info["task_id"] == "delete-tagged-notes_2"
        for task_id in ["delete-tagged-notes_2", "contacts-relationship-count_3"]:
            metrics = run_blocks(inner, task_id, source.ground_truth_file(task_id, "reference_solution.json"))
            assert metrics["success"] and metrics["tests_passed"] == metrics["tests_total"] >= 2, metrics
            wrong = source.ground_truth_file(task_id, "wrong_solution.json")
            metrics = run_blocks(inner, task_id, wrong["blocks"])
            assert not metrics["success"]
            assert any(f.startswith(wrong["fails"]) for f in metrics["failed_requirements"]), metrics
        trajectory = inner.trajectory()
        assert trajectory.metrics["task_id"] == "contacts-relationship-count_3"
        assert trajectory.steps[-2].info.get("submitted")
        results = [{"task_id": "a_1", "success": True}, {"task_id": "a_2", "success": False}]
        assert (tgc(results), sgc(results)) == (0.5, 0.0)
    finally:
        env.close()


def test_task_completed_end_rule_and_max_turns(source):
    env = AppWorldEnv("train", data_root=source.data_dir, end_rule="task_completed", max_turns=3, show_progress=False)
    try:
        env.reset(options={"task_id": "notes-tag-count_1"})
        _, _, terminated, truncated, info = env.step("no code here")
        assert not terminated and "no code block" in env.trajectory().steps[-1].observation
        blocks = source.ground_truth_file("notes-tag-count_1", "reference_solution.json")
        env.step(fence(blocks[0]))
        _, _, terminated, truncated, info = env.step(fence("print(1)"))
        assert truncated and not terminated and env.trajectory().termination == Termination.MAX_TURNS
        assert info["metrics"]["success"] is False
        # completion reached indirectly still counts: the server watches the API call itself
        env.reset(options={"task_id": "notes-tag-count_1"})
        _, _, terminated, _, info = env.step(fence("getattr(apis.supervisor, 'complete' + '_task')(answer=3)"))
        assert terminated and info["submitted"] and env.trajectory().termination == Termination.SUBMITTED
    finally:
        env.close()


def test_check_env_passes(env):
    from gymnasium.utils.env_checker import check_env

    check_env(env, skip_render_check=True)


# -- bad input ------------------------------------------------------------------------------

HOSTILE = {
    "os.system": "import os\nos.system('touch {marker}')",
    "subprocess": "import subprocess\nsubprocess.run(['touch', '{marker}'])",
    # AppWorld's own guard lets these through (seen on 0.1.3.post1); the server's audit hook stops them
    "posix.system bypass": "__import__('posix').system('touch {marker}')",
    "posix.mkdir bypass": "__import__('posix').mkdir('{marker}')",
    "_io write bypass": "__import__('_io').FileIO('{marker}', 'w')",
    "file write": "open('{marker}', 'w').write('x')",
    "socket": "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))",
    "syntax error": "def broken(:\n    pass",
    "unknown api": "apis.simple_note.teleport_note(note_id=1)",
    "wrong password": "apis.venmo.login(username='mara.whitfield@gmail.com', password='hunter2')",
    "memory bomb": "blob = 'a' * (64 * 2**30)",
    "growing memory bomb": "hoard = []\nwhile True:\n    hoard.append(bytearray(2**28))",
    "infinite loop": "while True:\n    pass",
}


def test_hostile_code_is_an_error_observation_and_the_episode_goes_on(env, tmp_path):
    marker = tmp_path / "pwned"
    env.reset(options={"task_id": "photo-count_1"})
    env.step(fence("kept = 41"))
    for name, code in HOSTILE.items():
        started = time.monotonic()
        observation, _, terminated, truncated, info = env.step(fence(code.format(marker=marker)))
        assert not (terminated or truncated), name
        assert info["exec_error"], f"{name}: no error reported; observation {observation[:300]!r}"
        assert "Execution failed" in observation, name
        assert time.monotonic() - started < env.step_timeout_s + 10, name
        assert not marker.exists(), f"{name} touched the host"
    # AppWorld's guard turns some writers (pathlib's) into silent no-ops rather than errors:
    # no error observation then, but the host must still be untouched
    env.step(fence(f"import pathlib\npathlib.Path('{marker}').write_text('x')"))
    env.step(fence(f"m = __import__('o' + 's')\nm.system('touch {marker}')"))
    assert not marker.exists()
    observation, *_ = env.step(fence("print(kept + 1)"))
    assert observation.strip() == "42"  # the session survived all of it
    observation, _, _, _, info = env.step(fence("print('x' * 10_000_000)"))
    assert len(observation) <= env.max_observation_chars and "characters" in observation
    assert env.recoveries == 0


# -- server lifecycle -----------------------------------------------------------------------


def test_server_killed_between_steps_is_replaced_and_state_replayed(env, source):
    task_id = "note-of-contacts_2"
    blocks = source.ground_truth_file(task_id, "reference_solution.json")
    env.reset(options={"task_id": task_id})
    for block in blocks[:2]:
        env.step(fence(block))
    old_pid = env._server.process.pid
    os.kill(old_pid, signal.SIGKILL)
    env._server.process.wait(10)
    for block in blocks[2:]:
        _, _, terminated, _, info = env.step(fence(block))
        assert not terminated and info["exec_error"] is None, info
    _, _, terminated, _, info = env.step("All done.")
    assert env._server.process.pid != old_pid and env.recoveries == 1
    assert info["metrics"]["success"], info["metrics"]


def test_restore_replays_messages(env, source):
    assert env.can_restore
    task_id = "text-relationship_1"
    blocks = [fence(b) for b in source.ground_truth_file(task_id, "reference_solution.json")]
    env.restore(task_id, blocks[:-1])
    _, _, _, _, info = env.step(blocks[-1])
    _, _, terminated, _, info = env.step("Sent.")
    assert terminated and info["metrics"]["success"]


def test_pool_reuses_servers_and_shuts_them_down(source):
    runtime = AppWorldRuntime()
    pool = ServerPool(runtime, source.data_dir, max_servers=1)
    env = AppWorldEnv("dev", data_root=source.data_dir, pool=pool, show_progress=False)
    env.reset(options={"task_id": "note-list-item_1"})
    first = env._server
    env.reset(options={"task_id": "note-list-item_2"})  # next episode: same server
    assert env._server is first
    env.close()
    other = AppWorldEnv("dev", data_root=source.data_dir, pool=pool, show_progress=False)
    other.reset(options={"task_id": "note-list-item_3"})
    assert other._server is first and pool.size == 1  # handed on, not restarted
    pid = first.process.pid
    health = first.health()  # its pid is the sandbox's own (a PID namespace): not compared
    assert health["ok"] and health["task_id"] == "note-list-item_3"
    other.close()
    pool.shutdown()
    assert not first.alive
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_stuck_server_is_killed_after_the_timeout_and_replayed(source):
    env = AppWorldEnv("train", data_root=source.data_dir, step_timeout_s=2, grace_s=4, show_progress=False)
    try:
        env.reset(options={"task_id": "photo-count_2"})
        env.step(fence("kept = 'still here'"))
        # swallows the engine's own timeout exception: only the client-side deadline stops it
        started = time.monotonic()
        observation, _, terminated, _, info = env.step(
            fence("while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass")
        )
        assert not terminated and info["exec_error"] == "server_died"
        assert time.monotonic() - started < 60
        assert env.recoveries == 1
        observation, *_ = env.step(fence("print(kept)"))
        assert observation.strip() == "still here"
    finally:
        env.close()


@pytest.mark.slow
def test_no_orphan_when_the_owner_is_killed(source, tmp_path):
    pid_file = tmp_path / "server.pid"
    script = textwrap.dedent(f"""
        from draco_gym.envs.appworld import AppWorldEnv
        env = AppWorldEnv("train", data_root={str(source.data_dir)!r}, show_progress=False)
        env.reset(options={{"task_id": "photo-count_1"}})
        processes = [env._server.world, env._server.forks, env.pool.evaluator.process]
        open({str(pid_file)!r}, "w").write(" ".join(f"{{p.process.pid}}:{{p._workdir}}" for p in processes))
        import time; time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 240
        while not pid_file.exists():
            assert owner.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        servers = [entry.split(":", 1) for entry in pid_file.read_text().split()]
        assert len(servers) == 3  # the world, the shell fork server, the evaluator
        for pid, _ in servers:
            os.kill(int(pid), 0)
        owner.kill()  # SIGKILL: no atexit runs; each process's watchdog (or bubblewrap) must notice
        owner.wait(10)
        for pid, scratch in servers:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(int(pid), signal.SIGKILL)
                pytest.fail(f"process {pid} outlived its owner")
            assert not Path(scratch).exists(), "an orphaned process left its scratch folder behind"
    finally:
        if owner.poll() is None:
            owner.kill()


@pytest.mark.slow
def test_two_envs_run_in_parallel_on_two_servers(source):
    pool = ServerPool(AppWorldRuntime(), source.data_dir, max_servers=2)
    envs = [AppWorldEnv("train", data_root=source.data_dir, pool=pool, show_progress=False) for _ in range(2)]
    results: dict[str, dict] = {}

    def episode(env, task_id):
        results[task_id] = run_blocks(env, task_id, source.ground_truth_file(task_id, "reference_solution.json"))

    threads = [threading.Thread(target=episode, args=(e, t)) for e, t in zip(envs, ["venmo-received-from_1", "photo-count_3"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert {t: r["success"] for t, r in results.items()} == {"venmo-received-from_1": True, "photo-count_3": True}
    assert envs[0]._server is not envs[1]._server and pool.size == 2
    for e in envs:
        e.close()
    pool.shutdown()


@pytest.mark.slow
def test_every_reference_solution_passes_and_every_wrong_one_fails(source):
    env = AppWorldEnv("train", data_root=source.data_dir, show_progress=False)
    failures = []
    results = []
    try:
        for split in ("train", "dev", "test"):
            for task_id in source.task_ids(split):
                metrics = run_blocks(env, task_id, source.ground_truth_file(task_id, "reference_solution.json"))
                results.append(metrics)
                if not metrics["success"]:
                    failures.append((task_id, "reference", metrics["failed_requirements"]))
                wrong = source.ground_truth_file(task_id, "wrong_solution.json")
                metrics = run_blocks(env, task_id, wrong["blocks"])
                if metrics["success"] or not any(f.startswith(wrong["fails"]) for f in metrics["failed_requirements"]):
                    failures.append((task_id, "wrong", metrics["failed_requirements"]))
    finally:
        env.close()
    assert not failures, json.dumps(failures, indent=1)
    assert tgc(results) == sgc(results) == 1.0


@pytest.mark.slow
def test_builder_is_deterministic(source, tmp_path):
    runtime = AppWorldRuntime()
    builder = Path(source.data_dir).parent
    subprocess.run([str(runtime.python), str(BUILDER_SCRIPT), "--out", str(tmp_path), "--seed", "0"], check=True, env=runtime.subprocess_env(tmp_path),
                   capture_output=True)
    for path in sorted((builder / "data" / "tasks").rglob("*.json")):
        twin = tmp_path / "data" / path.relative_to(builder / "data")
        assert twin.read_text() == path.read_text(), path


def test_reference_solution_hits_its_operator_library_and_names_states(env, source):
    """On the real engine: the task's metadata carries its operator library, the reference
    solution hits every item of it, and each step's state key is the last API called before it."""
    from draco_gym.reward.rules import RuleRubricReward, rule_library
    from draco_gym.types import STATE_KEY

    task_id = "delete-tagged-notes_1"
    metrics = run_blocks(env, task_id, source.ground_truth_file(task_id, "reference_solution.json"))
    assert metrics["success"]
    trajectory = env.trajectory()
    assert trajectory.task.metadata["api_docs"] is True
    assert trajectory.task.metadata["operators"] == source.operators(task_id)
    assert [s.info[STATE_KEY] for s in trajectory.steps] == [
        "start", "simple_note.login", "simple_note.search_notes", "simple_note.delete_note", "supervisor.complete_task"]
    library = rule_library(trajectory.task)
    hit = {item for step in library.transition_items(trajectory) for items in step.values() for item in items}
    operators = [i for f in ("evidence", "execution") for i in library.families[f].items if i.startswith("calls:")]
    assert len(operators) == 6 and set(operators) <= hit
    verdicts = {v.criterion: v.score for v in RuleRubricReward(dropout=False).score_group(
        trajectory.task, [trajectory]).scores[0].verdicts}
    assert all(verdicts[library.titles[i]] == 1 for i in operators)
    assert verdicts["Reads the API documentation"] == -1  # the reference solution never looks anything up
