"""A small local model as the DRACO judge, with and without schema-constrained decoding.

    python bench/local_judge.py                       # SmolLM2-135M-Instruct, fused, k = 3
    python bench/local_judge.py --mode separate --samples 1 --max-tokens 512

One group: the demo's three scripted PythonTools episodes (``draco-gym demo``), scored by
the dynamic rubric with SmolLM2-135M-Instruct (``TransformersJudge``) as the judge, once
decoding freely and once under each stage's JSON schema. No repairs and no retries, so a
fallback is an answer that failed on its first attempt. Printed per run: each stage's
calls and fallbacks (and how many were format errors: unparseable JSON or a schema
violation), completion tokens, tokens/s and the group's wall time; the last line is the
headline: first-attempt answers usable, constrained vs free.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

from draco_gym.algos.demo import scripted_episodes
from draco_gym.reward.answers import STAGES, InvalidAnswer, parse_answer


class Logged:
    """The judge, printing each call as it ends (a CPU run takes minutes)."""

    def __init__(self, judge) -> None:
        self.judge, self.model = judge, judge.model

    async def complete(self, messages, **kwargs):
        start = time.perf_counter()
        reply = await self.judge.complete(messages, **kwargs)
        seconds = time.perf_counter() - start
        stage = kwargs["schema_name"]
        try:
            parse_answer(stage, reply.text) if stage in STAGES else None
            shape = "parses"
        except InvalidAnswer as exc:
            shape = f"format error: {str(exc)[:120]}"
        print(f"    {stage:<16} sample {kwargs['sample']}: {reply.prompt_tokens} prompt, "
              f"{reply.completion_tokens} completion tokens, {seconds:.0f} s "
              f"({reply.completion_tokens / seconds:.1f} tokens/s), {shape}", flush=True)
        return reply


def run_once(judge, trajectories, args) -> dict:
    from draco_gym.reward import DynamicRubricReward

    reward = DynamicRubricReward(Logged(judge), mode=args.mode, score_samples=args.samples, max_proposed=args.max_proposed,
                                 max_augmented=args.max_augmented, max_criteria=args.max_criteria,
                                 max_tokens=args.max_tokens, max_concurrency=1, retries=0, max_repairs=0,
                                 deadline_s=3600, temperature=0.1)
    start = time.perf_counter()
    group = reward.score_group(trajectories[0].task, trajectories)
    wall = time.perf_counter() - start
    failed = collections.Counter()
    format_errors = collections.Counter()
    for reason in group.fallbacks:
        stage = re.match(r"(\w+)", reason).group(1)
        failed[stage] += 1
        if "invalid answer" in reason or "not valid JSON" in reason:
            format_errors[stage] += 1
    calls = {stage: int(u.calls) for stage, u in group.usage.items()}
    tokens = sum(int(u.completion_tokens) for u in group.usage.values())
    return {"calls": calls, "failed": failed, "format_errors": format_errors, "tokens": tokens, "wall": wall,
            "rewards": group.rewards, "fallbacks": group.fallbacks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an alias or a local HF directory")
    parser.add_argument("--task", default="order-total-1")
    parser.add_argument("--mode", default="fused", choices=["fused", "separate"])
    parser.add_argument("--samples", type=int, default=3, help="k scorings per rollout (the self-judge's 3)")
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--max-proposed", type=int, default=6)
    parser.add_argument("--max-augmented", type=int, default=2)
    parser.add_argument("--max-criteria", type=int, default=8)
    parser.add_argument("--only", choices=["free", "constrained"], help="run one of the two")
    args = parser.parse_args()

    import torch

    from draco_gym.algos.models import resolve_model
    from draco_gym.reward.judges import TransformersJudge

    torch.set_num_threads(2)
    judge = TransformersJudge(str(resolve_model(args.model)))
    trajectories = scripted_episodes(args.task)
    print(f"judge {args.model}, task {args.task}, G={len(trajectories)}, mode {args.mode}, k={args.samples}, "
          f"max_tokens {args.max_tokens}, no repairs or retries")
    results = {}
    for label in ("free", "constrained"):
        if args.only and label != args.only:
            continue
        judge.constrained = label == "constrained"
        r = results[label] = run_once(judge, trajectories, args)
        print(f"\n{label}: wall {r['wall']:.0f} s, {r['tokens']} completion tokens, "
              f"{r['tokens'] / r['wall']:.1f} tokens/s, rewards {[round(x, 3) for x in r['rewards']]}")
        for stage, calls in r["calls"].items():
            print(f"  {stage:<16} calls {calls:>2}  fallbacks {r['failed'][stage]:>2}  "
                  f"format errors {r['format_errors'][stage]:>2}")
        for reason in r["fallbacks"]:
            print(f"    - {reason[:200]}")
    usable = {k: 1 - sum(r["failed"].values()) / max(sum(r["calls"].values()), 1) for k, r in results.items()}
    print("\n" + ", ".join(f"{k}: {v:.0%} of calls usable on the first attempt" for k, v in usable.items()))


if __name__ == "__main__":
    main()
