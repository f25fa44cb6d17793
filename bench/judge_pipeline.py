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
    already sent (the judge's rules, the task, the rollout: what a server's prompt cache
    reuses; SmolLM2's tokenizer and chat template when the model is set up, else characters;
    goal >= 60%), separate and fused
  - against llama.cpp's server (llama-cpp-python[server] with the SmolLM2 GGUF, which reuses
    the previous prompt's prefix; skipped, saying so, without the package): the prompt-processing time of one small
    group's requests sent in order, against the same requests each made unique at its start
    so that no prefix can be reused. The last line is the headline.

    python bench/judge_pipeline.py --llama-group-size 0    # without the llama.cpp run
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_server import RuleJudge, ServerProcess  # noqa: E402
from llama_server import LlamaServer, LlamaServerMissing  # noqa: E402

from draco_gym.reward import DynamicRubricReward, OpenAIJudge  # noqa: E402
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

        from draco_gym.algos.models import resolve_model

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
        best = 0
        for earlier in seen:
            n = 0
            for a, b in zip(ids, earlier):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        shared, total = shared + best, total + len(ids)
        seen.append(ids)
    return shared / max(total, 1), total


def llama_prompt_time(requests: list[list[dict]], group_size: int) -> str:
    """The group's requests against llama.cpp's server (it keeps the previous prompt's KV), in order, once
    as the judge sends them and once each made unique at its start (a nonce before the
    system text: nothing to reuse); max_tokens=1, so the time is prompt processing. Returns
    the headline, or why it was not measured."""
    try:
        with LlamaServer() as server:
            def send(messages) -> float:
                body = json.dumps({"messages": messages, "max_tokens": 1, "temperature": 0}).encode()
                request = urllib.request.Request(server.base_url + "/chat/completions", body,
                                                 {"Content-Type": "application/json"})
                start = time.perf_counter()
                urllib.request.urlopen(request, timeout=3600).read()
                return time.perf_counter() - start

            cold = sum(send([{**messages[0], "content": f"[request {k}]\n" + messages[0]["content"]}, *messages[1:]])
                       for k, messages in enumerate(requests))
            warm = sum(send(messages) for messages in requests)
    except LlamaServerMissing as exc:
        return f"llama.cpp prompt-cache saving: not measured ({exc})"
    return (f"llama.cpp prompt-cache saving, {len(requests)} calls of a G={group_size} separate group: "
            f"{1 - warm / cold:.0%} of prompt time ({warm:.1f} s in judge order vs {cold:.1f} s with no reusable prefix)")


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
                        help="G of the group replayed against llama.cpp's server (0: skip it)")
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

        # prompt prefixes a server can reuse within a group
        tokens, unit = prompt_tokens()
        shares = {}
        for mode in ("separate", "fused"):
            sent: list = []
            task = Task(id=f"prefix-{mode}", instruction="Book the cheapest flight from Oslo to Rome and pay with the saved card.")
            reward_for(server, mode, record=sent).score_group(task, make_group(task, G))
            shares[mode], total = prefix_share(sent, tokens)
            rows.append((f"{mode}: prompt {unit} that repeat an earlier prefix", f"{shares[mode]:.0%} of {total:,} "
                         f"({len(sent)} calls)", ">= 60%"))
        llama_requests: list = []
        if args.llama_group_size:
            task = Task(id="llama", instruction="Book the cheapest flight from Oslo to Rome and pay with the saved card.")
            reward_for(server, "separate", record=llama_requests).score_group(
                task, make_group(task, args.llama_group_size, n_steps=3, observation_repeats=10))

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
    saving = llama_prompt_time(llama_requests, args.llama_group_size) if llama_requests else \
        "llama.cpp prompt-cache saving: not measured (--llama-group-size 0)"
    print(f"  {saving}")
    print(f"headline: prompt {unit} that repeat an earlier prefix of the group: separate {shares['separate']:.0%}, "
          f"fused {shares['fused']:.0%} (goal >= 60%); {saving.split(': ', 1)[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
