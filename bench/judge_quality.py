"""How good is a judge? Rewards and citations against ground truth, on real AppWorld rollouts.

The offline AppWorld suite knows, per task, a reference solution, a plausible wrong one and
the requirement it breaks. From them each group gets four rollouts whose faulty step is
known by construction:

    reference  the reference solution                                   no fault
    wrong      the suite's wrong solution      fault: the first block that differs from the reference
    truncated  the reference without its last block (the completion), then "done"
                                               fault: the closing step, where the completion is missing
    perturbed  the reference with one block altered: a value the user gave mistyped (a number
               changed, a string's last character dropped) or the submitted answer off by one;
               the first alteration the engine fails is used
                                               fault: the altered block

Every rollout is executed block by block through ``gym.make("draco_gym/AppWorld-v0")`` (the
real engine), so the judge reads real observations and the engine's own verdict is recorded
beside the judge's. Each group is then scored twice by the DRACO dynamic rubric
(``build_reward("dynamic")``), the second time with fresh caches and the rollouts in reverse
order, and the bench reports:

    ordering     reward of the reference > reward of each faulty rollout (ties count as misses)
    citations    precision: of the (rollout, step) pairs cited by FAIL verdicts, the share
                 that is a faulty rollout's faulty step (FAIL citations on the reference all miss);
                 recall: the share of faulty rollouts whose faulty step some FAIL verdict cites
    agreement    the two scorings' verdicts on the same rollout and criterion (matched by title)
    fallbacks    stage requests that fell back / stage requests, and scorings left all-zero
    usage        calls, prompt/completion tokens, cost and wall time per group

    python bench/judge_quality.py                      # local SmolLM2-135M judge, 1 group
    python bench/judge_quality.py --groups 4 --mode separate
    python bench/judge_quality.py --groups 2 --scorings 1 --json out.json   # cheaper: no agreement
    python bench/judge_quality.py --report out.json                         # the table again, no scoring
    python bench/judge_quality.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-32B \\
        --api-key-env MY_KEY --price 0.1 0.3 --groups 16

The default judge is a 135M-parameter model on a CPU: its figures are a small model's, not
DRACO's. The last line is the headline: ordering accuracy and citation F1.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import sys
import time
import tokenize

# OpenMP threads that spin while they wait for work fight the other processes on a busy
# CPU: on 2 shared cores SmolLM2 decoded 1.2 tokens/s with spinning threads and 9.3 with
# sleeping ones. Read when torch loads, so set before anything imports it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draco_gym.envs.appworld.suite import GroundTruth  # noqa: E402
from draco_gym.reward import build_reward  # noqa: E402
from draco_gym.reward.answers import normalize_title  # noqa: E402
from draco_gym.reward.judge_client import judge_identity  # noqa: E402
from draco_gym.types import GroupScore, Task, Trajectory  # noqa: E402

KINDS = ("reference", "wrong", "truncated", "perturbed")
FAULTY_KINDS = KINDS[1:]
CLOSING = "The task is done."
SMALL_MODEL = "smollm2-135m-instruct"
LOCAL_LIMITS = {"max_tokens": 768, "max_proposed": 6, "max_augmented": 2, "max_criteria": 8}
"""The local judge's rubric size and answer budget (as in the self-judge quickstart and
bench/local_judge.py): the reward's defaults (15 proposed criteria, 10 added per rollout)
make a constrained answer need about 3,000 tokens, minutes each on a CPU."""


# -- ground truth and groups ----------------------------------------------------------------


@dataclass
class Plan:
    """One rollout to execute: its blocks (the closing message follows them) and the 1-based
    step that introduces the fault (None for the reference)."""

    kind: str
    blocks: list[str]
    faulty_step: int | None
    note: str = ""


def first_difference(reference: Sequence[str], other: Sequence[str]) -> int:
    """The 1-based step of the first block of ``other`` that differs from the reference
    (or where one of them ends early)."""
    for i, (a, b) in enumerate(zip(reference, other), start=1):
        if a.strip() != b.strip():
            return i
    if len(reference) == len(other):
        raise ValueError("the two solutions are identical: no step introduces a fault")
    return min(len(reference), len(other)) + 1


def plan_reference(gt: GroundTruth) -> Plan:
    return Plan("reference", list(gt.reference_blocks), None, "reference solution")


def plan_wrong(gt: GroundTruth) -> Plan:
    step = first_difference(gt.reference_blocks, gt.wrong_blocks)
    return Plan("wrong", list(gt.wrong_blocks), step, f"breaks: {gt.wrong_fails}")


def plan_truncated(gt: GroundTruth) -> Plan:
    """The reference without its last block; the closing message takes its place (step n),
    claiming a completion that never happened."""
    if len(gt.reference_blocks) < 2:
        raise ValueError(f"task {gt.task_id!r}: a one-block reference cannot be truncated")
    return Plan("truncated", list(gt.reference_blocks[:-1]), len(gt.reference_blocks), "completion block left out")


def _altered(token: tokenize.TokenInfo) -> str | None:
    """A mistyped copy of a literal: a number's last digit changed, a string's last digit
    changed or, without digits, its last character dropped."""
    if token.type == tokenize.NUMBER:
        text = token.string
        digits = [i for i, ch in enumerate(text) if ch.isdigit()]
        if not digits:
            return None
        i = digits[-1]
        return text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]
    quote = token.string[-1]
    body = token.string[token.string.index(quote) + 1: -1]
    digits = [i for i, ch in enumerate(body) if ch.isdigit()]
    if digits:
        i = digits[-1]
        body = body[:i] + str((int(body[i]) + 1) % 10) + body[i + 1:]
    elif len(body) >= 3:
        body = body[:-1]
    else:
        return None
    return token.string[: token.string.index(quote) + 1] + body + quote


def _user_values(block: str, instruction: str) -> list[tokenize.TokenInfo]:
    """Literals in ``block`` whose value the user wrote in the instruction (a name, an
    amount, a path, a message), in source order."""
    said = instruction.lower()
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(block).readline))
    except (tokenize.TokenError, SyntaxError):  # not Python: nothing to alter
        return []
    for token in tokens:
        if token.start[0] != token.end[0]:  # a multi-line string is no typed-in value
            continue
        if token.type == tokenize.STRING:
            try:
                value = str(ast.literal_eval(token.string))
            except (ValueError, SyntaxError):  # f-strings and the like are not user values
                continue
            if len(value) >= 3 and value.lower() in said:
                found.append(token)
        elif token.type == tokenize.NUMBER and len(token.string) >= 2 and \
                re.search(rf"(?<![\d.]){re.escape(token.string)}(?![\d])", instruction):
            found.append(token)
    return found


def _replace(block: str, token: tokenize.TokenInfo, new: str) -> str:
    lines = block.splitlines(keepends=True)
    (row, start), (_, end) = token.start, token.end
    line = lines[row - 1]
    lines[row - 1] = line[:start] + new + line[end:]
    return "".join(lines)


def perturbation_candidates(gt: GroundTruth, instruction: str) -> list[Plan]:
    """Alterations of the reference, most telling first: a value the user gave, mistyped
    (latest block first, its last such value first), then the submitted answer off by one.
    Each alters exactly one block, which is the faulty step."""
    plans = []
    for k in range(len(gt.reference_blocks) - 1, -1, -1):
        block = gt.reference_blocks[k]
        for token in reversed(_user_values(block, instruction)):
            new = _altered(token)
            if new is not None and new != token.string:
                blocks = list(gt.reference_blocks)
                blocks[k] = _replace(block, token, new)
                plans.append(Plan("perturbed", blocks, k + 1, f"step {k + 1}: {token.string} -> {new}"))
    for k in range(len(gt.reference_blocks) - 1, -1, -1):
        block = gt.reference_blocks[k]
        marker = "complete_task(answer="
        if marker in block and block.rstrip().endswith(")"):
            head, expression = block.split(marker, 1)
            expression = expression.rstrip()[:-1]
            blocks = list(gt.reference_blocks)
            blocks[k] = f"{head}{marker}{_off_by_one(expression)})"
            plans.append(Plan("perturbed", blocks, k + 1, f"step {k + 1}: answer {expression} -> {_off_by_one(expression)}"))
            break
    return plans


def _off_by_one(expression: str) -> str:
    return f"{expression} + 1"


@dataclass
class Rollout:
    kind: str
    trajectory: Trajectory
    faulty_step: int | None
    note: str

    @property
    def success(self) -> bool | None:
        return self.trajectory.metrics.get("success")


@dataclass
class Group:
    task: Task
    rollouts: list[Rollout]
    truth: GroundTruth


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def execute(env: Any, task_id: str, blocks: Sequence[str]) -> Trajectory:
    """Run ``blocks`` as one episode of the real env, one block per step, then the closing
    message (no code: the episode ends under the ``no_code`` rule)."""
    inner = env.unwrapped
    env.reset(options={"task_id": task_id})
    info: dict = {}
    for block in blocks:
        _, _, terminated, truncated, info = env.step(fence(block))
        if terminated or truncated:
            break
    else:
        _, _, terminated, truncated, info = env.step(CLOSING)
    trajectory = info.get("trajectory") or inner.trajectory()
    if not trajectory.metrics:
        raise RuntimeError(f"task {task_id!r}: the episode did not end with the env's evaluation "
                           f"(termination {trajectory.termination!r})")
    return trajectory


def build_group(env: Any, task_id: str, truth: GroundTruth | None = None,
                progress: Callable[[str], None] = lambda message: None) -> Group:
    """The four rollouts of ``task_id``, executed through ``env``. The perturbed one is the
    first candidate alteration whose episode the engine fails."""
    truth = truth or env.unwrapped.source.ground_truth(task_id)
    rollouts: list[Rollout] = []
    task: Task | None = None
    for plan in (plan_reference(truth), plan_wrong(truth), plan_truncated(truth)):
        trajectory = execute(env, task_id, plan.blocks)
        task = trajectory.task
        rollouts.append(Rollout(plan.kind, trajectory, plan.faulty_step, plan.note))
        progress(f"  executed {plan.kind:<9} {len(trajectory.steps)} steps, engine success={trajectory.metrics.get('success')}")
    assert task is not None
    for plan in perturbation_candidates(truth, task.instruction):
        trajectory = execute(env, task_id, plan.blocks)
        if not trajectory.metrics.get("success"):
            rollouts.append(Rollout(plan.kind, trajectory, plan.faulty_step, plan.note))
            progress(f"  executed {plan.kind:<9} {len(trajectory.steps)} steps, engine success=False ({plan.note})")
            break
        progress(f"  perturbation {plan.note} still passes the engine; trying the next")
    else:
        raise RuntimeError(f"task {task_id!r}: no perturbation of the reference made the engine fail")
    return Group(task, rollouts, truth)


# -- metrics --------------------------------------------------------------------------------


def fail_citations(score: GroupScore) -> list[set[int]]:
    """Per rollout, the steps cited by its FAIL verdicts."""
    return [{s for v in row.verdicts if v.score == -1 for s in v.cited_steps} for row in score.scores]


@dataclass
class Citations:
    """Counts behind citation precision and recall (summed over scorings and groups)."""

    hits: int = 0  # (faulty rollout, faulty step) pairs cited by a FAIL verdict
    cited: int = 0  # (rollout, step) pairs cited by any FAIL verdict
    faulty: int = 0  # faulty rollouts scored

    def add(self, other: Citations) -> Citations:
        return Citations(self.hits + other.hits, self.cited + other.cited, self.faulty + other.faulty)

    @property
    def precision(self) -> float | None:
        return self.hits / self.cited if self.cited else None

    @property
    def recall(self) -> float | None:
        return self.hits / self.faulty if self.faulty else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def citations(score: GroupScore, faulty_steps: Sequence[int | None]) -> Citations:
    """Citation counts of one scoring; ``faulty_steps[i]`` is rollout i's faulty step or None."""
    if len(score.scores) != len(faulty_steps):
        raise ValueError(f"{len(score.scores)} scored rollouts for {len(faulty_steps)} faulty steps")
    counts = Citations()
    for cited, step in zip(fail_citations(score), faulty_steps, strict=True):
        counts.cited += len(cited)
        if step is not None:
            counts.faulty += 1
            counts.hits += step in cited
    return counts


def orderings(rewards: Sequence[float], kinds: Sequence[str]) -> dict[str, bool]:
    """Per faulty kind: is the reference's reward strictly higher?"""
    reference = rewards[kinds.index("reference")]
    return {kind: reference > r for kind, r in zip(kinds, rewards, strict=True) if kind != "reference"}


def verdict_agreement(first: GroupScore, second: GroupScore) -> tuple[int, int]:
    """(agreeing, compared) verdicts of two scorings of the same rollouts (same order): a
    verdict is compared when both scorings kept a criterion of that title."""
    agree = compared = 0
    for a, b in zip(first.scores, second.scores, strict=True):
        theirs = {normalize_title(v.criterion): v.score for v in b.verdicts}
        for v in a.verdicts:
            key = normalize_title(v.criterion)
            if key in theirs:
                compared += 1
                agree += v.score == theirs[key]
    return agree, compared


def unpermute(score: GroupScore, order: Sequence[int]) -> GroupScore:
    """``score`` of the rollouts taken in ``order`` (position p held rollout order[p]), back
    in the rollouts' own order."""
    rows = [None] * len(order)
    for position, index in enumerate(order):
        rows[index] = score.scores[position]
    return score.model_copy(update={"scores": rows})


def stage_requests(n_rollouts: int, mode: str, samples: int = 1) -> int:
    """Stage requests in one scoring: propose, G augments, merge, G x k scores (or fused
    score-and-cite calls) and, in separate mode, G attributions."""
    return 2 + n_rollouts + n_rollouts * samples + (n_rollouts if mode == "separate" else 0)


def stage_fallbacks(score: GroupScore) -> int:
    """Fallbacks of single stages (the group-level "every reward set to 0" is counted apart)."""
    return sum(not reason.startswith("group:") for reason in score.fallbacks)


# -- the run --------------------------------------------------------------------------------


@dataclass
class GroupResult:
    task_id: str
    kinds: list[str]
    faulty_steps: list[int | None]
    engine_success: list[bool | None]
    notes: list[str]
    rewards: list[list[float]]  # per scoring, in the rollouts' order
    ordering: list[dict[str, bool]]
    citations: Citations
    agreement: tuple[int, int]
    fallbacks: int
    requests: int
    zeroed: int
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    wall_s: float
    fallback_reasons: list[str] = field(default_factory=list)
    execute_s: float = 0.0  # building the group on the AppWorld engine

    @classmethod
    def from_json(cls, data: dict) -> GroupResult:
        """A result as ``--json`` saved it."""
        return cls(**{**data, "citations": Citations(**data["citations"]), "agreement": tuple(data["agreement"])})


def score_group(make_reward: Callable[[], Any], group: Group, mode: str, samples: int = 1,
                scorings: int = 2) -> GroupResult:
    """Score ``group`` twice (the second time with a fresh reward and the rollouts reversed)
    and measure it against its ground truth. ``scorings=1`` scores once: half the judge
    time, no verdict agreement."""
    if scorings not in (1, 2):
        raise ValueError(f"scorings must be 1 or 2, got {scorings}")
    trajectories = [r.trajectory for r in group.rollouts]
    kinds = [r.kind for r in group.rollouts]
    faulty = [r.faulty_step for r in group.rollouts]
    orders = [list(range(len(trajectories))), list(reversed(range(len(trajectories))))][:scorings]
    scores, start = [], time.perf_counter()
    for order in orders:
        scored = make_reward().score_group(group.task, [trajectories[i] for i in order])
        scores.append(unpermute(scored, order))
    wall = time.perf_counter() - start
    usage = [s.total_usage for s in scores]
    counts = Citations()
    for s in scores:
        counts = counts.add(citations(s, faulty))
    return GroupResult(
        task_id=group.task.id, kinds=kinds, faulty_steps=faulty,
        engine_success=[r.success for r in group.rollouts], notes=[r.note for r in group.rollouts],
        rewards=[s.rewards for s in scores], ordering=[orderings(s.rewards, kinds) for s in scores],
        citations=counts, agreement=verdict_agreement(*scores) if len(scores) == 2 else (0, 0),
        fallbacks=sum(stage_fallbacks(s) for s in scores),
        requests=len(scores) * stage_requests(len(trajectories), mode, samples),
        zeroed=sum(any(r.startswith("group:") for r in s.fallbacks) for s in scores),
        calls=sum(u.calls for u in usage), prompt_tokens=sum(u.prompt_tokens for u in usage),
        completion_tokens=sum(u.completion_tokens for u in usage), cost=sum(u.cost for u in usage),
        wall_s=wall, fallback_reasons=[r for s in scores for r in s.fallbacks],
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def report(results: Sequence[GroupResult], judge_label: str, mode: str) -> list[str]:
    """The table and, last, the headline."""
    scorings = max((len(r.rewards) for r in results), default=2)
    how = ("each group scored twice (second: fresh caches, rollouts reversed)" if scorings == 2
           else "each group scored once (no verdict agreement)")
    lines = [f"judge: {judge_label}; mode {mode}; {how}", "",
             f"per group (rewards: reference / wrong / truncated / perturbed{', scoring 1 | scoring 2' if scorings == 2 else ''})"]
    for r in results:
        rewards = " | ".join(" / ".join(f"{x:+.2f}" for x in row) for row in r.rewards)
        ok = sum(v for o in r.ordering for v in o.values())
        total = sum(len(o) for o in r.ordering)
        lines.append(f"  {r.task_id:<30} rewards {rewards}; ordered {ok}/{total}; faulty steps "
                     f"{r.faulty_steps[1:]}; cites P {_num(r.citations.precision)} R {_num(r.citations.recall)}; "
                     f"fallbacks {r.fallbacks}/{r.requests}; {r.calls} calls; {r.wall_s:.0f} s")
    n = max(len(results), 1)
    counts = Citations()
    for r in results:
        counts = counts.add(r.citations)
    per_kind = {k: [o[k] for r in results for o in r.ordering if k in o] for k in FAULTY_KINDS}
    all_pairs = [v for pairs in per_kind.values() for v in pairs]
    agree = sum(r.agreement[0] for r in results)
    compared = sum(r.agreement[1] for r in results)
    success = {k: [r.engine_success[r.kinds.index(k)] for r in results] for k in KINDS}
    rows = [
        ("groups (G = 4 rollouts each)", f"{len(results)}"),
        ("engine success: ref / wrong / trunc / pert",
         " / ".join(f"{sum(bool(x) for x in success[k])}/{len(success[k])}" for k in KINDS)),
        *[(f"ordering: reference > {k}", f"{_pct(sum(v) / len(v) if v else None)} ({sum(v)}/{len(v)})")
          for k, v in per_kind.items()],
        ("ordering accuracy (all pairs)", f"{_pct(sum(all_pairs) / len(all_pairs) if all_pairs else None)} "
                                          f"({sum(all_pairs)}/{len(all_pairs)})"),
        ("citation precision (FAIL cites on the faulty step)", f"{_num(counts.precision)} ({counts.hits}/{counts.cited})"),
        ("citation recall (faulty steps cited by a FAIL)", f"{_num(counts.recall)} ({counts.hits}/{counts.faulty})"),
        ("citation F1", _num(counts.f1)),
        ("verdict agreement between the two scorings", f"{_pct(agree / compared if compared else None)} "
                                                       f"({agree}/{compared} shared verdicts)"),
        ("fallback rate (stage requests)", f"{_pct(sum(r.fallbacks for r in results) / max(sum(r.requests for r in results), 1))} "
                                           f"({sum(r.fallbacks for r in results)}/{sum(r.requests for r in results)}); "
                                           f"scorings left all-zero: {sum(r.zeroed for r in results)}/"
                                           f"{sum(len(r.rewards) for r in results)}"),
        (f"calls per group ({'two scorings' if scorings == 2 else 'one scoring'})", f"{sum(r.calls for r in results) / n:.1f}"),
        ("prompt / completion tokens per group", f"{sum(r.prompt_tokens for r in results) / n:.0f} / "
                                                 f"{sum(r.completion_tokens for r in results) / n:.0f}"),
        ("cost per group", f"${sum(r.cost for r in results) / n:.4f}"),
        ("judge wall time per group", f"{sum(r.wall_s for r in results) / n:.1f} s"),
        ("completion tokens per judge second", f"{sum(r.completion_tokens for r in results) / max(sum(r.wall_s for r in results), 1e-9):.1f}"
                                               " (prompt reading included)"),
        ("AppWorld execution per group (4 rollouts)", f"{sum(r.execute_s for r in results) / n:.1f} s"),
    ]
    reasons = list(dict.fromkeys(reason.split(";")[0][:160] for r in results for reason in r.fallback_reasons))
    if reasons:
        rows.append(("fallback reasons (distinct, first 3)", " | ".join(reasons[:3])))
    width = max(len(name) for name, _ in rows)
    lines += ["", *(f"  {name:<{width}}  {value}" for name, value in rows), ""]
    lines.append(f"headline ({judge_label}): ordering accuracy {_pct(sum(all_pairs) / len(all_pairs) if all_pairs else None)}, "
                 f"citation F1 {_num(counts.f1)} (P {_num(counts.precision)}, R {_num(counts.recall)}), "
                 f"agreement {_pct(agree / compared if compared else None)}, "
                 f"fallbacks {_pct(sum(r.fallbacks for r in results) / max(sum(r.requests for r in results), 1))}")
    return lines


class ProgressJudge:
    """A judge that reports each answered call (stage, tokens, seconds) as it comes: a small
    local judge takes minutes per group, and silence looks like a hang. Everything else the
    client asks of a judge (``server_slots``, ``cancel_stops_work``) is the wrapped judge's:
    hidden, a one-slot server would get several requests at once and cut answers short."""

    def __init__(self, judge: Any, say: Callable[[str], None]) -> None:
        self.judge, self.say, self.calls = judge, say, 0
        self.model = judge.model

    def __getattr__(self, name: str) -> Any:
        if name == "judge":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.judge, name)

    @property
    def identity(self) -> Any:
        return judge_identity(self.judge)

    async def complete(self, messages, **options) -> Any:
        start = time.perf_counter()
        reply = await self.judge.complete(messages, **options)
        self.calls += 1
        self.say(f"    judge call {self.calls}: {options.get('schema_name', '?')}, {reply.prompt_tokens} prompt + "
                 f"{reply.completion_tokens} completion tokens, {time.perf_counter() - start:.1f} s")
        return reply

    async def aclose(self) -> None:
        close = getattr(self.judge, "aclose", None)
        if close is not None:
            await close()


def make_judge(args: argparse.Namespace) -> tuple[Any, str]:
    """The judge the flags name, and how the report labels it (never with the key)."""
    if args.base_url:
        from draco_gym.reward import OpenAIJudge

        if not args.model:
            raise SystemExit("--base-url needs --model (the model name the endpoint serves)")
        if args.api_key_env and not os.environ.get(args.api_key_env):
            print(f"note: ${args.api_key_env} is not set; requests carry no API key", file=sys.stderr)
        options = {"structured_output": args.structured_output} if args.structured_output else {}
        judge = OpenAIJudge(args.model, base_url=args.base_url, api_key_env=args.api_key_env or "OPENAI_API_KEY",
                            request_timeout_s=args.request_timeout, **options)
        return judge, f"{args.model} at {args.base_url}"
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.reward import TransformersJudge

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    name = args.model or SMALL_MODEL
    judge = TransformersJudge(resolve_model(name), name=name)
    return judge, (f"{name}, local in-process on {judge.device}, rubric of at most {args.max_criteria} criteria "
                   f"(a small model's figures)")


def select_tasks(source: Any, split: str, tasks: str | None, groups: int) -> list[str]:
    """``--tasks`` as given, else ``groups`` tasks of ``split`` taking each scenario's first
    instance before any second one, so a few groups cover different scenarios."""
    if tasks:
        chosen = [t.strip() for t in tasks.split(",") if t.strip()]
        for t in chosen:
            if not source.has_task(t):
                raise SystemExit(f"--tasks: unknown task {t!r} in {source.data_dir}")
        return chosen
    splits = source.splits if split == "all" else [split]
    ids = [t for s in splits for t in source.task_ids(s)]
    ranked = sorted(ids, key=lambda t: (int(t.rsplit("_", 1)[1]) if t.rsplit("_", 1)[-1].isdigit() else 0, ids.index(t)))
    if groups > len(ranked):
        raise SystemExit(f"--groups {groups}: split {split!r} has {len(ranked)} tasks")
    return ranked[:groups]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--groups", type=int, default=1, help="groups (tasks) to build and score (default 1)")
    parser.add_argument("--split", default="all", help="train, dev, test or all (default)")
    parser.add_argument("--tasks", help="comma-separated task ids instead of --groups/--split")
    parser.add_argument("--mode", choices=("separate", "fused"), default="fused",
                        help="fused: score and cite in one call (default, 2G+2 calls); separate: the paper's stages")
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: the local in-process judge)")
    parser.add_argument("--model", help=f"the endpoint's model, or the local judge's model name (default {SMALL_MODEL})")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the endpoint's API key (read, never printed)")
    parser.add_argument("--structured-output", help="the endpoint judge's structured_output option (default: its own)")
    parser.add_argument("--price", type=float, nargs=2, metavar=("IN", "OUT"),
                        help="USD per 1M prompt and completion tokens, for the cost column")
    parser.add_argument("--max-tokens", type=int,
                        help=f"judge tokens per answer (default 512; the local judge {LOCAL_LIMITS['max_tokens']})")
    for flag in ("max_proposed", "max_augmented", "max_criteria"):
        parser.add_argument(f"--{flag.replace('_', '-')}", type=int,
                            help=f"the rubric's {flag} (default: the reward's own; the local judge {LOCAL_LIMITS[flag]})")
    parser.add_argument("--max-repairs", type=int, default=1, help="repair requests per invalid answer (default 1)")
    parser.add_argument("--concurrency", type=int,
                        help="judge requests in flight (default: 4 for an endpoint, 1 for the local judge, which "
                             "answers one at a time: queued calls would only eat into their deadline)")
    parser.add_argument("--scorings", type=int, choices=(1, 2), default=2,
                        help="scorings per group (default 2; 1 halves the judge time and drops verdict agreement)")
    parser.add_argument("--threads", type=int, help="torch threads of the local judge (default: torch's)")
    parser.add_argument("--report", dest="report_path", metavar="JSON",
                        help="print the table of results a --json run saved, scoring nothing")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds per endpoint request")
    parser.add_argument("--json", dest="json_path", help="also write the per-group results here")
    args = parser.parse_args(argv)
    if args.groups < 1:
        parser.error(f"--groups must be >= 1, got {args.groups}")
    for flag, local in LOCAL_LIMITS.items():
        value = getattr(args, flag)
        if value is None and not args.base_url:
            setattr(args, flag, local)
        elif value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if args.max_tokens is None:
        args.max_tokens = 512
    if args.max_tokens < 16:
        parser.error(f"--max-tokens must be >= 16, got {args.max_tokens}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.concurrency is None:
        args.concurrency = 4 if args.base_url else 1
    elif args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    return args


def reprint(path: str) -> list[str]:
    """The table of a saved run (``--json``, with its judge label and mode)."""
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"--report {path}: cannot read saved results ({exc})") from None
    if not isinstance(saved, dict) or "groups" not in saved:
        raise SystemExit(f"--report {path}: not a file written by --json")
    return report([GroupResult.from_json(g) for g in saved["groups"]], saved["judge"], saved["mode"])


def save(path: str, results: Sequence[GroupResult], label: str, mode: str) -> None:
    Path(path).write_text(json.dumps({"judge": label, "mode": mode, "groups": [asdict(r) for r in results]}, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_path:
        print("\n".join(reprint(args.report_path)))
        return 0

    import gymnasium as gym

    import draco_gym

    gym.register_envs(draco_gym)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = gym.make("draco_gym/AppWorld-v0", split="train", show_progress=False, max_turns=20)
    try:
        source = env.unwrapped.source
        task_ids = select_tasks(source, args.split, args.tasks, args.groups)
        judge, label = make_judge(args)
        judge = ProgressJudge(judge, say)
        prices = {judge.model: list(args.price)} if args.price else {}

        def make_reward():
            limits = {k: getattr(args, k) for k in ("max_proposed", "max_augmented", "max_criteria")
                      if getattr(args, k) is not None}
            return build_reward("dynamic", judge=judge, mode=args.mode, max_tokens=args.max_tokens,
                                max_repairs=args.max_repairs, max_concurrency=args.concurrency, prices=prices,
                                **limits)

        results = []
        for n, task_id in enumerate(task_ids, start=1):
            say(f"[group {n}/{len(task_ids)}] {task_id}: executing 4 rollouts on the AppWorld engine")
            start = time.perf_counter()
            group = build_group(env, task_id, progress=say)
            executed = time.perf_counter() - start
            say(f"[group {n}/{len(task_ids)}] {task_id}: executed in {executed:.0f} s; scoring "
                f"{'twice' if args.scorings == 2 else 'once'} with {label}")
            result = score_group(make_reward, group, args.mode, scorings=args.scorings)
            result.execute_s = executed
            say(f"[group {n}/{len(task_ids)}] done in {result.wall_s:.0f} s: rewards {result.rewards}, "
                f"{result.fallbacks} fallbacks")
            results.append(result)
            if args.json_path:  # after every group: a long run stopped early keeps what it measured
                save(args.json_path, results, label, args.mode)
    finally:
        env.close()
    print("\n".join(report(results, label, args.mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
