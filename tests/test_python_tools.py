"""PythonTools on the code-step base: registration, the Gymnasium contract, end rules, the
sandbox against hostile code, recovery after the interpreter dies, and restoring state."""

import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import draco_gym
from draco_gym.envs.python_tools import PythonToolsEnv, answers_match
from draco_gym.types import Termination


def code(src: str) -> str:
    return f"```python\n{src}\n```"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TASKS = [{"id": "sum", "instruction": "What is 2 + 3?", "answer": 5}]


@pytest.fixture
def env():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, step_timeout_s=3.0)
    yield e
    e.close()


def test_registered_ids_and_make_forms():
    gym.register_envs(draco_gym)
    e1 = gym.make("draco_gym/PythonTools-v0")
    e2 = gym.make("draco_gym:draco_gym/PythonTools-v0", max_turns=7, end_rule="task_completed")
    assert isinstance(e1.unwrapped, PythonToolsEnv) and len(e1.unwrapped.task_ids) == 24
    assert e2.unwrapped.max_turns == 7 and e2.unwrapped.end_rule == "task_completed"
    e1.close()
    e2.close()


def test_registering_imports_no_environment_module():
    probe = ("import sys, draco_gym, gymnasium as gym; "
             "assert 'draco_gym/PythonTools-v0' in gym.registry; "
             "heavy = [m for m in ('draco_gym.envs.python_tools', 'draco_gym.envs.appworld.env', 'tau2', 'torch', 'ray') "
             "if m in sys.modules]; sys.exit(str(heavy) if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_check_env_passes():
    e = gym.make("draco_gym/PythonTools-v0").unwrapped
    check_env(e, skip_render_check=False)
    e.close()


def test_episode_records_a_trajectory(env):
    obs, info = env.reset(options={"task_id": "sum"})
    assert "add(a: int, b: int) -> int" in obs and "What is 2 + 3?" in obs and info["task_id"] == "sum"
    obs, reward, term, trunc, info = env.step("First I add.\n" + code("x = add(2, 3)\nprint(x)"))
    assert (obs.strip(), reward, term, trunc) == ("5", 0.0, False, False)
    env.step(code("submit(x)"))
    obs, _, term, trunc, info = env.step("I submitted 5.")
    assert term and not trunc
    traj = info["trajectory"]
    assert traj.termination == Termination.NO_CODE
    assert [s.index for s in traj.steps] == [1, 2, 3] and traj.steps[2].code is None
    assert traj.metrics["success"] is True and traj.metrics["answer"] == 5
    assert traj.task.agent_prompt == env.task.agent_prompt and env.trajectory() == traj


def test_task_completed_end_rule_and_missing_code():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, end_rule="task_completed")
    e.reset(options={"task_id": "sum"})
    obs, _, term, _, info = e.step("I think it is 5.")
    assert not term and obs.startswith("Error: no code block") and e.trajectory().metrics["parse_errors"] == 1
    _, _, term, _, info = e.step(code("submit(6)"))
    assert term and info["trajectory"].termination == Termination.SUBMITTED
    assert info["metrics"]["success"] is False
    e.close()


def test_max_turns_truncates():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, max_turns=2)
    e.reset(seed=1)
    assert e.step(code("print(1)"))[3] is False
    _, _, term, trunc, info = e.step(code("print(2)"))
    assert trunc and not term and info["trajectory"].termination == Termination.MAX_TURNS
    with pytest.raises(gym.error.ResetNeeded, match=r"the episode has ended \(max_turns\); call reset\(\)"):
        e.step(code("print(3)"))
    e.close()


def test_long_output_is_truncated_in_the_middle():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, max_observation_chars=500)
    e.reset(seed=0)
    obs = e.step(code("print('a' * 5000 + 'END')"))[0]
    assert len(obs) <= 500 and obs.rstrip().endswith("END") and "characters truncated" in obs
    e.close()


def test_malformed_messages_are_counted_error_observations(env):
    env.reset(seed=0)
    obs = env.step(code("print(1)") + "\n" + code("print(2)"))[0]
    assert "found 2 code blocks" in obs
    obs = env.step("```python\nprint(1)")[0]
    assert "never closed" in obs
    traj = env.trajectory()
    assert traj.metrics["parse_errors"] == 2 and all(s.code is None for s in traj.steps)


HOSTILE = {
    "shell": ("import os\nos.system('touch /tmp/draco_pwned')", "PermissionError"),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', '/tmp/draco_pwned'])", "PermissionError"),
    "write outside": ("open('/tmp/draco_pwned', 'w').write('x')", "PermissionError"),
    "delete outside": ("import os\nos.remove('/tmp/draco_keep')", "PermissionError"),
    "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "PermissionError"),
    "memory bomb": ("x = bytearray(8 * 1024 ** 3)", "MemoryError"),
    "syntax error": ("def f(:\n    pass", "SyntaxError"),
    "unknown tool": ("multiply(2, 3)", "NameError"),
    "exit": ("raise SystemExit(3)", "SystemExit"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_is_an_error_observation_and_the_episode_goes_on(env, name, tmp_path):
    src, error = HOSTILE[name]
    with open("/tmp/draco_keep", "w") as f:
        f.write("keep")
    env.reset(seed=0)
    env.step(code("y = add(1, 1)"))
    obs, _, term, trunc, info = env.step(code(src))
    assert info["exec_error"] == error and error in obs and not (term or trunc)
    assert env.step(code("print(y)"))[0].strip() == "2"  # the session survived
    assert not os.path.exists("/tmp/draco_pwned") and open("/tmp/draco_keep").read() == "keep"


def test_writing_inside_the_workdir_is_allowed(env):
    env.reset(seed=0)
    obs = env.step(code("open('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read())"))[0]
    assert obs.strip() == "hi"


def test_huge_print_is_capped():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, output_limit=1000)
    e.reset(seed=0)
    obs, _, _, _, info = e.step(code("print('x' * 10_000_000)"))
    assert info["exec_error"] is None and "[output cut: " in obs and len(obs) < 1200
    e.close()


def test_infinite_loop_times_out_and_variables_are_restored():
    e = PythonToolsEnv(tools=[add], tasks=TASKS, step_timeout_s=1.0)
    e.reset(seed=0)
    e.step(code("z = add(20, 22)"))
    start = time.monotonic()
    obs, _, term, _, info = e.step(code("while True:\n    pass"))
    # Cut at the step's deadline, not at some later one: the margin covers the interpreter's
    # restart on a loaded machine, far below the 10 s default a deadline left unset would take.
    assert time.monotonic() - start < e.step_timeout_s + 8
    assert info["exec_error"] == "TimeoutError" and "restarted" in obs and not term
    assert e.step(code("print(z)"))[0].strip() == "42"
    e.close()


@pytest.mark.parametrize("reaped", [False, True], ids=["seen-while-reading", "seen-before-sending"])
def test_killed_interpreter_is_restarted_and_replayed(env, reaped):
    env.reset(seed=0)
    env.step(code("w = add(3, 4)"))
    os.killpg(env._interpreter._proc.pid, signal.SIGKILL)
    if reaped:  # the exit is noticed before the next block is sent, not while reading its reply
        env._interpreter._proc.wait()
    obs, _, term, _, info = env.step(code("print(w)"))
    assert info["exec_error"] == "SandboxError" and "died" in obs and not term
    assert env.step(code("print(w * 2)"))[0].strip() == "14"


def test_close_leaves_no_process_or_directory(env):
    env.reset(seed=0)
    pid, workdir = env._interpreter._proc.pid, env._interpreter.workdir
    env.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not os.path.exists(workdir)


def test_restore_replays_a_prefix(env):
    messages = [code("a = add(1, 2)"), code("b = a * 10")]
    obs, _ = env.restore("sum", messages)
    assert env.step(code("print(a + b)"))[0].strip() == "33"
    assert len(env.trajectory().steps) == 3


def test_bad_configuration_and_reset_options():
    with pytest.raises(ValueError, match="top-level function"):
        PythonToolsEnv(tools=[lambda: 1], tasks=TASKS)
    with pytest.raises(ValueError, match="needs tasks"):
        PythonToolsEnv(tools=[add], tasks=[])
    with pytest.raises(ValueError, match="tool 'draco_gym.envs.shop:no_such': module .* has no attribute"):
        PythonToolsEnv(tools=["draco_gym.envs.shop:no_such"], tasks=TASKS)
    with pytest.raises(ValueError, match="end_rule must be one of"):
        PythonToolsEnv(tools=[add], tasks=TASKS, end_rule="never")
    e = PythonToolsEnv(tools=[add], tasks=TASKS)
    with pytest.raises(ValueError, match="unknown task_id 'nope'"):
        e.reset(options={"task_id": "nope"})
    with pytest.raises(ValueError, match="unknown reset options"):
        e.reset(options={"taskid": "sum"})
    with pytest.raises(gym.error.ResetNeeded, match=r"call reset\(\) before step\(\)"):
        e.step(code("print(1)"))
    e.close()


def test_answers_match():
    assert answers_match("5", 5) and answers_match(5.0000000001, 5) and answers_match("1,234.50", 1234.5)
    assert not answers_match("five", 5) and not answers_match(None, 5)
    assert answers_match("  Deluxe   Scale ", "deluxe scale") and not answers_match("scale", "deluxe scale")


def test_state_key_names_the_last_tool_call_before_each_step(env):
    """info["state_key"] is the state a step was taken in: the last tool call (with its
    arguments) of a block that ran cleanly; a failing block or one without a tool call
    leaves it as it was, and a new episode starts from "start"."""
    from draco_gym.types import STATE_KEY

    env.reset()
    keys = []
    for block in ["x = add(1, 2)\ny = add(x, b=4)", "print(y)", "add(undefined, 1)", "print(add( 2,3 ))"]:
        keys.append(env.step(code(block))[4][STATE_KEY])
    _, _, terminated, _, info = env.step("Done.")
    keys.append(info[STATE_KEY])
    assert keys == ["start", "add(x, b=4)", "add(x, b=4)", "add(x, b=4)", "add(2, 3)"]
    assert [s.info[STATE_KEY] for s in env.trajectory().steps] == keys
    env.reset()
    assert env.step(code("print(1)"))[4][STATE_KEY] == "start"


# -- tools outside the sandbox: stubs, the parent's record, fresh state per interpreter ----

class OutOfStock(LookupError):
    """A tool's own exception type."""


_calls_made = []  # module state of the tools' process


def stock(item: str, *, warehouse: str = "main") -> dict:
    """How many of ``item`` are in ``warehouse``."""
    _calls_made.append(item)
    print(f"looking up {item}")
    if item == "kite":
        raise OutOfStock(f"{item} is out of stock in {warehouse}")
    return {"item": item, "warehouse": warehouse, "count": len(_calls_made), "pair": (1, 2)}


def opaque() -> object:
    """Returns something that is not plain data."""
    return object()


def read_catalogue(path: str) -> str:
    """Reads a data file (the tool runs outside the sandbox, so it needs no listing)."""
    with open(path) as f:
        return f.read()


@pytest.fixture
def shop_env():
    e = PythonToolsEnv(tools=[stock, opaque, read_catalogue, add], tasks=TASKS, step_timeout_s=5.0)
    yield e
    e.close()


def test_stubs_look_like_the_tools_and_return_plain_data(shop_env):
    shop_env.reset(options={"task_id": "sum"})
    obs = shop_env.step(code("import inspect\nprint(inspect.signature(stock))\nprint(stock.__doc__)\n"
                             "r = stock('ball', warehouse='east')\nprint(r['warehouse'], r['pair'], type(r['pair']).__name__)\n"
                             "print(add(2, b=3))"))[0]
    import inspect

    assert str(inspect.signature(stock)) == "(item: str, *, warehouse: str = 'main') -> dict"
    assert obs.startswith(str(inspect.signature(stock)) + "\n"), obs
    assert "How many of ``item`` are in ``warehouse``." in obs
    assert "looking up ball" in obs and "east (1, 2) tuple" in obs and obs.strip().endswith("5")


def test_a_tools_exception_is_raised_in_agent_code_as_its_kind(shop_env):
    shop_env.reset(options={"task_id": "sum"})
    obs, _, _, _, info = shop_env.step(code("try:\n    stock('kite')\nexcept LookupError as e:\n"
                                            "    print('caught', type(e).__name__, e)"))
    assert "caught OutOfStock kite is out of stock in main" in obs, obs
    obs, _, _, _, info = shop_env.step(code("stock('kite', warehouse='west')"))
    assert info["exec_error"] == "OutOfStock" and "OutOfStock: kite is out of stock in west" in obs
    assert "test_python_tools.py" not in obs  # the tool's own frames stay on the tools' side


def test_what_is_not_plain_data_is_a_type_error_in_agent_code(shop_env):
    shop_env.reset(options={"task_id": "sum"})
    obs, _, _, _, info = shop_env.step(code("stock(object())"))
    assert info["exec_error"] == "TypeError" and "is not plain data" in obs
    obs, _, _, _, info = shop_env.step(code("opaque()"))
    assert info["exec_error"] == "TypeError" and "opaque() returned a object is not plain data" in obs
    obs, _, _, _, info = shop_env.step(code("stock('x' * 2_000_000)"))
    assert info["exec_error"] == "TypeError" and "at most 1,000,000" in obs


def test_every_tool_call_is_recorded_by_the_parent_in_order(shop_env):
    from draco_gym.types import TOOL_CALLS

    shop_env.reset(options={"task_id": "sum"})
    info = shop_env.step(code("# stock('comment') calls nothing\nstock('ball')\ntry:\n    stock(item='kite')\n"
                              "except LookupError:\n    pass\nsubmit(add(2, 3))"))[4]
    # with the arguments as the tool received them, by parameter name, defaults filled in
    # (positional or keyword alike): what the rule rubric checks a lookup's target by
    assert info[TOOL_CALLS] == [{"name": "stock", "ok": True, "arguments": {"item": "ball", "warehouse": "main"}},
                                {"name": "stock", "ok": False, "error": "OutOfStock",
                                 "arguments": {"item": "kite", "warehouse": "main"}},
                                {"name": "add", "ok": True, "arguments": {"a": 2, "b": 3}}, {"name": "submit", "ok": True}]
    # arguments that do not bind are not recorded (the call raised TypeError); text is cut,
    # what is not plain text or a number is recorded as its repr
    info = shop_env.step(code("try:\n    add(1)\nexcept TypeError:\n    pass\nstock('x' * 500)\n"
                              "add([1], float('inf'))"))[4]
    assert info[TOOL_CALLS][0] == {"name": "add", "ok": False, "error": "TypeError"}
    assert info[TOOL_CALLS][1]["arguments"] == {"item": "x" * 200, "warehouse": "main"}
    assert info[TOOL_CALLS][2]["arguments"] == {"a": "[1]", "b": "inf"}
    assert shop_env.step(code("print('no tools')"))[4][TOOL_CALLS] == []
    _, _, terminated, _, info = shop_env.step("Done.")
    assert terminated and info["metrics"]["success"] is True
    assert [s.info.get(TOOL_CALLS) for s in info["trajectory"].steps][2:] == [[], None]


def test_tool_state_is_fresh_per_interpreter_and_replayed_after_a_restart(shop_env):
    shop_env.reset(options={"task_id": "sum"})
    assert "'count': 1" in shop_env.step(code("print(stock('a'))"))[0]
    assert "'count': 2" in shop_env.step(code("print(stock('b'))"))[0]
    os.killpg(shop_env._interpreter._proc.pid, signal.SIGKILL)
    shop_env.step(code("print(1)"))  # lost; the restart replays the two calls in a fresh tools' process
    assert "'count': 3" in shop_env.step(code("print(stock('c'))"))[0]
    shop_env.reset(options={"task_id": "sum"})
    assert "'count': 1" in shop_env.step(code("print(stock('a'))"))[0]


def test_environments_of_one_process_share_one_tools_template_and_no_state():
    """Every environment serving the same tools forks its tools' copies from one template
    per process (one template each held ~25 MiB apiece); a copy starts from the pristine
    template, so what one environment's tools did is not seen by another's, and the template
    ends with the last environment."""
    import psutil

    from draco_gym.envs import python_tools

    envs = [PythonToolsEnv(tools=[stock, opaque, read_catalogue, add], tasks=TASKS, step_timeout_s=5.0)
            for _ in range(3)]
    try:
        for env in envs:
            env.reset(options={"task_id": "sum"})
        assert "'count': 1" in envs[0].step(code("print(stock('a'))"))[0]
        assert "'count': 2" in envs[0].step(code("print(stock('b'))"))[0]
        assert "'count': 1" in envs[1].step(code("print(stock('a'))"))[0]
        templates = {psutil.Process(env._interpreter._tool_host._pid).ppid() for env in envs}
        assert len(templates) == 1, "one template per environment"
        (template,) = templates
        envs[0].close()
        assert psutil.pid_exists(template)  # still serving the others
        assert "'count': 1" in envs[2].step(code("print(stock('c'))"))[0]
    finally:
        for env in envs:
            env.close()
    assert not psutil.pid_exists(template) or psutil.Process(template).status() == psutil.STATUS_ZOMBIE
    assert not python_tools._TEMPLATES


def test_a_lost_blocks_submission_is_not_kept_and_its_calls_are_recorded():
    from draco_gym.types import TOOL_CALLS

    e = PythonToolsEnv(tools=[add], tasks=TASKS, step_timeout_s=1.0)
    try:
        e.reset(options={"task_id": "sum"})
        e.step(code("submit(4)"))
        obs, _, _, _, info = e.step(code("submit(add(2, 3))\nwhile True:\n    pass"))
        assert info["exec_error"] == "TimeoutError" and info[TOOL_CALLS] == [
            {"name": "add", "ok": True, "arguments": {"a": 2, "b": 3}}, {"name": "submit", "ok": True}]
        _, _, _, _, info = e.step("Done.")
        assert info["metrics"]["answer"] == 4 and info["metrics"]["success"] is False  # the replayed submit(4)
    finally:
        e.close()


def test_tools_read_their_data_and_agent_code_reads_only_what_is_listed(tmp_path):
    catalogue = tmp_path / "catalogue.txt"
    catalogue.write_text("kites: 3")
    listed = tmp_path / "listed.txt"
    listed.write_text("for the agent")
    e = PythonToolsEnv(tools=[read_catalogue], tasks=TASKS, read_only_paths=[listed])
    try:
        e.reset(options={"task_id": "sum"})
        assert e.step(code(f"print(read_catalogue({str(catalogue)!r}))"))[0].strip() == "kites: 3"
        assert e.step(code(f"print(open({str(listed)!r}).read())"))[0].strip() == "for the agent"
        obs, _, _, _, info = e.step(code(f"print(open({str(catalogue)!r}).read())"))
        assert info["exec_error"] in ("PermissionError", "FileNotFoundError") and "kites" not in obs
    finally:
        e.close()


def test_a_stale_done_line_ends_the_episode_and_the_next_reset_works(env):
    """A done line for another block (written early by agent code, then the real one
    arriving during the next block) is caught; the episode ends as env_error."""
    from draco_gym.types import Termination

    env.reset(options={"task_id": "sum"})
    forge = ("import json, os, stat\nfor fd in range(3, 64):\n    try:\n        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
             "            os.write(fd, (json.dumps({'done': True, 'block': 1, 'output': 'early', 'error': None}) + '\\n').encode())\n"
             "    except OSError:\n        pass\nsubmit(5)")
    obs, _, terminated, _, info = env.step(code(forge))
    obs, _, terminated, _, info = env.step(code("print(2)")) if not terminated else (obs, 0, terminated, 0, info)
    if "the interpreter died" in obs:
        # the forged line can also land on the interpreter's own input, which it then reads as
        # the end of its channel and exits: restarted and replayed, the forgery counted for nothing
        assert not terminated and not info.get("metrics", {}).get("success"), obs
    else:
        assert terminated and info["trajectory"].termination == Termination.ENV_ERROR, obs
        assert "ProtocolError" == info["exec_error"]
    env.reset(options={"task_id": "sum"})
    assert env.step(code("print(add(1, 1))"))[0].strip() == "2"


@pytest.mark.parametrize("mode", ["bwrap", "guard"])
def test_agent_code_imports_the_standard_library_and_the_environments_packages(mode):
    """The kernel layers leave what imports need: extension modules and the system
    libraries they load (sqlite3, ssl, zlib), and the virtual environment's packages."""
    import warnings

    from draco_gym.envs import os_sandbox

    if mode == "bwrap" and os_sandbox.bwrap_problem() is not None:
        pytest.skip(os_sandbox.bwrap_problem())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", os_sandbox.SandboxWarning)
        e = PythonToolsEnv(tools=[add], tasks=TASKS, sandbox=mode)
    try:
        e.reset(options={"task_id": "sum"})
        obs, _, _, _, info = e.step(code("import sqlite3, ssl, zlib, decimal, numpy\n"
                                         "print(sqlite3.connect(':memory:').execute('select 6 * 7').fetchone()[0], "
                                         "int(numpy.arange(4).sum()))"))
        assert info["exec_error"] is None and obs.strip() == "42 6", obs
    finally:
        e.close()


@pytest.mark.parametrize("line", ["not json", '{"call": "add", "args": "__import__(\'os\')"}',
                                  '{"call": "submit", "json": "[[5], {}]"}', '{"call": "nope", "json": "[[], {}]"}',
                                  "FLOOD"], ids=["not-json", "not-literal", "submit-as-json", "unknown-tool", "flood"])
def test_a_line_no_stub_writes_on_the_tools_channel_ends_the_episode(env, line):
    """The tools' process refuses what no stub sends (not JSON, an argument that is not a
    literal, a submission in another form, an unknown tool, a flood) and reports it: the
    episode ends as env_error, nothing is submitted, and the next reset works."""
    from draco_gym.types import Termination

    env.reset(options={"task_id": "sum"})
    forge = (f"import json, os, sys\nfd = json.loads(sys.argv[-1])['tool_fds'][0]\nline = {line!r}\n"
             "if line == 'FLOOD':\n    for _ in range(200):\n        os.write(fd, b'x' * (1 << 16))\n"
             "os.write(fd, line.encode() + b'\\n')\nadd(2, 3)")
    obs, _, terminated, _, info = env.step(code(forge))
    assert terminated and info["trajectory"].termination == Termination.ENV_ERROR, obs
    assert info["exec_error"] == "ProtocolError" and info["metrics"]["submitted"] is False
    env.reset(options={"task_id": "sum"})
    assert env.step(code("print(add(1, 1))"))[0].strip() == "2"


def test_the_prompt_says_what_ends_the_episode_and_shows_evaluated_annotations(tmp_path, monkeypatch):
    """Under ``task_completed`` submit ends the episode, so the prompt asks for no closing
    message; a tool module under ``from __future__ import annotations`` shows ``int``, not
    ``'int'``."""
    import gymnasium as gym

    (tmp_path / "future_tools.py").write_text(
        "from __future__ import annotations\n\n"
        "def double(n: int) -> int:\n    \"\"\"Twice n.\"\"\"\n    return 2 * n\n\n"
        "def tasks():\n    return [{'id': 't1', 'instruction': 'Submit double(2).', 'answer': 4}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = {}
    for rule in ("no_code", "task_completed"):
        env = gym.make("draco_gym/PythonTools-v0", tools=["future_tools:double"], tasks="future_tools:tasks",
                       end_rule=rule, sandbox="guard", read_only_paths=[str(tmp_path)])
        try:
            prompts[rule], _ = env.reset(options={"task_id": "t1"})
        finally:
            env.close()
    assert "double(n: int) -> int" in prompts["no_code"] and "'int'" not in prompts["no_code"]
    assert "reply with a short message" in prompts["no_code"]
    assert "reply with a short message" not in prompts["task_completed"]
    assert "ends as soon as submit has been called" in prompts["task_completed"]
