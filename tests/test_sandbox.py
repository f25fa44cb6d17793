"""The OS sandbox around agent code, for both environments through gym.make, in both modes.

A canary secret sits in the parent's environment and a canary file in the parent's home
folder (a temporary HOME); a port listens on the host's 127.0.0.1. Agent code tries every
route to them it has (os.environ, posix.environ, open, pathlib, os.listdir, the parent's
/proc/<pid>/environ), to the port, and to writing outside its work folder: every attempt
gives an error or nothing, never the canary. ``"bwrap"`` is the real boundary, ``"guard"``
the fallback (audit hook and allowlisted environment); the boundary layer is also tested
alone, without the hook, so each layer is seen to hold by itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import uuid
import warnings

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from draco_gym.envs import os_sandbox
from draco_gym.envs.os_sandbox import SandboxUnavailable, SandboxWarning
from sandbox_marks import needs_bwrap

CANARY = "sk-canary-" + uuid.uuid4().hex[:12]
CANARY_NAME = "canary-" + uuid.uuid4().hex[:8] + ".txt"
MODES = ["bwrap", "guard"]


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Secrets where a trainer keeps them, a listening port, and places agent code must not write."""
    from draco_gym.envs.appworld.runtime import HOME_ENV, default_home

    monkeypatch.setenv(HOME_ENV, str(default_home()))  # the real runtime, whatever HOME says
    home = tmp_path / "home"
    home.mkdir()
    (home / CANARY_NAME).write_text(CANARY)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("DRACO_TEST_SECRET", CANARY)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    outside = tmp_path / "outside"
    outside.mkdir()
    yield {"home": str(home), "port": listener.getsockname()[1], "listener": listener,
           "targets": [str(outside / "pwned"), str(home / "pwned"), f"/tmp/draco-pwned-{uuid.uuid4().hex[:8]}"]}
    listener.close()


def probes(host: dict, os_name: str = "os") -> dict[str, str]:
    """Agent code for every route; ``os_name`` is how the code reaches the os module (AppWorld's
    own guard blocks ``import os`` spelled plainly in some forms)."""
    home, port = host["home"], host["port"]
    get_os = f"o = __import__({os_name!r})"
    return {
        "os.environ": f"{get_os}\nprint(dict(o.environ))",
        "posix.environ": "p = __import__('po' + 'six')\nprint(p.environ)",
        "open": f"print(__import__('io').open({home + '/' + CANARY_NAME!r}).read())",
        "pathlib": f"print(__import__('pathlib').Path({home!r}, {CANARY_NAME!r}).read_text())",
        "os.listdir": f"{get_os}\nprint(o.listdir({home!r}))",
        "os.open": f"{get_os}\nfd = o.open({home + '/' + CANARY_NAME!r}, o.O_RDONLY)\nprint(o.read(fd, 100))",
        "parent environ": f"{get_os}\nprint(__import__('io').open('/proc/%d/environ' % o.getppid(), 'rb').read())",
        "host parent environ": f"print(__import__('io').open('/proc/{os.getpid()}/environ', 'rb').read())",
        "connect": f"s = __import__('socket').create_connection(('127.0.0.1', {port}), timeout=3)\nprint('CONNECTED')",
        **{f"write {i}": f"__import__('io').open({path!r}, 'w').write('x')\nprint('WROTE')"
           for i, path in enumerate(host["targets"])},
    }


def assert_nothing_leaked(observations: dict[str, str], host: dict) -> None:
    for route, observation in observations.items():
        assert CANARY not in observation, f"{route} leaked the secret: {observation[-400:]}"
        if "listdir" in route:  # elsewhere the file's name is in the agent's own code, echoed in errors
            assert CANARY_NAME not in observation, f"{route} listed the home folder: {observation[-400:]}"
        assert "CONNECTED" not in observation and "WROTE" not in observation, f"{route}: {observation[-400:]}"
    with pytest.raises(BlockingIOError):
        host["listener"].accept()  # no connection ever reached the port
    for path in host["targets"]:
        assert not os.path.exists(path), f"agent code wrote {path}"


def make_python_tools(mode: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        return gym.make("draco_gym/PythonTools-v0", sandbox=mode, step_timeout_s=10.0).unwrapped


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "guard"])
def test_python_tools_agent_code_sees_no_secret_no_home_no_network(mode, host):
    env = make_python_tools(mode)
    try:
        assert env.sandbox == mode
        env.reset(seed=0)
        observations = {route: env.step(fence(code))[0] for route, code in probes(host).items()}
        # what the environment does show: only the allowlist
        shown = env.step(fence("import os\nprint(sorted(os.environ))"))[0]
    finally:
        env.close()
    assert_nothing_leaked(observations, host)
    assert "OPENAI_API_KEY" not in shown and "DRACO_TEST_SECRET" not in shown and "PATH" in shown


@pytest.fixture(scope="module")
def appworld_source():
    from draco_gym.envs.appworld import AppWorldRuntime, ensure_offline_suite

    return ensure_offline_suite(AppWorldRuntime(), progress=None)


def make_appworld(source):
    """A private pool (AppWorld runs only under bwrap): started now, it sees this test's HOME
    as the home to protect."""
    from draco_gym.envs.appworld import AppWorldRuntime, ServerPool

    pool = ServerPool(AppWorldRuntime(), source.data_dir, max_servers=1, sandbox="bwrap")
    env = gym.make("draco_gym/AppWorld-v0", data_root=source.data_dir, pool=pool, step_timeout_s=10,
                   show_progress=False).unwrapped
    return env, pool


@needs_bwrap
def test_appworld_agent_code_sees_no_secret_no_home_no_network(host, appworld_source):
    env, pool = make_appworld(appworld_source)
    try:
        assert pool.sandbox == "bwrap"
        env.reset(options={"task_id": "photo-count_1"})
        observations = {route: env.step(fence(code))[0] for route, code in probes(host, "o" + "s").items()}
        # nor any task's files: the ground truth would let a policy game the engine's verdict
        answer = appworld_source.data_dir / "tasks" / "photo-count_1" / "ground_truth" / "answer.json"
        peek = env.step(fence(f"print(__import__('pathlib').Path({str(answer)!r}).read_text())"))[0]
        assert "PermissionError" in peek and "not allowed" in peek, peek
        # a reference solution still passes its task, in the same sandbox
        task_id = "note-of-contacts_2"
        env.reset(options={"task_id": task_id})
        for block in appworld_source.ground_truth_file(task_id, "reference_solution.json"):
            _, _, terminated, _, info = env.step(fence(block))
            assert not terminated and info["exec_error"] is None, info
        _, _, terminated, _, info = env.step("Done.")
        assert terminated and info["metrics"]["success"], info["metrics"]
    finally:
        env.close()
        pool.shutdown()
    assert_nothing_leaked(observations, host)


def solution(instruction: str) -> str:
    """Agent code that solves a shop task with the tools alone (what a good policy writes)."""
    pages = "def every(fetch, **kw):\n    out, page = [], 1\n    while True:\n" \
            "        r = fetch(page=page, **kw)\n        out += r['items']\n        if page >= r['pages']:\n" \
            "            return out\n        page += 1\n"
    total = "def total(order):\n    return round(sum(get_product(i['product_id'])['price'] * i['quantity'] " \
            "for i in order['items']), 2)\n"
    if m := re.search(r"cost of order (\w+)", instruction):
        return total + f"submit(total(get_order({m.group(1)!r})))"
    if m := re.search(r"How many orders has (.+) placed", instruction):
        return pages + f"c = find_customer({m.group(1)!r})\nsubmit(len(every(list_orders, customer_id=c['id'])))"
    if m := re.search(r"name of the (cheapest|most expensive) product in the (\w+) category", instruction):
        pick = "min" if m.group(1) == "cheapest" else "max"
        return pages + f"p = {pick}(every(list_products, category={m.group(2)!r}), key=lambda p: p['price'])\n" \
                       "submit(p['name'])"
    m = re.search(r"How much has (.+) spent", instruction)
    return pages + total + f"c = find_customer({m.group(1)!r})\n" \
                           "submit(round(sum(total(o) for o in every(list_orders, customer_id=c['id'])), 2))"


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "guard"])
def test_python_tools_tasks_still_solve(mode):
    env = make_python_tools(mode)
    try:
        for task_id in ("order-total-1", "order-count-1", "cheapest-books", "priciest-books", "customer-spend-1"):
            env.reset(options={"task_id": task_id})
            _, _, _, _, info = env.step(fence(solution(env.task.instruction)))
            assert info["exec_error"] is None, info
            _, _, terminated, _, info = env.step("Submitted.")
            assert terminated and info["metrics"]["success"], (task_id, info["metrics"])
    finally:
        env.close()


# -- the boundary alone: bubblewrap without the audit hook -----------------------------------

PLAIN_PROBE = """
import json, os, socket, sys
home, port, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
seen = {"environ": dict(os.environ)}
def attempt(name, action):
    try:
        seen[name] = repr(action())
    except Exception as exc:
        seen[name] = "refused: " + type(exc).__name__
attempt("listdir", lambda: os.listdir(home))
attempt("read", lambda: open(os.path.join(home, os.listdir(home)[0])).read())
attempt("proc 1", lambda: open("/proc/1/environ", "rb").read())
attempt("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=3) and "CONNECTED")
for path in targets + ["/new-top-level-file", "/usr/pwned"]:
    attempt("write " + path, lambda: open(path, "w").write("WROTE"))
print(json.dumps(seen))
"""


@needs_bwrap
def test_bubblewrap_alone_holds_without_the_audit_hook(host, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = os_sandbox.allowlisted_env(str(workdir))
    argv = [sys.executable, "-I", "-c", PLAIN_PROBE, host["home"], str(host["port"]), *host["targets"]]
    command = os_sandbox.bwrap_command(argv, workdir=str(workdir), env=env,
                                       read_only=os_sandbox.interpreter_paths(sys.executable))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = result.stdout
    assert_nothing_leaked({"plain python listdir": seen}, host)
    assert not os.path.exists("/new-top-level-file")
    # the one writable place works
    inside = subprocess.run(os_sandbox.bwrap_command(
        [sys.executable, "-I", "-c", "open('ok', 'w').write('fine')"], workdir=str(workdir), env=env,
        read_only=os_sandbox.interpreter_paths(sys.executable)), env=env, capture_output=True, text=True, timeout=60)
    assert inside.returncode == 0 and (workdir / "ok").read_text() == "fine", inside.stderr


# -- choosing the sandbox --------------------------------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch):
    """This machine as one without bubblewrap."""
    monkeypatch.setattr(os_sandbox.shutil, "which", lambda name: None)
    os_sandbox.bwrap_problem.cache_clear()
    monkeypatch.setattr(os_sandbox, "_warned", set())
    yield
    os_sandbox.bwrap_problem.cache_clear()


def test_bwrap_mode_fails_at_construction_with_the_fix_named(no_bwrap, appworld_source):
    with pytest.raises(SandboxUnavailable, match=r"not on PATH.*apt-get install bubblewrap.*sandbox='guard'"):
        gym.make("draco_gym/PythonTools-v0", sandbox="bwrap")
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        gym.make("draco_gym/AppWorld-v0", data_root=appworld_source.data_dir, sandbox="bwrap", show_progress=False)


def test_auto_falls_back_to_the_guard_and_warns_once_naming_what_is_exposed(no_bwrap):
    expected = r"WITHOUT an OS sandbox.*seccomp.*Landlock.*Not isolated: the work folder's total size.*apt-get"
    with pytest.warns(SandboxWarning, match=expected):
        first = gym.make("draco_gym/PythonTools-v0").unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)
        second = gym.make("draco_gym/PythonTools-v0").unwrapped  # no second warning
    try:
        assert first.sandbox == second.sandbox == "guard"
        first.reset(seed=0)
        assert first.step(fence("print(1 + 1)"))[0].strip() == "2"
    finally:
        first.close()
        second.close()


def test_unknown_sandbox_is_a_clear_error(appworld_source):
    with pytest.raises(ValueError, match=r"sandbox must be one of \('bwrap', 'guard', 'auto'\), got 'docker'"):
        gym.make("draco_gym/PythonTools-v0", sandbox="docker")
    with pytest.raises(ValueError, match="sandbox must be one of"):
        gym.make("draco_gym/AppWorld-v0", data_root=appworld_source.data_dir, sandbox="none", show_progress=False)


def test_a_message_over_the_cap_is_an_error_observation_naming_the_cap():
    from draco_gym.codeblock import MAX_MESSAGE_CHARS

    env = make_python_tools("guard")
    try:
        env.reset(seed=0)
        message = fence("print('ran')") + "\n" + "la " * 400_000
        observation, _, terminated, _, info = env.step(message)
        assert not terminated and "ran" not in observation and info["parse"]["error"]
        assert f"at most {MAX_MESSAGE_CHARS:,}" in observation
    finally:
        env.close()


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "guard"])
def test_a_sandbox_started_from_a_thread_outlives_the_thread(mode):
    """--die-with-parent follows the forking thread; envs are often built in worker threads."""
    import threading
    import time

    env = make_python_tools(mode)
    try:
        worker = threading.Thread(target=lambda: env.reset(seed=0))
        worker.start()
        worker.join()
        started = env._interpreter._proc
        time.sleep(0.5)
        assert started.poll() is None, "the interpreter died with the thread that started it"
        observation, _, _, _, info = env.step(fence("print(6 * 7)"))
        assert observation.strip() == "42" and info["exec_error"] is None
        # However late a death after the thread's end came (a loaded machine), the step found
        # the interpreter gone and started another: the same one must have answered.
        assert env._interpreter._proc is started and started.poll() is None
    finally:
        env.close()


@needs_bwrap
def test_the_sandbox_dies_with_its_owner(tmp_path):
    """No orphan: the owner killed with SIGKILL takes its sandboxed interpreter with it."""
    import signal
    import textwrap
    import time

    pid_file = tmp_path / "pids"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from draco_gym.envs.python_tools import PythonToolsEnv
        env = PythonToolsEnv(sandbox="bwrap")
        env.reset(seed=0)
        open({str(pid_file)!r}, "w").write(str(env._interpreter._proc.pid))
        time.sleep(600)
    """)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert owner.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        sandbox_pid = int(pid_file.read_text())
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(sandbox_pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(sandbox_pid, signal.SIGKILL)
        pytest.fail("the sandboxed interpreter outlived its owner")
    finally:
        if owner.poll() is None:
            owner.kill()


# -- each inner layer alone (envs/sandbox_guard.py), in a plain process ----------------------

LAYER_PROBE = """
import _posixsubprocess, ctypes, json, os, signal, sqlite3, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
guard = __import__("importlib.util").util
spec = guard.spec_from_file_location("g", sys.argv[1]); g = guard.module_from_spec(spec); spec.loader.exec_module(g)
layer, work, home, outside, victim = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
hidden = sys.argv[7]
os.chdir(work)
readable = [*sys.argv[8:], os.path.dirname(hidden)]
if layer == "seccomp":
    g.Seccomp(os.getpid(), dir_fd_paths=False).install(g._libc())
elif layer == "landlock":
    print("ABI", g.Landlock(g.readable_minus(readable, [hidden]), [work], g.DEVICES).install(g._libc()), file=sys.stderr)
elif layer == "hook":
    g.AuditGuard(work, g.PrivateReads([home, hidden], readable)).install()
seen = {}
def attempt(name, action):
    try:
        seen[name] = "DONE " + repr(action())[:80]
    except Exception as exc:
        seen[name] = "refused " + type(exc).__name__
def spawn():
    er, ew = os.pipe()
    return _posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (), None, None, -1, -1, -1, -1, -1, -1,
                                      er, ew, True, True, -1, None, None, None, -1, None, False)
def traced():
    if libc.ptrace(16, victim, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
    return "attached"
attempt("thread", lambda: (lambda t: (t.start(), t.join()))(threading.Thread(target=lambda: None)))
attempt("write inside", lambda: open("ok.txt", "w").write("fine"))
attempt("dir_fd environ", lambda: os.read(os.open("%d/environ" % os.getppid(), os.O_RDONLY, dir_fd=os.open("/proc", os.O_RDONLY)), 99))
attempt("dir_fd home", lambda: os.read(os.open(os.path.basename(home) + "/canary", os.O_RDONLY, dir_fd=os.open(os.path.dirname(home), os.O_RDONLY)), 99))
attempt("dir_fd write", lambda: os.open("pwned", os.O_WRONLY | os.O_CREAT, dir_fd=os.open(outside, os.O_RDONLY)))
attempt("hidden read", lambda: open(os.path.join(hidden, "answer.txt")).read())
attempt("fork_exec", spawn)
attempt("pidfd kill", lambda: signal.pidfd_send_signal(os.pidfd_open(victim), signal.SIGKILL))
attempt("kill", lambda: os.kill(victim, signal.SIGKILL))
attempt("ptrace", traced)
attempt("setsid", os.setsid)
attempt("mkfifo outside", lambda: os.mkfifo(os.path.join(outside, "fifo")))
attempt("memfd", lambda: os.memfd_create("m"))
attempt("sqlite outside", lambda: sqlite3.connect(os.path.join(outside, "x.db")).execute("create table t(x)"))
print(json.dumps(seen))
"""

LAYER_HOLDS = {  # what each layer refuses by itself (every other row of the probe must not leak either way)
    "seccomp": {"dir_fd environ", "dir_fd home", "dir_fd write", "fork_exec", "pidfd kill", "kill", "ptrace", "setsid",
                "mkfifo outside", "memfd"},
    "landlock": {"dir_fd environ", "dir_fd home", "dir_fd write", "hidden read", "ptrace", "kill", "mkfifo outside",
                 "sqlite outside", "pidfd kill"},
    "hook": {"hidden read", "sqlite outside"},
}


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="Linux x86_64 layers")
@pytest.mark.parametrize("layer", sorted(LAYER_HOLDS))
def test_each_inner_layer_holds_alone(layer, tmp_path):
    """Each layer refuses its share with the others off: seccomp the process, signal, ptrace
    and descriptor-relative routes; Landlock every path outside the listed ones and other
    processes; the audit hook what Python shows it. A thread and a write in the work folder
    still work."""
    from draco_gym.envs import sandbox_guard

    guard = sandbox_guard.load()
    libc = guard._libc()
    if layer == "landlock" and guard.Landlock.abi(libc) < 6:
        pytest.skip("this kernel's Landlock is older than ABI 6 (signal scoping)")
    work, home, outside, hidden = (tmp_path / n for n in ("work", "home", "outside", "code/hidden"))
    for folder in (work, home, outside, hidden):
        folder.mkdir(parents=True)
    (home / "canary").write_text(CANARY)
    (hidden / "answer.txt").write_text(CANARY)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        readable = [*os_sandbox.interpreter_paths(sys.executable), *os_sandbox.isolated_sys_path(sys.executable),
                    *os_sandbox.SYSTEM_DIRS, "/etc/ld.so.cache"]
        result = subprocess.run([sys.executable, "-I", "-c", LAYER_PROBE, str(os_sandbox.GUARD_MODULE), layer,
                                 str(work), str(home), str(outside), str(victim.pid), str(hidden), *readable],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.splitlines()[-1])
        assert victim.poll() is None or "kill" not in LAYER_HOLDS[layer], "the victim was killed"
    finally:
        victim.kill()
        victim.wait()
    assert seen["thread"].startswith("DONE") and seen["write inside"].startswith("DONE"), seen
    for name in LAYER_HOLDS[layer]:
        assert seen[name].startswith("refused"), (layer, name, seen[name])
    assert not (outside / "pwned").exists() or "dir_fd write" not in LAYER_HOLDS[layer]


@needs_bwrap
def test_bubblewrap_caps_the_work_folder_hides_paths_and_drops_capabilities(tmp_path):
    """The in-memory work folder has a size (ENOSPC past it, whatever RLIMIT_FSIZE allows);
    a hidden folder inside a bound one is empty and read-only, a hidden file cannot be opened, a
    bound file inside a hidden folder is back; /dev is read-only; no capability is left,
    even when the parent is root."""
    bound = tmp_path / "bound"
    (bound / "secret").mkdir(parents=True)
    (bound / "secret" / "answer.txt").write_text(CANARY)
    (bound / "secret" / "kept.txt").write_text("kept")
    (bound / "module.py").write_text(CANARY)
    workdir = str(tmp_path / "sandbox-work")
    probe = textwrap.dedent("""
        import os, sys
        bound = sys.argv[1]
        def attempt(action):
            try:
                return repr(action())
            except OSError as exc:
                return "refused " + os.strerror(exc.errno)
        def fill():
            n = 0
            with open("big", "wb") as f:
                for _ in range(64):
                    f.write(b"0" * (1 << 20)); f.flush(); n += 1
            return n
        print("fill:", attempt(fill))
        print("hidden dir:", attempt(lambda: os.listdir(bound + "/secret")))
        print("hidden write:", attempt(lambda: open(bound + "/secret/new", "w")))
        print("hidden file:", attempt(lambda: open(bound + "/module.py").read()))
        print("dev:", attempt(lambda: open("/dev/shm/x", "w")))
        print([line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0])
    """)
    env = os_sandbox.allowlisted_env(workdir)
    argv = [sys.executable, "-I", "-c", probe, str(bound)]
    command = os_sandbox.bwrap_command(argv, workdir=workdir, env=env, private_workdir=True, workdir_mb=8,
                                       read_only=[*os_sandbox.interpreter_paths(sys.executable), str(bound),
                                                  str(bound / "secret" / "kept.txt")],
                                       hidden=[str(bound / "secret"), str(bound / "module.py")])
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines()[:-1])
    assert lines["fill"] == "refused No space left on device", result.stdout
    assert lines["hidden dir"] == "['kept.txt']" and lines["hidden write"].startswith("refused")
    assert lines["hidden file"] == "refused Permission denied" and lines["dev"] == "refused Read-only file system"
    assert result.stdout.splitlines()[-1] == "0000000000000000"
    assert not os.path.exists(workdir)  # the folder was the sandbox's, not the host's


def test_a_channel_stops_reading_a_flood_at_its_line_cap():
    """A line without a newline is refused once it passes ``max_line``, having read little
    more than that: the writer is left blocked on a full pipe, not drained into memory."""
    import threading
    import time

    read_fd, write_fd = os.pipe()
    written = []

    def flood():
        chunk = b"x" * (1 << 16)
        try:
            for _ in range(1600):  # 100 MiB
                written.append(os.write(write_fd, chunk))
        except OSError:
            pass

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    channel = os_sandbox.JsonLines(open(os.devnull, "wb"), read_fd, max_line=1 << 20)
    with pytest.raises(os_sandbox.ProtocolError, match="longer than 1,048,576 bytes"):
        channel.receive(time.monotonic() + 30)
    time.sleep(0.2)
    assert sum(written) < 4 << 20, f"{sum(written):,} bytes were drained from the pipe"
    os.close(read_fd)
    writer.join(5)
    os.close(write_fd)
    for line, error in ((b"not json\n", "not JSON"), (b"[1, 2]\n", "not an object"), (b"[" * 100_000 + b"\n", "not JSON")):
        r, w = os.pipe()
        os.write(w, line) if len(line) < 60_000 else threading.Thread(target=os.write, args=(w, line)).start()
        with pytest.raises(os_sandbox.ProtocolError, match=error):
            os_sandbox.JsonLines(open(os.devnull, "wb"), r).receive(time.monotonic() + 10)
        os.close(r)
        os.close(w)
