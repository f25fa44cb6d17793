"""PythonTools-v0: what the OS sandbox costs per step and per interpreter start.

1. Step latency. The same code blocks (tool calls on the built-in shop, plus one pure-Python
   block) run three ways:
   - raw: ``exec`` of the block with the tools in the benchmark's own process: no process,
     no transport, no hook (the floor);
   - guard: ``PythonToolsEnv(sandbox="guard").step``: the worker process behind its audit
     hook, over pipes;
   - bwrap: the same worker inside bubblewrap (``sandbox="bwrap"``).
   Episodes alternate between the ways so machine load hits them alike; each episode runs
   the blocks ``--rounds`` times; each block keeps its minimum over all its runs (as
   ``timeit`` advises on a shared machine); the figures are sums of those minima.
2. Interpreter start: ``reset`` (a fresh worker process that imports the tools), per mode.

Goals: the OS sandbox adds <= 5% per step (bwrap / guard <= 1.05) and <= 0.5 s per start.

    python bench/python_tools_env.py [--repeats 15] [--rounds 20] [--starts 7]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from draco_gym.envs import shop
from draco_gym.envs.python_tools import PythonToolsEnv

STEP_GOAL = 1.05
START_GOAL_S = 0.5

BLOCKS = [
    "print(list_products(category='books'))",
    "p = get_product(list_products(category='toys')['items'][0]['id'])\nprint(p['name'], p['price'])",
    "c = find_customer('Ada Park')\norders = list_orders(c['id'])\nprint(len(orders['items']))",
    "total = sum(get_product(i['product_id'])['price'] * i['quantity'] for o in orders['items'] for i in o['items'])\n"
    "print(round(total, 2))",
    "squares = [n * n for n in range(20000)]\nprint(sum(squares))",
    "import json\nprint(json.dumps({'items': list_products()['items']})[:200])",
]


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def raw_episode(rounds: int) -> list[float]:
    namespace = {tool.__name__: tool for tool in shop.TOOLS}
    times = [float("inf")] * len(BLOCKS)
    for _ in range(rounds):
        for i, code in enumerate(BLOCKS):
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, "<step>", "exec"), namespace)  # noqa: S102 - our own blocks
            times[i] = min(times[i], time.perf_counter() - started)
    return times


def env_episode(env: PythonToolsEnv, rounds: int) -> list[float]:
    env.reset(options={"task_id": "order-total-1"})
    times = [float("inf")] * len(BLOCKS)
    for _ in range(rounds):
        for i, code in enumerate(BLOCKS):
            message = fence(code)
            started = time.perf_counter()
            _, _, _, _, info = env.step(message)
            times[i] = min(times[i], time.perf_counter() - started)
            assert info["exec_error"] is None, info
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="episodes per way (minimum per step kept)")
    parser.add_argument("--rounds", type=int, default=20, help="runs of every block per episode")
    parser.add_argument("--starts", type=int, default=7, help="interpreter starts per mode (minimum kept)")
    args = parser.parse_args()

    envs = {mode: PythonToolsEnv(sandbox=mode, max_turns=len(BLOCKS) * args.rounds + 1) for mode in ("guard", "bwrap")}
    best: dict[str, list[float]] = {}
    starts: dict[str, list[float]] = {mode: [] for mode in envs}
    try:
        for r in range(args.repeats):
            for name, run in (("raw", lambda: raw_episode(args.rounds)),
                              ("guard", lambda: env_episode(envs["guard"], args.rounds)),
                              ("bwrap", lambda: env_episode(envs["bwrap"], args.rounds))):
                times = run()
                best[name] = [min(a, b) for a, b in zip(best.get(name, [float("inf")] * len(times)), times)]
        for _ in range(args.starts):
            for mode, env in envs.items():
                started = time.perf_counter()
                env.reset(options={"task_id": "order-total-1"})
                starts[mode].append(time.perf_counter() - started)
    finally:
        for env in envs.values():
            env.close()

    ms = {name: 1000 * sum(v) / len(v) for name, v in best.items()}
    step_ratio = sum(best["bwrap"]) / sum(best["guard"])
    start = {mode: min(v) for mode, v in starts.items()}
    start_cost = start["bwrap"] - start["guard"]
    print(f"step latency over {len(BLOCKS)} blocks (min of {args.repeats * args.rounds} runs each): raw {ms['raw']:.2f} ms/step, "
          f"guard {ms['guard']:.2f} ms/step, bwrap {ms['bwrap']:.2f} ms/step")
    print(f"  guard/raw {sum(best['guard']) / sum(best['raw']):.1f}x (process, pipes, hook), "
          f"bwrap/raw {sum(best['bwrap']) / sum(best['raw']):.1f}x")
    print(f"interpreter start (reset, min of {args.starts}): guard {start['guard']:.3f} s, bwrap {start['bwrap']:.3f} s")
    print(f"OS sandbox (bwrap) vs guard alone: step latency ratio {step_ratio:.3f} "
          f"(goal <= {STEP_GOAL}: {'met' if step_ratio <= STEP_GOAL else 'NOT met'}), start {start_cost:+.3f} s "
          f"(goal <= {START_GOAL_S} s: {'met' if start_cost <= START_GOAL_S else 'NOT met'})")


if __name__ == "__main__":
    main()
