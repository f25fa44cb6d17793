"""AppWorld-v0 against the engine alone: step latency, server start-up, memory, throughput.

1. Step latency. The same code blocks (the offline suite's reference solutions) run three ways:
   - engine (raw): ``AppWorld.execute(code)`` inside the engine's own process (the isolated
     runtime), no client, no transport, no hook: the floor;
   - engine+hook: the same with the server's audit hook installed, to show what that layer
     costs apart from the transport;
   - env: ``AppWorldEnv(sandbox="bwrap").step(message)`` (AppWorld's only mode): find the
     block, send it to the environment server in bubblewrap over its socket, the same
     ``execute`` there, record the step.
   All run every episode from a fresh task load; their episodes alternate so machine load
   hits them alike. Each step keeps its minimum over
   ``--repeats`` episodes (as ``timeit`` advises on a shared machine); the figures are sums of
   those minima. Goal: env/engine <= 1.10.
   Each episode is also timed whole (task load, the steps, the evaluation), the engine's
   as ``AppWorld(...)``, its executions and ``evaluate()`` in one process, the env's as
   ``reset``, the steps and the closing message (which evaluates in the pool's evaluator).
2. Server start-up: processes start until the server is ready, the first task load, and a later task load on the same (warm)
   server, which is what every further episode pays (a fresh shell forked included).
3. Memory per server: resident set size of a server's process trees (world, shell fork
   server and the episode's shell) after an episode, and of the pool's evaluator.
4. Throughput: episodes per second with 1 server vs 2 servers used by 2 threads (auto mode).

    python bench/appworld_env.py [--tasks 6] [--repeats 7] [--starts 5] [--episodes 12] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from draco_gym.envs.appworld import AppWorldEnv, AppWorldRuntime, EnvServer, ServerPool, ensure_offline_suite
from draco_gym.envs.appworld.runtime import print_progress
from draco_gym.envs.appworld.server import ENGINE_SCRIPT, Evaluator

GOAL = 1.10

ENGINE_LOOP = textwrap.dedent("""
    import json, sys, time
    from appworld import AppWorld
    # a world freezes the clock (freezegun patches time.perf_counter too): use the raw clock
    clock = lambda: time.clock_gettime(time.CLOCK_MONOTONIC)
    audit_guard = None
    if len(sys.argv) > 1:  # the server's audit-hook guard, alone
        sys.path.insert(0, sys.argv[1])
        from engine_server import AuditGuard
        audit_guard = AuditGuard()
    for line in sys.stdin:
        job = json.loads(line)
        began = clock()
        world = AppWorld(task_id=job["task_id"], experiment_name="bench_engine", timeout_seconds=30)
        if audit_guard is not None:
            world.shell.run_cell = audit_guard.guard(world.shell.run_cell)
        times = []
        for code in job["blocks"]:
            started = clock()
            world.execute(code)
            times.append(clock() - started)
        world.evaluate()
        world.close()
        print(json.dumps({"steps": times, "episode": clock() - began}), flush=True)
""")


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


class EngineInProcess:
    """A long-lived runtime process that runs episodes with ``AppWorld`` directly."""

    def __init__(self, runtime: AppWorldRuntime, root: Path, sandbox: bool = False) -> None:
        extra = [str(ENGINE_SCRIPT.parent)] if sandbox else []
        self.process = subprocess.Popen(
            [str(runtime.python), "-c", ENGINE_LOOP, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=runtime.subprocess_env(root), cwd=str(root),
        )

    def episode(self, task_id: str, blocks: list[str]) -> tuple[list[float], float]:
        """Each step's time and the whole episode's (world built, steps, evaluation)."""
        self.process.stdin.write(json.dumps({"task_id": task_id, "blocks": blocks}) + "\n")
        self.process.stdin.flush()
        result = json.loads(self.process.stdout.readline())
        return result["steps"], result["episode"]

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:  # the engine's interpreter can linger at exit
            self.process.kill()
            self.process.wait(10)


def env_episode(env: AppWorldEnv, task_id: str, blocks: list[str]) -> tuple[list[float], float]:
    """Each step's time and the whole episode's (reset, steps, the closing message's evaluation)."""
    began = time.perf_counter()
    env.reset(options={"task_id": task_id})
    times = []
    for code in blocks:
        message = fence(code)
        started = time.perf_counter()
        env.step(message)
        times.append(time.perf_counter() - started)
    _, _, _, _, info = env.step("Done.")  # ends the episode and evaluates it
    assert info["metrics"].get("success"), info["metrics"]
    return times, time.perf_counter() - began


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (under bubblewrap the engine is a child)."""
    total = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1]) / 1024
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        total += rss_mb(int(child))
    return total


def bench_latency(source, runtime, tasks: list[str], repeats: int, scratch: Path) -> dict:
    scratch.mkdir(parents=True, exist_ok=True)
    link = scratch / "data"
    if not link.exists():
        link.symlink_to(source.data_dir)
    engine = EngineInProcess(runtime, scratch)
    sandboxed = EngineInProcess(runtime, scratch, sandbox=True)
    pools = {"bwrap": ServerPool(runtime, source.data_dir, max_servers=1, sandbox="bwrap")}
    envs = {mode: AppWorldEnv("train", data_root=source.data_dir, pool=pool, show_progress=False)
            for mode, pool in pools.items()}
    best = {"engine": {}, "engine+sandbox": {}, "env": {}}
    episodes = {name: {} for name in best}
    try:
        for r in range(repeats):
            for task_id in tasks:
                blocks = source.ground_truth_file(task_id, "reference_solution.json")
                for name, run in (("engine", engine.episode), ("engine+sandbox", sandboxed.episode),
                                  ("env", lambda t, b: env_episode(envs["bwrap"], t, b))):
                    times, whole = run(task_id, blocks)
                    previous = best[name].get(task_id, [float("inf")] * len(times))
                    best[name][task_id] = [min(a, b) for a, b in zip(previous, times)]
                    episodes[name][task_id] = min(episodes[name].get(task_id, float("inf")), whole)
            print(f"  latency repeat {r + 1}/{repeats} done", flush=True)
    finally:
        engine.close()
        sandboxed.close()
        for env in envs.values():
            env.close()
        for pool in pools.values():
            pool.shutdown()
    # The step that calls complete_task also pays the env's completion check (one supervisor
    # API call, which the bare execute does not make): reported apart as well.
    completing = {t: ["complete_task" in b for b in source.ground_truth_file(t, "reference_solution.json")] for t in tasks}

    def total(name: str, which) -> float:
        return sum(x for t, v in best[name].items() for x, c in zip(v, completing[t]) if which(c))

    steps = sum(len(v) for v in best["env"].values())
    other = sum(not c for v in completing.values() for c in v)
    episode_s = {name: sum(v.values()) / len(v) for name, v in episodes.items()}
    return {
        "episode_s": episode_s,
        "steps": steps, "engine_ms_per_step": 1000 * total("engine", lambda c: True) / steps,
        "env_ms_per_step": 1000 * total("env", lambda c: True) / steps,
        "ratio": total("env", lambda c: True) / total("engine", lambda c: True),
        "other_steps": other, "ratio_other": total("env", lambda c: not c) / total("engine", lambda c: not c),
        "ratio_completing": total("env", bool) / total("engine", bool),
        "sandbox_ratio": total("engine+sandbox", lambda c: True) / total("engine", lambda c: True),
        "env_vs_sandboxed": total("env", lambda c: True) / total("engine+sandbox", lambda c: True),
    }


def bench_startup(source, runtime, modes: tuple[str, ...], starts: int) -> dict:
    """Per mode; the modes alternate, start by start, so machine load hits them alike."""
    runs = {mode: {"start_s": [], "load_s": [], "warm_s": [], "rss": [], "evaluator_rss": []} for mode in modes}
    for _ in range(starts):
        for mode in modes:
            run = runs[mode]
            server = EnvServer(runtime, source.data_dir, name="bench", sandbox=mode)
            evaluator = Evaluator(runtime, source.data_dir, mode)
            began = time.perf_counter()
            server.start()
            run["start_s"].append(time.perf_counter() - began)
            began = time.perf_counter()
            server.reset("note-of-contacts_1", 30)
            run["load_s"].append(time.perf_counter() - began)
            for code in source.ground_truth_file("note-of-contacts_1", "reference_solution.json"):
                server.execute(code, 60)
            assert evaluator.evaluate("note-of-contacts_1", server.save_state())["success"]
            run["rss"].append(rss_mb(server.world.process.pid) + rss_mb(server.forks.process.pid))
            run["evaluator_rss"].append(rss_mb(evaluator.process.process.pid))
            began = time.perf_counter()
            server.reset("note-of-contacts_2", 30)
            run["warm_s"].append(time.perf_counter() - began)
            server.stop()
            evaluator.stop()
    return {mode: {"start_s": min(r["start_s"]), "start_s_max": max(r["start_s"]), "first_load_s": min(r["load_s"]),
                   "warm_load_s": min(r["warm_s"]), "rss_mb": max(r["rss"]), "evaluator_rss_mb": max(r["evaluator_rss"]),
                   "starts": starts} for mode, r in runs.items()}


def bench_bare_start(runtime, runs: int = 20) -> dict:
    """The sandbox's own start cost without the engine import's noise: the runtime's bare
    interpreter (``-c pass``) started plainly and inside bubblewrap, alternately."""
    from draco_gym.envs import os_sandbox

    workdir = Path(tempfile.mkdtemp(prefix="draco-bench-"))
    env = os_sandbox.allowlisted_env(str(workdir))
    argv = [str(runtime.python), "-c", "pass"]
    commands = {"plain": argv, "bwrap": os_sandbox.bwrap_command(
        argv, workdir=str(workdir), env=env, read_only=os_sandbox.interpreter_paths(runtime.python))}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            began = time.perf_counter()
            subprocess.run(command, env=env, check=True)
            times[name].append(time.perf_counter() - began)
    shutil.rmtree(workdir, ignore_errors=True)
    return {name: min(v) for name, v in times.items()}


def bench_throughput(source, runtime, tasks: list[str], episodes: int, n_servers: int) -> float:
    pool = ServerPool(runtime, source.data_dir, max_servers=n_servers)
    envs = [AppWorldEnv("train", data_root=source.data_dir, pool=pool, show_progress=False) for _ in range(n_servers)]
    for env in envs:  # start-up is measured separately: warm every server first
        env.reset(options={"task_id": tasks[0]})
    queue = [tasks[i % len(tasks)] for i in range(episodes)]
    lock = threading.Lock()

    def worker(env):
        while True:
            with lock:
                if not queue:
                    return
                task_id = queue.pop()
            env_episode(env, task_id, source.ground_truth_file(task_id, "reference_solution.json"))

    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(env,)) for env in envs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    for env in envs:
        env.close()
    pool.shutdown()
    return episodes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=6, help="train tasks for the latency and throughput runs")
    parser.add_argument("--repeats", type=int, default=7, help="episodes per task and path (minimum kept)")
    parser.add_argument("--episodes", type=int, default=12, help="episodes per throughput run")
    parser.add_argument("--starts", type=int, default=5, help="server starts per sandbox mode (minimum kept)")
    parser.add_argument("--skip-throughput", action="store_true", help="only latency and start-up")
    args = parser.parse_args()

    runtime = AppWorldRuntime()
    source = ensure_offline_suite(runtime, progress=print_progress)
    train = source.task_ids("train")
    tasks = [train[i] for i in range(0, len(train), 3)][: args.tasks]  # one per scenario
    print(f"tasks: {tasks}")

    latency = bench_latency(source, runtime, tasks, args.repeats, runtime.home / "bench-scratch")
    print(f"step latency over {latency['steps']} steps: engine {latency['engine_ms_per_step']:.1f} ms/step, "
          f"env (bwrap) {latency['env_ms_per_step']:.1f} ms/step, env/engine {latency['ratio']:.3f} "
          f"(goal <= {GOAL}: {'met' if latency['ratio'] <= GOAL else 'NOT met'}); "
          f"{latency['other_steps']} steps without complete_task {latency['ratio_other']:.3f}, "
          f"the {latency['steps'] - latency['other_steps']} completing steps {latency['ratio_completing']:.3f}")
    print(f"  of which the audit hook alone (engine+hook / engine): {latency['sandbox_ratio']:.3f}; "
          f"env / engine+hook (transport, client, completion check): {latency['env_vs_sandboxed']:.3f}")
    episode = latency["episode_s"]
    print(f"episode (task load, steps, evaluation), mean over tasks of the minimum: engine {episode['engine']:.2f} s, "
          f"env (bwrap) {episode['env']:.2f} s; env/engine {episode['env'] / episode['engine']:.2f}")
    startups = bench_startup(source, runtime, ("bwrap",), args.starts)
    for mode, startup in startups.items():
        print(f"server start ({mode}) until ready: {startup['start_s']:.2f} s (max {startup['start_s_max']:.2f} s of {args.starts}); "
              f"first task load: {startup['first_load_s']:.2f} s, next (warm server): {startup['warm_load_s']:.2f} s; "
              f"RSS per server after an episode: {startup['rss_mb']:.0f} MB, the pool's evaluator "
              f"{startup['evaluator_rss_mb']:.0f} MB")
    bare = bench_bare_start(runtime)
    print(f"bare interpreter start (min of 20): plain {1000 * bare['plain']:.0f} ms, in bubblewrap "
          f"{1000 * bare['bwrap']:.0f} ms: the sandbox's own cost {1000 * (bare['bwrap'] - bare['plain']):+.0f} ms")
    if not args.skip_throughput:
        one = bench_throughput(source, runtime, tasks, args.episodes, 1)
        two = bench_throughput(source, runtime, tasks, args.episodes, 2)
        print(f"throughput: 1 server {one:.3f} episodes/s, 2 servers {two:.3f} episodes/s, speed-up {two / one:.2f}x")


if __name__ == "__main__":
    main()
