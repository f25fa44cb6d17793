"""How fast and how robust the DRACO judge pipeline is, against a local OpenAI-protocol
server with an injected latency L per call (the server from tests/judge_server.py, run in
its own process so that it does not compete with the client for the GIL).

    python bench/judge_pipeline.py                 # L = 0.5 s, G = 6, 4 groups
    python bench/judge_pipeline.py --latency 0.2 --groups 8

Figures, printed side by side with their goals:
  - group wall time / (dependent rounds x L), separate and fused modes, with the task's
    proposal cold and cached (goal <= 1.2: stages that do not depend on each other overlap)
  - several groups at once (a training step's tasks share the judge)
  - calls and prompt tokens per group (token counts are the server's estimate, chars / 4)
  - cache hit rate when the same groups are scored again from the disk cache (goal 100%)
  - wall time and completion rate with 30% of calls faulted (429, 500, malformed JSON,
    missing fields, steps out of range, PASS without citation)
  - the share of a group's prompt tokens that repeat a prefix some earlier call of the group
    already sent (the judge's rules, the task, the rollout: what vLLM's prefix cache and
    OpenAI's prompt caching reuse; SmolLM2's tokenizer and chat template when the model is
    set up, else characters; goal >= 60%), separate and fused, for the task alone and for
    the task with the agent prompt an AppWorld task carries (every call repeats it)
  - against llama.cpp's server (llama-cpp-python[server] with the SmolLM2 GGUF; skipped,
    saying so, without the package): one small group scored twice on one server, as the
    judge sends it and with every request made unique at its start (the control: the same
    calls, no prefix the server can reuse); wall time, prompt tokens evaluated and reused
    and seconds of prompt evaluation (from the server's log) each way. The last line is the
    headline.

    python bench/judge_pipeline.py --llama-group-size 0    # without the llama.cpp run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_server import RuleJudge, ServerProcess  # noqa: E402
from llama_server import LlamaServer, LlamaServerMissing  # noqa: E402

from draco_gym.reward import DynamicRubricReward, OpenAIJudge  # noqa: E402
from draco_gym.reward.judge_client import common_prefix_len  # noqa: E402
from draco_gym.types import Step, Task, Trajectory  # noqa: E402

CRITERIA = [
    "Finds the cheapest flight option",
    "Books exactly one ticket",
    "Pays with the saved card",
    "Reads every page of results",
    "Confirms the booking details first",
    "Logs in before searching",
]
ROUNDS = {("separate", False): 5, ("separate", True): 4, ("fused", False): 4, ("fused", True): 3}


def make_group(task: Task, g: int, n_steps: int = 8, observation_repeats: int = 40) -> list[Trajectory]:
    out = []
    for i in range(g):
        steps = [
            Step(index=j, text=f"rollout-{i} step {j}\n```python\nprint(search(page={j}))\n```", code=f"print(search(page={j}))",
                 observation=f"results page {j}: " + "flight, price, seat; " * observation_repeats, n_tokens=50)
            for j in range(1, n_steps + 1)
        ]
        out.append(Trajectory(task=task, steps=steps, termination="no_code"))
    return out


def passes(title: str, text: str) -> bool:
    """Rollout i passes criterion k when (i + k) % 3 != 0, except the last criterion,
    which everyone passes (discriminative dropout removes it)."""
    k = CRITERIA.index(title)
    if k == len(CRITERIA) - 1:
        return True
    i = int(text.split("rollout-", 1)[1].split()[0])
    return (i + k) % 3 != 0


def reward_for(server: ServerProcess, mode: str, record: list | None = None, **options) -> DynamicRubricReward:
    judge = OpenAIJudge("bench-judge", base_url=server.base_url, api_key="sk-bench", max_retries=4)
    return DynamicRubricReward(judge if record is None else Recording(judge, record), mode=mode, max_concurrency=256, **options)


class Recording:
    """A judge that notes every request's messages, in the order they are sent."""

    def __init__(self, judge, sent: list) -> None:
        self.judge, self.sent = judge, sent

    def __getattr__(self, name):
        return getattr(self.judge, name)

    async def complete(self, messages, **kwargs):
        self.sent.append(messages)
        return await self.judge.complete(messages, **kwargs)


def prompt_tokens():
    """messages -> the prompt as the judge model reads it: SmolLM2's chat template and
    tokenizer when the model is set up, else characters. Returns (function, unit)."""
    try:
        from transformers import AutoTokenizer

        from draco_gym.algos.policy.models import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"), local_files_only=True)
        return (lambda messages: list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                                    return_dict=False))), "SmolLM2 tokens"
    except Exception:  # noqa: BLE001 - no model here: characters follow tokens closely enough
        return (lambda messages: list(json.dumps(messages))), "characters"


def prefix_share(requests: list[list[dict]], tokens) -> tuple[float, int]:
    """Of all prompt tokens a group sends, the share that repeats the start of a prompt sent
    before it in the group (the longest such prefix per request); and the total."""
    seen: list[list] = []
    shared = total = 0
    for messages in requests:
        ids = tokens(messages)
        best = max((common_prefix_len(ids, earlier) for earlier in seen), default=0)
        shared, total = shared + best, total + len(ids)
        seen.append(ids)
    return shared / max(total, 1), total


class Unique:
    """The control judge: each request made unique at its start (a request number before
    the judge's rules), so the server's KV cache finds no prefix to reuse. The calls, their
    order and the client's slot choice are the judge's own."""

    def __init__(self, judge) -> None:
        self.judge, self.sent = judge, 0

    def __getattr__(self, name):
        return getattr(self.judge, name)

    async def complete(self, messages, **kwargs):
        self.sent += 1
        first = {**messages[0], "content": f"[request {self.sent}]\n" + messages[0]["content"]}
        return await self.judge.complete([first, *messages[1:]], **kwargs)


def llama_log_counts(text: str) -> tuple[int, int, float]:
    """(prompt tokens reused, prompt tokens evaluated, seconds of prompt evaluation) from
    llama-cpp-python's verbose log: "N prefix-match hit, remaining M prompt tokens to eval"
    and llama.cpp's "prompt eval time = X ms / M tokens" per request."""
    import re

    reused = sum(int(n) for n in re.findall(r"(\d+) prefix-match hit", text))
    evals = re.findall(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", text)
    return reused, sum(int(n) for _, n in evals), sum(float(ms) for ms, _ in evals) / 1e3


def llama_scoring(group_size: int, max_tokens: int) -> tuple[list[tuple[str, str, str]], str]:
    """One small group (2-step rollouts) scored (separate mode, no repairs, so both runs make
    the same calls) against llama.cpp's server twice, side by side on one server: as the judge sends it (prefix-first prompts, one request at a time,
    a rollout's calls back to back) and with every request made unique at its start (the
    control: the same calls, nothing for the server to reuse). Returns rows and the
    headline, or why it was not measured."""
    task = Task(id="llama", instruction="Book the cheapest flight from Oslo to Rome and pay with the saved card.")
    trajectories = make_group(task, group_size, n_steps=2, observation_repeats=10)
    rows = []
    try:
        with LlamaServer() as server:
            runs = {}
            for name, wrap in (("control, every prompt unique", Unique), ("judge order, prefixes reused", lambda j: j)):
                judge = OpenAIJudge("smollm2-135m-instruct", base_url=server.base_url, api_key="sk-local",
                                    request_timeout_s=600)
                # no repairs: both arms send the same number of calls, whatever the answers
                reward = DynamicRubricReward(wrap(judge), mode="separate", max_tokens=max_tokens, deadline_s=3600,
                                             retries=0, max_repairs=0)
                before = len(server.log_text())
                result, wall = timed(reward.score_group, task, trajectories)
                reused, evaluated, eval_s = llama_log_counts(server.log_text()[before:])
                runs[name] = wall, eval_s
                usage = result.total_usage
                rows.append((f"llama.cpp, {name}", f"{wall:.0f} s wall, {usage.calls} calls, prompt tokens "
                             f"{evaluated:,} evaluated ({eval_s:.0f} s) + {reused:,} reused, {usage.completion_tokens:,} "
                             f"generated; {len(result.fallbacks)} fallbacks {result.fallbacks}", ""))
    except LlamaServerMissing as exc:
        return [], f"llama.cpp time saving: not measured ({exc})"
    (cold_wall, cold_eval), (warm_wall, warm_eval) = runs.values()
    return rows, (f"llama.cpp time saving, one G={group_size} separate group scored with SmolLM2 (one slot): "
                  f"{1 - warm_wall / cold_wall:.0%} of wall time ({warm_wall:.0f} s vs {cold_wall:.0f} s), "
                  f"{1 - warm_eval / max(cold_eval, 1e-9):.0%} of prompt evaluation ({warm_eval:.0f} s vs {cold_eval:.0f} s)")


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the server waits before each answer (L)")
    parser.add_argument("--group-size", type=int, default=6, help="rollouts per group (G)")
    parser.add_argument("--groups", type=int, default=4, help="groups scored at once / in the fault run")
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--llama-group-size", type=int, default=2,
                        help="G of the group scored against llama.cpp's server, with and without prefix reuse (0: skip it)")
    parser.add_argument("--llama-max-tokens", type=int, default=256, help="the judge's max_tokens against llama.cpp")
    args = parser.parse_args(argv)
    L, G = args.latency, args.group_size
    rows: list[tuple[str, str, str]] = []

    with ServerProcess(RuleJudge(CRITERIA, passes), latency_s=L) as server:
        # warm up the client libraries once (imports, SSL context), outside the timings
        warm_task = Task(id="warmup", instruction="warm up")
        reward_for(server, "fused").score_group(warm_task, make_group(warm_task, 2))

        for mode in ("separate", "fused"):
            task = Task(id=f"bench-{mode}", instruction="Book the cheapest flight from Oslo to Rome and pay with the saved card.")
            trajs = make_group(task, G)
            reward = reward_for(server, mode)
            cold, cold_s = timed(reward.score_group, task, trajs)
            warm, warm_s = timed(reward.score_group, task, trajs)
            assert not cold.fallbacks and not warm.fallbacks, (cold.fallbacks, warm.fallbacks)
            usage = cold.total_usage
            rounds_cold, rounds_warm = ROUNDS[(mode, False)], ROUNDS[(mode, True)]
            rows += [
                (f"{mode}: group wall time, proposal cold", f"{cold_s:.3f} s = {cold_s / (rounds_cold * L):.2f} x ({rounds_cold} rounds x L)", "<= 1.2"),
                (f"{mode}: group wall time, proposal cached", f"{warm_s:.3f} s = {warm_s / (rounds_warm * L):.2f} x ({rounds_warm} rounds x L)", "<= 1.2"),
                (f"{mode}: calls per group (cold)", f"{usage.calls} (G={G}: {'3G+2' if mode == 'separate' else '2G+2'} = {(3 if mode == 'separate' else 2) * G + 2})", ""),
                (f"{mode}: prompt / completion tokens per group", f"{usage.prompt_tokens} / {usage.completion_tokens}", ""),
                (f"{mode}: criteria kept / dropped, rewards", f"{len(cold.criteria)} / {len(cold.dropped)}, {[round(r, 2) for r in cold.rewards]}", ""),
            ]
            many_tasks = [Task(id=f"bench-{mode}-{k}", instruction=f"Task {k}: book a flight.") for k in range(args.groups)]
            many_groups = [(t, make_group(t, G)) for t in many_tasks]
            cpu = time.process_time()
            _, many_s = timed(reward.score_groups, many_groups)
            cpu = time.process_time() - cpu
            rows.append((f"{mode}: {args.groups} groups at once", f"{many_s:.3f} s = {many_s / (rounds_cold * L):.2f} x ({rounds_cold} rounds x L); "
                         f"client CPU {cpu:.2f} s", "<= 1.2"))

        # prompt prefixes a server can reuse within a group: the task alone, and the task with
        # the agent prompt an AppWorld task carries (the demo's), which every call repeats
        from draco_gym.algos.cli.demo import scripted_episodes

        appworld_prompt = scripted_episodes()[0].task.agent_prompt
        tokens, unit = prompt_tokens()
        shares = {}
        for mode in ("separate", "fused"):
            for prompt, label in (("", "task alone"), (appworld_prompt, f"+ AppWorld agent prompt, {len(appworld_prompt):,} chars")):
                sent: list = []
                task = Task(id=f"prefix-{mode}-{bool(prompt)}", agent_prompt=prompt,
                            instruction="Book the cheapest flight from Oslo to Rome and pay with the saved card.")
                reward_for(server, mode, record=sent).score_group(task, make_group(task, G))
                shares[mode, bool(prompt)], total = prefix_share(sent, tokens)
                rows.append((f"{mode}: prompt {unit} that repeat an earlier prefix ({label})",
                             f"{shares[mode, bool(prompt)]:.0%} of {total:,} ({len(sent)} calls)", ">= 60%"))

        # disk cache: a second pass over the same groups pays for nothing
        with tempfile.TemporaryDirectory() as cache:
            tasks = [Task(id=f"cache-{k}", instruction=f"Task {k}") for k in range(args.groups)]
            groups = [(t, make_group(t, G)) for t in tasks]
            first, first_s = timed(lambda: reward_for(server, "separate", cache_dir=cache).score_groups(groups))
            again, again_s = timed(lambda: reward_for(server, "separate", cache_dir=cache).score_groups(groups))
            hits = sum(g.total_usage.cache_hits for g in again)
            paid = sum(g.total_usage.calls for g in again)
            same = [g.rewards for g in first] == [g.rewards for g in again]
            rows.append(("cache hit rate, second pass", f"{hits}/{hits + paid} = {hits / max(hits + paid, 1):.0%} ({again_s:.3f} s vs {first_s:.3f} s, same rewards: {same})", "100%"))

    # faults: 30% of calls answered with a random fault
    with ServerProcess(RuleJudge(CRITERIA, passes), latency_s=L, fault_rate=args.fault_rate, seed=1, retry_after_s=L) as server:
        reward = reward_for(server, "separate", retry_wait_s=L)
        walls, complete, fallbacks = [], 0, 0
        for k in range(args.groups):
            task = Task(id=f"fault-{k}", instruction=f"Task {k}: book a flight.")
            result, wall = timed(reward.score_group, task, make_group(task, G))
            walls.append(wall)
            complete += not result.fallbacks
            fallbacks += len(result.fallbacks)
        stats = server.stats()
        faulted, total = stats["faulted"], stats["requests"]
        rows += [
            (f"{args.fault_rate:.0%} faults: calls faulted", f"{faulted}/{total} = {faulted / max(total, 1):.0%}", ""),
            (f"{args.fault_rate:.0%} faults: group wall time (mean, max)", f"{statistics.mean(walls):.3f} s, {max(walls):.3f} s "
             f"= {statistics.mean(walls) / (5 * L):.2f} x (5 rounds x L)", ""),
            (f"{args.fault_rate:.0%} faults: groups scored with no fallback", f"{complete}/{args.groups} = {complete / args.groups:.0%} "
             f"({fallbacks} explicit fallbacks in all)", ""),
        ]

    # the judge-free rule rubric, for scale: no server, no network
    from draco_gym.reward import RuleRubricReward

    rule_task = Task(id="rule", instruction="Book a flight.")
    rule_groups = [make_group(rule_task, G) for _ in range(50)]
    rule = RuleRubricReward()
    _, rule_s = timed(lambda: [rule.score_group(rule_task, g) for g in rule_groups])
    rows.append(("rule rubric (no judge): time per group", f"{rule_s / len(rule_groups) * 1e3:.2f} ms (G={G}, 8 steps each)", ""))

    print(f"DRACO judge pipeline, G = {G}, injected latency L = {L} s per call")
    width = max(len(r[0]) for r in rows)
    for name, value, goal in rows:
        print(f"  {name:<{width}}  {value}" + (f"   [goal {goal}]" if goal else ""))
    llama_rows, saving = llama_scoring(args.llama_group_size, args.llama_max_tokens) if args.llama_group_size else \
        ([], "llama.cpp time saving: not measured (--llama-group-size 0)")
    for name, value, _ in llama_rows:
        print(f"  {name:<{width}}  {value}")
    print(f"  {saving}")
    print(f"headline: prompt {unit} that repeat an earlier prefix of the group, task alone / with an AppWorld agent "
          f"prompt: separate {shares['separate', False]:.0%} / {shares['separate', True]:.0%}, fused "
          f"{shares['fused', False]:.0%} / {shares['fused', True]:.0%} (goal >= 60%); {saving.split(': ', 1)[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
