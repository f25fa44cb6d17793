"""AppWorld pieces that need no engine: metrics, task sources, setup failures, registration."""

from __future__ import annotations

import json
import os
import sys

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401
from draco_gym.envs.appworld.metrics import by_difficulty, scenario_of, sgc, tgc
from draco_gym.envs.appworld.runtime import AppWorldRuntime, SetupError
from draco_gym.envs.appworld.suite import TaskSource


def test_tgc_and_sgc_follow_the_benchmark_definitions():
    results = [
        {"task_id": "a1b2c3_1", "success": True, "difficulty": 1},
        {"task_id": "a1b2c3_2", "success": True, "difficulty": 1},
        {"task_id": "a1b2c3_3", "success": True, "difficulty": 1},
        {"task_id": "ffee00_1", "success": True, "difficulty": 3},
        {"task_id": "ffee00_2", "success": False, "difficulty": 3},
        {"task_id": "ffee00_3", "success": True, "difficulty": 3},
    ]
    assert tgc(results) == pytest.approx(5 / 6)
    assert sgc(results) == 0.5  # one of two scenarios has every task passing
    assert by_difficulty(results) == {1: {"tgc": 1.0, "sgc": 1.0, "n": 3}, 3: {"tgc": pytest.approx(2 / 3), "sgc": 0.0, "n": 3}}
    # a repeated failing attempt of a passing task sinks its scenario, never lifts it
    assert sgc(results[:3] + [{"task_id": "a1b2c3_1", "success": False}]) == 0.0


def test_metric_inputs_are_checked():
    with pytest.raises(ValueError, match="no results"):
        tgc([])
    with pytest.raises(ValueError, match="needs 'task_id' and 'success'"):
        sgc([{"task": "x_1"}])
    with pytest.raises(ValueError, match="no scenario part"):
        scenario_of("nounderscore")
    assert scenario_of("note-to-file_2") == "note-to-file"
    assert scenario_of("82e2fac_1:tag") == "82e2fac"


def _data_folder(root, splits):
    data = root / "data"
    for split, ids in splits.items():
        (data / "datasets").mkdir(parents=True, exist_ok=True)
        (data / "datasets" / f"{split}.txt").write_text("\n".join(ids) + "\n")
        for task_id in ids:
            task = data / "tasks" / task_id.split(":")[0]
            (task / "ground_truth").mkdir(parents=True, exist_ok=True)
            (task / "specs.json").write_text("{}")
            (task / "ground_truth" / "metadata.json").write_text(json.dumps({"difficulty": 2}))
    return data


def test_task_source_reads_a_real_layout(tmp_path):
    _data_folder(tmp_path, {"train": ["50e1ac9_1", "50e1ac9_2:tagged"], "test_normal": ["aa_1"]})
    for given in (tmp_path, tmp_path / "data"):  # the APPWORLD_ROOT or its data/ folder
        source = TaskSource(given)
        assert source.splits == ["test_normal", "train"]
        assert source.task_ids("train") == ["50e1ac9_1", "50e1ac9_2"]
        assert source.has_task("aa_1") and not source.has_task("../aa_1") and not source.has_task("zz_1")
        assert source.metadata("aa_1") == {"difficulty": 2}
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        source.task_ids("dev")
    with pytest.raises(FileNotFoundError, match="not an AppWorld data folder"):
        TaskSource(tmp_path / "nowhere")


def test_appworld_is_registered_without_importing_the_engine():
    assert "draco_gym/AppWorld-v0" in gym.registry
    assert "appworld" not in sys.modules
    spec = gym.spec("draco_gym/AppWorld-v0")
    assert spec.entry_point == "draco_gym.envs.appworld.env:AppWorldEnv"


def test_cli_setup_routes_appworld_to_its_runtime():
    from draco_gym.cli import SUBCOMMANDS
    from draco_gym.setup_cli import TARGETS

    assert SUBCOMMANDS["setup"][0] == "draco_gym.setup_cli"
    assert TARGETS["appworld"][0] == "draco_gym.envs.appworld.setup_cli"


def test_setup_without_the_package_index_says_what_to_do(tmp_path, monkeypatch):
    # no index, no local wheels: exactly what a machine without network access sees
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    runtime = AppWorldRuntime(tmp_path / "home")
    messages = []
    with pytest.raises(SetupError) as caught:
        runtime.ensure(messages.append)
    text = str(caught.value)
    assert "pip could not download appworld==0.1.3.post1" in text
    assert "draco-gym setup appworld" in text and "PIP_INDEX_URL" in text
    assert not runtime.is_ready()  # never marked complete: the next call starts over
    assert any(m.startswith("[2/3]") for m in messages)


# the offline suite's delete-tagged-notes_1, ground_truth/reference_solution.json as built
DELETE_TAGGED_NOTES = [
    "passwords = {a[\"account_name\"]: a[\"password\"] for a in apis.supervisor.show_account_passwords()}\n"
    "profile = apis.supervisor.show_profile()\n"
    "simple_note_token = apis.simple_note.login(username=profile[\"email\"], password=passwords[\"simple_note\"])[\"access_token\"]",
    "notes, page = [], 0\nwhile True:\n    batch = apis.simple_note.search_notes(access_token=simple_note_token, "
    "tags=[\"books\"], page_index=page, page_limit=20)\n    if not batch:\n        break\n    notes += batch\n    page += 1",
    "for n in notes:\n    print(apis.simple_note.delete_note(access_token=simple_note_token, note_id=n[\"note_id\"]))",
    "apis.supervisor.complete_task()",
]


def test_operator_library_of_an_offline_task(tmp_path):
    """The rule rubric's items for delete-tagged-notes_1 come from its reference solution:
    the reads as evidence, the actions as execution, and each is hit by the block that
    makes that call (the generic items are gone from those families)."""
    from draco_gym.reward.rules import rule_library
    from draco_gym.types import TOOL_CALLS, Step, Task, Trajectory

    data = _data_folder(tmp_path, {"train": ["delete-tagged-notes_1"]})
    (data / "tasks" / "delete-tagged-notes_1" / "ground_truth" / "reference_solution.json").write_text(
        json.dumps(DELETE_TAGGED_NOTES))
    operators = TaskSource(tmp_path).operators("delete-tagged-notes_1")
    assert operators == {
        "evidence": ["apis.supervisor.show_account_passwords", "apis.supervisor.show_profile",
                     "apis.simple_note.search_notes"],
        "execution": ["apis.simple_note.login", "apis.simple_note.delete_note", "apis.supervisor.complete_task"],
    }
    task = Task(id="delete-tagged-notes_1", instruction="Delete my notes tagged books.",
                metadata={"api_docs": True, "operators": operators})
    library = rule_library(task)
    assert library.families["evidence"].items == (
        "reads_documentation", "calls:apis.supervisor.show_account_passwords", "calls:apis.supervisor.show_profile",
        "calls:apis.simple_note.search_notes")
    assert library.titles["calls:apis.simple_note.search_notes"] == "Gets data from apis.simple_note.search_notes"
    assert library.titles["calls:apis.simple_note.delete_note"] == "Calls apis.simple_note.delete_note"
    recorded = [["apis.supervisor.show_account_passwords", "apis.supervisor.show_profile", "apis.simple_note.login"],
                ["apis.simple_note.search_notes"], ["apis.simple_note.delete_note"], ["apis.supervisor.complete_task"]]
    steps = [Step(index=i, text="t", code=code, observation="ok",
                  info={"exec_error": None, TOOL_CALLS: [{"name": n, "ok": True} for n in names]})
             for i, (code, names) in enumerate(zip(DELETE_TAGGED_NOTES, recorded), start=1)]
    hits = library.transition_items(Trajectory(task=task, steps=steps))
    assert [h["evidence"] for h in hits] == [
        ["calls:apis.supervisor.show_account_passwords", "calls:apis.supervisor.show_profile"],
        ["calls:apis.simple_note.search_notes"], [], []]
    assert [h["execution"] for h in hits] == [
        ["calls:apis.simple_note.login"], [], ["calls:apis.simple_note.delete_note"], ["calls:apis.supervisor.complete_task"]]
    # a block that raised reaches no subgoal, even though it names the API
    failed = steps[2].model_copy(update={"index": 1, "info": {
        "exec_error": "KeyError", TOOL_CALLS: [{"name": "apis.simple_note.delete_note", "ok": False}]}})
    assert library.transition_items(Trajectory(task=task, steps=[failed]))[0]["execution"] == []


def test_operator_library_of_a_real_appworld_task(tmp_path):
    """Real AppWorld data has no reference_solution.json: the API set comes from the
    compiled solution, read as AppWorld's GroundTruth.required_apis reads it."""
    data = _data_folder(tmp_path, {"train": ["82e2fac_1"]})
    (data / "tasks" / "82e2fac_1" / "ground_truth" / "compiled_solution.py").write_text(
        "def solution(apis, requester):\n"
        "    token = apis.spotify.login(username='a', password='b')['access_token']\n"
        "    songs = apis.spotify.show_playlist(playlist_id=1, access_token=token)\n"
        "    for s in songs:\n        apis.spotify.like_song(song_id=s, access_token=token)\n"
        "    apis.api_docs.show_api_doc(app_name='spotify', api_name='like_song')\n"
        "    apis.supervisor.complete_task()\n")
    assert TaskSource(tmp_path).operators("82e2fac_1") == {
        "evidence": ["apis.spotify.show_playlist"],
        "execution": ["apis.spotify.login", "apis.spotify.like_song", "apis.supervisor.complete_task"],
    }
    _data_folder(tmp_path / "bare", {"train": ["x_1"]})
    assert TaskSource(tmp_path / "bare").operators("x_1") == {"evidence": [], "execution": []}


def test_a_channel_line_over_its_cap_is_refused_without_reading_the_rest():
    """What a shell sends is bounded: a newline-free flood stops at the cap (plus one read),
    and anything sent unasked shows as pending before the next request."""
    import socket
    import threading
    import time

    from draco_gym.envs.os_sandbox import JsonLines

    ours, theirs = socket.socketpair()
    writer = ours.makefile("wb")
    channel = JsonLines(writer, ours.fileno(), max_line=1 << 20)

    def send_flood() -> None:
        try:
            theirs.sendall(b"x" * (64 << 20))
        except OSError:  # we stop reading and close: the flood goes nowhere
            pass

    assert not channel.has_pending()
    theirs.sendall(b'{"status": 200}\n')
    assert channel.has_pending() and channel.receive(time.monotonic() + 5) == {"status": 200}
    assert not channel.has_pending()
    flood = threading.Thread(target=send_flood, daemon=True)
    flood.start()
    with pytest.raises(ValueError, match="longer than 1,048,576 bytes"):
        channel.receive(time.monotonic() + 30)
    assert len(channel._pending) <= (1 << 20) + (1 << 16)
    writer.close()
    ours.close()
    flood.join(10)
    theirs.close()


# -- guard mode is refused for AppWorld (its shell is not confined as PythonTools' is) ---------


def test_guard_mode_is_refused_at_construction_naming_bwrap(tmp_path):
    """Before any task folder is read or any engine process started: the data root here does
    not exist, and the refusal still comes first."""
    from draco_gym.envs.appworld.server import ServerPool

    with pytest.raises(ValueError, match=r"only inside bubblewrap \(sandbox='bwrap'\).*guard mode is refused.*apt-get install bubblewrap"):
        gym.make("draco_gym/AppWorld-v0", data_root=str(tmp_path / "nothing"), sandbox="guard", show_progress=False)
    with pytest.raises(ValueError, match="guard mode is refused for AppWorld"):
        ServerPool(AppWorldRuntime(tmp_path), tmp_path, sandbox="guard")
    with pytest.raises(ValueError, match="guard mode is refused for AppWorld"):
        ServerPool.shared(AppWorldRuntime(tmp_path), tmp_path, sandbox="guard")


def test_auto_without_bubblewrap_is_refused_for_appworld_not_fallen_back(monkeypatch, tmp_path):
    """PythonTools falls back to guard mode where bubblewrap cannot run; AppWorld refuses."""
    from draco_gym.envs import os_sandbox

    monkeypatch.setattr(os_sandbox.shutil, "which", lambda name: None)
    os_sandbox.bwrap_problem.cache_clear()
    try:
        for mode in ("auto", "bwrap"):
            with pytest.raises(os_sandbox.SandboxUnavailable, match=rf"sandbox='{mode}' needs bubblewrap, but .*not on PATH.*apt-get"):
                gym.make("draco_gym/AppWorld-v0", data_root=str(tmp_path), sandbox=mode, show_progress=False)
    finally:
        os_sandbox.bwrap_problem.cache_clear()


def test_the_driver_refuses_guard_mode_for_appworld_before_ray(tmp_path):
    """``draco-gym train`` (and eval, sft) build the environment once in the driver
    (``prepare``) before Ray starts: the refusal is a config error naming the key."""
    from draco_gym.algos.cli.prepare import prepare
    from draco_gym.algos.config import ConfigError, load_config

    config = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "quickstart_appworld.yaml"),
                         ["env.config.sandbox=guard"])
    with pytest.raises(ConfigError, match=r"env.config: .*AppWorld runs agent code only inside bubblewrap"):
        prepare(config)
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_the_suite_cache_key_hashes_the_builder(tmp_path, monkeypatch):
    """A changed ``suite_builder.py`` (its tests, say) gives a new cache key, so the next
    environment builds a fresh suite instead of grading with the old tests."""
    from draco_gym.envs.appworld import suite

    runtime = AppWorldRuntime(tmp_path)
    key = suite.suite_fingerprint(runtime, 0)
    assert suite.suite_fingerprint(runtime, 1) != key
    edited = tmp_path / "suite_builder.py"
    edited.write_bytes(suite.BUILDER_SCRIPT.read_bytes() + b"\n# a changed test\n")
    monkeypatch.setattr(suite, "BUILDER_SCRIPT", edited)
    assert suite.suite_fingerprint(runtime, 0) != key
