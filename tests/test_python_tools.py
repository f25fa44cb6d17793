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
    assert time.monotonic() - start < 5
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
