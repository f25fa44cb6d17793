"""A small local model as the DRACO judge, with and without schema-constrained decoding.

    python bench/local_judge.py                       # SmolLM2-135M-Instruct, fused, k = 3
    python bench/local_judge.py --mode separate --samples 1 --max-tokens 512
    python bench/local_judge.py --speed               # decoding speed, OpenMP threads spinning vs sleeping

One group: the demo's three scripted PythonTools episodes (``draco-gym demo``), scored by
the dynamic rubric with SmolLM2-135M-Instruct (``TransformersJudge``) as the judge, once
decoding freely and once under each stage's JSON schema. No repairs and no retries, so a
fallback is an answer that failed on its first attempt. Printed per run: each stage's
calls and fallbacks (and how many were format errors: unparseable JSON or a schema
violation), completion tokens, tokens/s and the group's wall time; the last line is the
headline: first-attempt answers usable, constrained vs free.

``--speed`` measures the judge's raw speed instead (prompt tokens/s read, answer tokens/s
decoded, free and constrained), in two fresh processes side by side: OpenMP's default
(threads spin a while waiting for work) and ``OMP_WAIT_POLICY=PASSIVE`` (they sleep), which
both benches set unless the environment says otherwise. On a CPU other processes keep busy,
spinning threads take turns with them and decoding slows several-fold.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time

# Sleeping, not spinning, OpenMP threads (see --speed); read when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from draco_gym.algos.cli.demo import scripted_episodes
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


SPEED_SCHEMA = {"type": "object", "properties": {"verdicts": {"type": "array", "items": {
    "type": "object", "properties": {"criterion": {"type": "string"}, "evidence": {"type": "string"},
                                     "verdict": {"enum": ["PASS", "FAIL"]}},
    "required": ["criterion", "evidence", "verdict"]}}}, "required": ["verdicts"]}


def measure_speed(model: str, prompt_tokens: int, new_tokens: int) -> dict:
    """Seconds to read a prompt and tokens/s of decoding it, free and under a schema, in this
    process (whatever its OpenMP settings)."""
    import torch

    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.reward.judges import TransformersJudge
    from draco_gym.reward.local_judge import _generate

    judge = TransformersJudge(str(resolve_model(model)))
    tok = judge.tokenizer
    text = "The agent logged in, listed the notes and printed the one whose title matched. " * (prompt_tokens // 8)
    ids = tok(text)["input_ids"][:prompt_tokens]
    pad = tok.pad_token_id if tok.pad_token_id is not None else judge.eos_ids[0]
    with torch.no_grad():
        judge.lm(torch.tensor([ids[:16]]))  # warm-up
        start = time.perf_counter()
        judge.lm(torch.tensor([ids]))
        read = time.perf_counter() - start
    result = {"prompt_tokens_per_s": len(ids) / read}
    for label, processor in (("free", None), ("constrained", "schema")):
        if processor:
            processor = judge.constraint().processor(SPEED_SCHEMA, 4 * new_tokens)
        start = time.perf_counter()
        out = _generate(judge.lm, ids[:32], [], pad, 0.0, new_tokens, 0, processor)
        result[f"{label}_tokens_per_s"] = len(out) / (time.perf_counter() - start)
    return result


def speed(args) -> None:
    """The speed of each OpenMP wait policy, each in a fresh process (the policy is read once)."""
    print(f"judge {args.model}: reading a {args.prompt_tokens}-token prompt, then decoding {args.new_tokens} "
          f"tokens from a short one; load average {os.getloadavg()[0]:.1f} at the start")
    rows = {}
    for label, policy in (("OpenMP default (spinning)", None), ("OMP_WAIT_POLICY=PASSIVE", "PASSIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        # torch first: OpenMP reads its policy as it loads, before this module's default is set
        code = (f"import torch, sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
                f"import local_judge; print(json.dumps(local_judge.measure_speed({args.model!r}, "
                f"{args.prompt_tokens}, {args.new_tokens})))")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        rows[label] = r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {label:<27} prompt {r['prompt_tokens_per_s']:7.1f} tokens/s   decode free "
              f"{r['free_tokens_per_s']:5.1f} tokens/s   constrained {r['constrained_tokens_per_s']:5.1f} tokens/s",
              flush=True)
    before, after = rows.values()
    print(f"constrained decoding with sleeping OpenMP threads: {after['constrained_tokens_per_s']:.1f} vs "
          f"{before['constrained_tokens_per_s']:.1f} tokens/s spinning, "
          f"{after['constrained_tokens_per_s'] / before['constrained_tokens_per_s']:.1f}x")


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
    parser.add_argument("--speed", action="store_true", help="measure decoding speed per OpenMP wait policy instead")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="--speed: prompt length read (default 1000)")
    parser.add_argument("--new-tokens", type=int, default=48, help="--speed: tokens decoded (default 48)")
    args = parser.parse_args()
    if args.speed:
        speed(args)
        return

    import torch

    from draco_gym.algos.policy.models import resolve_model
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
