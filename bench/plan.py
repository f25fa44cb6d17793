"""A cost model for a run past this machine: from per-phase figures measured on one unit of
hardware, the iteration time of a config on a cluster shape (sequential, with streaming
scoring, with one-step overlap), the phase that bounds it, and the judge's bill.

    python bench/plan.py                         # the paper's AppWorld setting (assumptions named)
    python bench/plan.py --sampler-gpus 2 --learner-gpus 6 --judge-rpm 600
    python bench/plan.py --measured runs/quickstart   # calibrate on a run here, predict its iterations

The model, phase by phase (one iteration = ``tasks`` groups of ``G`` episodes):

    generation  tasks*G*turns*tokens_per_turn / (sampler tokens/s x sampler GPUs)
    env         tasks*G*turns*env_step_s / env-runner nodes (a node steps its episodes in turn)
    judge       groups queue on one judge of throughput mu = min(concurrency / L, rate limit)
                calls/s; group k, handed over at a_k, is done at
                    f_k = max(a_k + rounds*L, b_k),  b_k = max(a_k, b_{k-1}) + calls/mu
                (its dependent rounds cannot go faster than their latency; the judge's
                capacity serves the groups in order)
    learner     the same tokens / (learner tokens/s x learner GPUs)
    credit, sync   seconds, as measured

Sequential hands every group over when the last episode ends (a_k = rollout); streaming
hands group k over when its own G episodes end: the groups' ends spread evenly over the
last ``group_end_spread`` share of the rollout (the rollout loop advances every episode in
lockstep, so a group ends at the turn its longest episode ends; 0 = all end together and
streaming gains nothing). One-step overlap (``rollout.pipeline: one_step``) samples and
judges iteration k+1, streamed, while k is learned: the iteration takes the slower of its
two stages (rollout with streamed judging, credit + learner), plus the weight sync, which
the next sampling waits for.

DRACO's judge calls per group (``reward/dynamic.py``'s table): propose 1 (cached per task)
+ augment G + merge 1 + score G + attribute G = 3G+2 in five dependent rounds ("separate",
the paper's); "fused" merges score and attribute into one call: 2G+2 in four rounds. With
the task's proposal cached, one call and one round fewer.

The paper's setting (``PAPER``): AppWorld, B = 16 tasks, G = 6, 100 steps, 8 H100, judge
GPT-5.4 at temperature 0.1 (DRACO paper, section 4.1.2 and appendix D); it reports $1,607 of
judge calls per 100 steps (section 4.3) but neither the judge's token counts nor its rate
(the "rates of section 4.1.3" are not in the text). Assumed here, and printed as such: the
GPT-5.4 list price of $2.50 / $15.00 per million prompt / completion tokens, 14,000 prompt
and 1,000 completion tokens per call (a judge prompt carries the task, the AppWorld agent
prompt and a rollout of ~17 turns), and the throughput figures in ``PAPER``. The check
prints the per-call prompt tokens the paper's bill implies at that price.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from draco_gym.algos.rllib.reporting import PHASES  # the timers/phases/<phase> a run reports
from draco_gym.records import RecordError, read_records

JudgeMode = Literal["separate", "fused", "none"]


@dataclass(frozen=True)
class Measured:
    """Per-phase figures, each measured on one unit (one sampler GPU, one learner GPU, one
    env-runner node, one judge call)."""

    sampler_tokens_per_s: float
    learner_tokens_per_s: float
    env_step_s: float
    judge_call_s: float
    judge_prompt_tokens: float = 0.0
    judge_completion_tokens: float = 0.0
    judge_price_prompt: float = 0.0
    """dollars per million prompt tokens"""
    judge_price_completion: float = 0.0
    """dollars per million completion tokens"""
    credit_s: float = 0.0
    sync_s: float = 0.0
    other_s: float = 0.0
    """seconds per iteration outside the phases (the trainer's own bookkeeping)"""


@dataclass(frozen=True)
class Cluster:
    sampler_gpus: int = 1
    learner_gpus: int = 1
    env_nodes: int = 1
    judge_concurrency: int = 16
    """judge requests in flight at once (``judge.max_concurrency``)"""
    judge_rpm: float | None = None
    """the judge's rate limit in requests per minute; None: unlimited"""


@dataclass(frozen=True)
class RunConfig:
    tasks_per_iteration: int
    group_size: int
    turns: float
    """mean turns (env steps) per episode"""
    tokens_per_turn: float
    """mean generated tokens per turn"""
    judge_mode: JudgeMode = "separate"
    proposal_cached: bool = False
    group_end_spread: float = 0.5
    judge_calls_per_group: float | None = None
    """overrides the DRACO count (a measured run's mean, a static rubric's G calls)"""


@dataclass(frozen=True)
class Plan:
    phases: dict[str, float]
    sequential_s: float
    streaming_s: float
    one_step_s: float
    bottleneck: str
    judge_calls_per_step: float
    judge_cost_per_step: float

    @property
    def judge_cost_per_100_steps(self) -> float:
        return 100 * self.judge_cost_per_step


def judge_calls(group_size: int, mode: JudgeMode, proposal_cached: bool = False) -> int:
    """DRACO's judge calls for one group: 3G+2 separate, 2G+2 fused (one fewer cached)."""
    if mode == "none":
        return 0
    per_rollout = {"separate": 3, "fused": 2}[mode]
    return per_rollout * group_size + 2 - int(proposal_cached)


def judge_rounds(mode: JudgeMode, proposal_cached: bool = False) -> int:
    """Dependent rounds of one group's judging: 5 separate, 4 fused (one fewer cached)."""
    if mode == "none":
        return 0
    return {"separate": 5, "fused": 4}[mode] - int(proposal_cached)


def judge_throughput(m: Measured, c: Cluster) -> float:
    """Calls per second the judge serves at most: concurrency / latency, capped by the rate limit."""
    mu = c.judge_concurrency / m.judge_call_s if m.judge_call_s > 0 else float("inf")
    return min(mu, c.judge_rpm / 60.0) if c.judge_rpm else mu


def judge_finish(handed_over: list[float], calls: float, rounds: int, m: Measured, c: Cluster) -> float:
    """When the last group is judged, groups handed over at ``handed_over`` (in order)."""
    if calls == 0 or not handed_over:
        return max(handed_over, default=0.0)
    work = calls / judge_throughput(m, c)
    served, done = float("-inf"), 0.0
    for a in handed_over:
        served = max(a, served) + work
        done = max(done, a + rounds * m.judge_call_s, served)
    return done


def group_ends(rollout_s: float, n_groups: int, spread: float) -> list[float]:
    """Group k of n ends at rollout * (1 - spread + spread * k / n): the last one at the rollout's end."""
    return [rollout_s * (1 - spread + spread * (k + 1) / n_groups) for k in range(n_groups)]


def plan(m: Measured, c: Cluster, r: RunConfig) -> Plan:
    episodes = r.tasks_per_iteration * r.group_size
    tokens = episodes * r.turns * r.tokens_per_turn
    calls = r.judge_calls_per_group if r.judge_calls_per_group is not None else \
        judge_calls(r.group_size, r.judge_mode, r.proposal_cached)
    rounds = judge_rounds(r.judge_mode, r.proposal_cached) if calls else 0
    generation = tokens / (m.sampler_tokens_per_s * c.sampler_gpus)
    env = episodes * r.turns * m.env_step_s / c.env_nodes
    rollout = generation + env
    n = r.tasks_per_iteration
    judge = judge_finish([rollout] * n, calls, rounds, m, c) - rollout
    streamed = judge_finish(group_ends(rollout, n, r.group_end_spread), calls, rounds, m, c)
    learner = tokens / (m.learner_tokens_per_s * c.learner_gpus)
    phases = {"generation": generation, "env": env, "judge": judge, "credit": m.credit_s, "learner": learner,
              "sync": m.sync_s, "other": m.other_s}
    after = m.credit_s + learner + m.sync_s + m.other_s
    sequential = rollout + judge + after
    streaming = streamed + after
    one_step = max(streamed, m.credit_s + learner) + m.sync_s + m.other_s
    per_call = (m.judge_prompt_tokens * m.judge_price_prompt + m.judge_completion_tokens * m.judge_price_completion) / 1e6
    return Plan(phases=phases, sequential_s=sequential, streaming_s=streaming, one_step_s=one_step,
                bottleneck=max(("generation", "env", "judge", "learner"), key=phases.__getitem__),
                judge_calls_per_step=n * calls, judge_cost_per_step=n * calls * per_call)


# -- the paper's setting ------------------------------------------------------------------

PAPER_COST_PER_100_STEPS = 1607.0
"""DRACO paper, section 4.3: the frontier judge's cost for 100 training steps."""

PAPER = (
    Measured(sampler_tokens_per_s=2500.0, learner_tokens_per_s=3000.0, env_step_s=0.3, judge_call_s=8.0,
             judge_prompt_tokens=14_000, judge_completion_tokens=1_000, judge_price_prompt=2.50,
             judge_price_completion=15.00, credit_s=0.5, sync_s=5.0),
    Cluster(sampler_gpus=4, learner_gpus=4, env_nodes=4, judge_concurrency=64),
    # turns: DRACO's mean over training, between its 18.7 start and 14.7 end (table 3)
    RunConfig(tasks_per_iteration=16, group_size=6, turns=16.7, tokens_per_turn=250.0, judge_mode="separate"),
)
"""Assumed, not reported: every throughput figure, the judge's latency, tokens and price."""


def implied_prompt_tokens(cost_per_100: float, calls_per_step: float, m: Measured) -> float:
    """Prompt tokens per call that make ``cost_per_100`` at ``m``'s price and completion tokens."""
    per_call = cost_per_100 / (100 * calls_per_step)
    return (per_call * 1e6 - m.judge_completion_tokens * m.judge_price_completion) / m.judge_price_prompt


# -- a measured run -----------------------------------------------------------------------

def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"--measured {run_dir}: no metrics.jsonl there (a run's output_dir holds one)")
    try:
        rows, _ = read_records(path)  # a killed run's torn last line is skipped
    except RecordError as exc:
        raise SystemExit(f"--measured {run_dir}: {exc}") from None
    rows = [row for row in rows if "timers/phases/generation" in row]
    if len(rows) < 2:
        raise SystemExit(f"--measured {run_dir}: {len(rows)} iteration(s) with phase timers; "
                         "the check needs 2 or more (it calibrates on some and predicts the others)")
    return rows


def _sum(rows: list[dict], key: str) -> float:
    return float(sum(row.get(key) or 0.0 for row in rows))


def calibrate(rows: list[dict]) -> Measured:
    """Per-unit figures from a run's iterations (one sampler, one learner, one env node: the
    run's runners work in parallel and its timers hold the slowest one's)."""
    tokens, steps, calls = (_sum(rows, k) for k in ("env_runners/num_generated_tokens",
                                                     "env_runners/num_env_steps_sampled", "judge/calls"))
    trained = _sum(rows, "learners/default_policy/policy_tokens") or tokens
    judge_s = _sum(rows, "timers/phases/judge")
    n = len(rows)
    return Measured(
        sampler_tokens_per_s=tokens / _sum(rows, "timers/phases/generation"),
        learner_tokens_per_s=trained / _sum(rows, "timers/phases/learner"),
        env_step_s=_sum(rows, "timers/phases/env") / steps,
        # a judge with calls: seconds per call one at a time (concurrency 1 below); a local
        # reward without calls: its seconds go into ``other``
        judge_call_s=judge_s / calls if calls else 0.0,
        judge_prompt_tokens=_sum(rows, "judge/prompt_tokens") / calls if calls else 0.0,
        judge_completion_tokens=_sum(rows, "judge/completion_tokens") / calls if calls else 0.0,
        credit_s=_sum(rows, "timers/phases/credit") / n, sync_s=_sum(rows, "timers/phases/sync") / n,
        # everything of the measured iteration time outside the timed phases (RLlib's own
        # step bookkeeping included), and a call-less reward's seconds
        other_s=(_sum(rows, "time_this_iter_s") - sum(_sum(rows, f"timers/phases/{k}") for k in PHASES)
                 + (0.0 if calls else judge_s)) / n,
    )


def row_config(row: dict) -> RunConfig:
    """An iteration's own counts as a config: one group of all its episodes (the judge's
    time is per call here, so the grouping does not change the sequential figure)."""
    episodes = row["env_runners/num_episodes"]
    steps = row["env_runners/num_env_steps_sampled"]
    return RunConfig(tasks_per_iteration=1, group_size=int(episodes), turns=steps / episodes,
                     tokens_per_turn=row["env_runners/num_generated_tokens"] / steps,
                     judge_calls_per_group=row.get("judge/calls") or 0.0, judge_mode="separate")


def check_measured(run_dir: Path) -> tuple[float, float]:
    """Calibrate on the first half of the run's iterations (after the first, which carries
    the start-up, when there are 3 or more), predict each later one from its own counts;
    returns (mean predicted, mean measured ``time_this_iter_s``)."""
    rows = read_metrics(run_dir)
    rows = rows[1:] if len(rows) >= 3 else rows
    half = max(len(rows) // 2, 1)
    fit, held = rows[:half], rows[half:]
    m = calibrate(fit)
    cluster = Cluster(judge_concurrency=1)
    predicted = [plan(m, cluster, row_config(row)).sequential_s for row in held]
    measured = [row["time_this_iter_s"] for row in held]
    print(f"calibrated on iterations {fit[0]['training_iteration']}-{fit[-1]['training_iteration']}: "
          f"sampler {m.sampler_tokens_per_s:.1f} tok/s, learner {m.learner_tokens_per_s:.1f} tok/s, "
          f"env {m.env_step_s:.3f} s/step, judge {m.judge_call_s:.3f} s/call, other {m.other_s:.2f} s")
    for row, p, t in zip(held, predicted, measured):
        print(f"  iteration {row['training_iteration']}: predicted {p:.2f} s, measured {t:.2f} s ({p / t:.2f}x)")
    return sum(predicted) / len(predicted), sum(measured) / len(measured)


# -- the command --------------------------------------------------------------------------

def describe(p: Plan) -> list[str]:
    phases = " ".join(f"{k}={v:.1f}s" for k, v in p.phases.items())
    return [f"phases: {phases}",
            f"iteration: sequential {p.sequential_s:.1f} s, streaming scoring {p.streaming_s:.1f} s, "
            f"one-step overlap {p.one_step_s:.1f} s; bottleneck: {p.bottleneck}",
            f"judge: {p.judge_calls_per_step:.0f} calls/step, ${p.judge_cost_per_step:.2f}/step, "
            f"${p.judge_cost_per_100_steps:,.0f} per 100 steps"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", type=Path, metavar="RUN_DIR", help="check the model against this run's metrics.jsonl")
    ap.add_argument("--tasks", type=int)
    ap.add_argument("--group-size", type=int)
    ap.add_argument("--mode", choices=("separate", "fused", "none"))
    ap.add_argument("--proposal-cached", action="store_true")
    ap.add_argument("--sampler-gpus", type=int)
    ap.add_argument("--learner-gpus", type=int)
    ap.add_argument("--env-nodes", type=int)
    ap.add_argument("--judge-concurrency", type=int)
    ap.add_argument("--judge-rpm", type=float)
    args = ap.parse_args(argv)
    if args.measured:
        predicted, measured = check_measured(args.measured)
        print(f"measured run {args.measured}: predicted / measured iteration time = {predicted:.2f} / {measured:.2f} s "
              f"= {predicted / measured:.2f} (goal within 0.75-1.25)")
        return 0
    m, c, r = PAPER
    c = replace(c, **{k: v for k, v in {"sampler_gpus": args.sampler_gpus, "learner_gpus": args.learner_gpus,
                                        "env_nodes": args.env_nodes, "judge_concurrency": args.judge_concurrency,
                                        "judge_rpm": args.judge_rpm}.items() if v is not None})
    r = replace(r, **{k: v for k, v in {"tasks_per_iteration": args.tasks, "group_size": args.group_size,
                                        "judge_mode": args.mode}.items() if v is not None},
                proposal_cached=args.proposal_cached)
    p = plan(m, c, r)
    print(f"config: {r.tasks_per_iteration} tasks x G={r.group_size}, {r.turns} turns x {r.tokens_per_turn:.0f} tokens, "
          f"judge {r.judge_mode} ({p.judge_calls_per_step / r.tasks_per_iteration:.0f} calls/group); cluster: {c}")
    print(f"assumed (not in the paper): {m}")
    for line in describe(p):
        print(line)
    base = plan(m, c, PAPER[2])
    print(f"the paper's bill: ${PAPER_COST_PER_100_STEPS:,.0f} per 100 steps implies "
          f"{implied_prompt_tokens(PAPER_COST_PER_100_STEPS, base.judge_calls_per_step, m):,.0f} prompt tokens "
          f"per call at the assumed price and {m.judge_completion_tokens:.0f} completion tokens")
    print(f"judge cost per 100 steps, plan / paper = {p.judge_cost_per_100_steps:,.0f} / "
          f"{PAPER_COST_PER_100_STEPS:,.0f} = {p.judge_cost_per_100_steps / PAPER_COST_PER_100_STEPS:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
