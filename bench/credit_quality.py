"""Credit-quality benchmark: which credit rule pushes the steps that matter, and what it buys.

Run it with ``draco-gym bench credit`` (or ``python bench/credit_quality.py``; the module is
installed as ``draco_gym.bench.credit_quality`` so that the command finds it anywhere). Pure numpy and
the library's own credit functions (draco_credit, trace_credit, trca_credit, ProVer's
eligibility, segment validation and bonus); under two minutes on one CPU core.

The synthetic task (one per seed) is a T-step episode (T = 16) with A = 3 actions per step.
A few steps are decisions whose outcome is known: at each of 3 *pivots* one action is right
and the others wrong, at each of 2 *hazards* one action is harmful and the others fine; the
remaining steps are filler that changes nothing. The episode succeeds when every decision is
handled well. Step lengths in tokens vary (20..80), so token weighting matters.

Every rule sees the same trajectory reward: a simulated DRACO judge scores one criterion per
decision (PASS if handled well), is lenient with probability q (a FAIL turns into a PASS) and
cites the wrong step with probability p (a uniformly drawn other step); discriminative
dropout and R_i = (p_i - f_i)/(p_i + f_i) are DRACO's stages 6 and 7, and A_i is GRPO's group advantage.
On top of it:

  uniform  a_j = A_i
  draco    draco_credit from the judge's (noisy) citations
  trace    trace_credit with l_k from a frozen reference (the initial policy's log-probability
           of success after the prefix, floored at 1e-3, plus N(0, 0.5^2) model noise), A_out the
           group advantage of success (the paper's verifiable outcome)
  prover   the ProVer rule: eligibility, a judge-proposed segment of the shortest success
           (a true decision inside it with probability 1 - p), K = 8 continuations of the
           current policy from each restored boundary; continuation episodes count as episodes;
           the base advantage is the group's mean-centred success, R_i - mean R (the paper's)
  trca     trca_credit from a rule rubric that sees transitions, not outcomes: Execution items
           fire on a decision handled well (0.8) or badly (0.4), Invalidity on a bad one (0.5),
           Evidence on filler (0.3); as the paper, A_i is the outcome's group advantage (0 in
           a group without a success) and the outcome arrives as r_env at the last step

The policy is tabular softmax, one logit row per step, trained by the token-mean policy
gradient sum_ij n_ij a_ij grad log pi(a_ij) / sum_ij n_ij, groups of G = 6, 4 groups per update.

Reported per rule and p:
  precision   the share of a trajectory's push sum_j n_j |a_j| that lands on a truly
              responsible step in the right direction (pushed up on a decision handled well,
              down on one handled badly), averaged over trajectories and over training
  episodes    episodes until the exact success probability of the policy reaches 90%
              (censored at the budget; the count of seeds that got there is shown)
  push        the mean token-weighted |a_j| against uniform's. One learning rate serves all
              rules, so a rule that adds to A_i (TRACE, ProVer, TRCA) also takes larger steps;
              ``--match-push`` rescales every group to uniform's total push to separate where
              a rule pushes from how hard (DRACO conserves it by construction).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from draco_gym.algos.credit import draco_credit, group_advantages
from draco_gym.algos.credit.prover import (apply_segment_bonus, prover_base_advantages, prover_delta, prover_eligible,
                                           validate_segment)
from draco_gym.algos.credit.trace import TraceOptions, trace_credit
from draco_gym.algos.credit.trca import RuleFamily, outcome_advantages, trca_credit

RULES: tuple[str, ...] = ("uniform", "draco", "trace", "prover", "trca")


@dataclass(frozen=True)
class SimConfig:
    n_steps: int = 16
    n_actions: int = 3
    n_pivots: int = 3
    n_hazards: int = 2
    group_size: int = 6
    groups_per_update: int = 4
    lr: float = 4.0
    max_episodes: int = 6000
    target: float = 0.9
    min_tokens: int = 20
    max_tokens: int = 80
    p: float = 0.0  # judge cites a wrong step
    q: float = 0.1  # judge passes a failed decision
    ref_noise: float = 0.5  # TRACE: std of the reference model's error on l_k
    ref_floor: float = 1e-3  # TRACE: the reference never gives the answer probability 0
    prover_k: int = 8
    prover_max_len: int = 4
    rule_exec_good: float = 0.8
    rule_exec_bad: float = 0.4
    rule_invalid_bad: float = 0.5
    rule_evidence_filler: float = 0.3
    match_push: bool = False  # rescale each group's step advantages to uniform credit's total push

    def __post_init__(self) -> None:
        if self.n_pivots + self.n_hazards > self.n_steps - 1:
            raise ValueError("n_pivots + n_hazards must leave the last step free (decisions are non-terminal)")
        for name in ("p", "q", "rule_exec_good", "rule_exec_bad", "rule_invalid_bad", "rule_evidence_filler"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.n_actions < 2 or self.group_size < 2:
            raise ValueError("n_actions and group_size must be >= 2")


class SyntheticTask:
    """Decision positions (0-based steps) and what handles each well."""

    def __init__(self, cfg: SimConfig, rng: np.random.Generator) -> None:
        n_dec = cfg.n_pivots + cfg.n_hazards
        self.pos = np.sort(rng.choice(cfg.n_steps - 1, size=n_dec, replace=False))
        kind = np.array([True] * cfg.n_pivots + [False] * cfg.n_hazards)
        self.is_pivot = kind[rng.permutation(n_dec)]
        self.key_action = rng.integers(cfg.n_actions, size=n_dec)  # right action (pivot) / harmful (hazard)
        # P(handled well) under the uniform initial policy: what the frozen reference believes
        self.p_init = np.where(self.is_pivot, 1.0 / cfg.n_actions, 1.0 - 1.0 / cfg.n_actions)

    def good(self, actions: np.ndarray) -> np.ndarray:
        """(N, D) whether each decision was handled well."""
        a = actions[:, self.pos]
        return np.where(self.is_pivot, a == self.key_action, a != self.key_action)

    def success_prob(self, probs: np.ndarray) -> float:
        """Exact P(success) of a tabular policy (probs: T x A)."""
        p_key = probs[self.pos, self.key_action]
        return float(np.prod(np.where(self.is_pivot, p_key, 1.0 - p_key)))

    def continue_success(self, probs: np.ndarray, after: int, k: int, rng: np.random.Generator) -> np.ndarray:
        """k outcomes of the policy finishing a successful prefix of ``after`` steps."""
        rest = self.pos >= after
        p_key = probs[self.pos[rest], self.key_action[rest]]
        p_good = np.where(self.is_pivot[rest], p_key, 1.0 - p_key)
        return (rng.random((k, int(rest.sum()))) < p_good).all(axis=1).astype(float)


def sample(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    cdf = np.cumsum(probs, axis=1)
    u = rng.random((n, probs.shape[0], 1))
    return np.minimum((u > cdf[None]).sum(axis=2), probs.shape[1] - 1)


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


# -- one group: the judge, then each rule ---------------------------------------------------


def judge_group(task: SyntheticTask, good: np.ndarray, cfg: SimConfig, rng: np.random.Generator):
    """Rewards R_i and per-step (passes, fails) counts of the surviving verdicts."""
    n, d = good.shape
    verdict_pass = good | (rng.random((n, d)) < cfg.q)  # leniency: some FAILs become PASSes
    survives = (~verdict_pass).any(axis=0)  # discriminative dropout: someone failed it
    cited = np.broadcast_to(task.pos, (n, d)).copy()
    wrong = rng.random((n, d)) < cfg.p
    shift = rng.integers(1, cfg.n_steps, size=(n, d))  # uniform over the other T-1 steps
    cited[wrong] = (cited[wrong] + shift[wrong]) % cfg.n_steps
    passes = np.zeros((n, cfg.n_steps), dtype=int)
    fails = np.zeros((n, cfg.n_steps), dtype=int)
    rows = np.arange(n)[:, None].repeat(d, axis=1)
    np.add.at(passes, (rows[:, survives], cited[:, survives]), verdict_pass[:, survives])
    np.add.at(fails, (rows[:, survives], cited[:, survives]), ~verdict_pass[:, survives])
    n_pass = (verdict_pass & survives).sum(axis=1)
    n_fail = (~verdict_pass & survives).sum(axis=1)
    total = n_pass + n_fail
    rewards = np.where(total > 0, (n_pass - n_fail) / np.maximum(total, 1), 0.0)
    return rewards, passes, fails


def reference_logprobs(task: SyntheticTask, good: np.ndarray, cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """(N, T+1) l_k: the frozen initial policy's log-probability of success after k steps."""
    n = good.shape[0]
    out = np.empty((n, cfg.n_steps + 1))
    for k in range(cfg.n_steps + 1):
        done = task.pos < k
        alive = good[:, done].all(axis=1)
        p = np.where(alive, np.prod(task.p_init[~done]), 0.0)
        out[:, k] = np.log(np.maximum(p, cfg.ref_floor))
    out += cfg.ref_noise * rng.standard_normal(out.shape)
    return np.minimum(out, 0.0)


def trca_families(cfg: SimConfig) -> tuple[RuleFamily, ...]:
    n_dec = cfg.n_pivots + cfg.n_hazards
    return (
        RuleFamily("evidence", +1, 1.0, ("e0", "e1", "e2")),
        RuleFamily("execution", +1, 1.0, tuple(f"x{d}" for d in range(n_dec))),
        RuleFamily("invalidity", -1, 1.0, ("error",)),
    )


def rule_hits(task: SyntheticTask, good: np.ndarray, cfg: SimConfig, rng: np.random.Generator) -> list[list[dict]]:
    n = good.shape[0]
    hits = [[{} for _ in range(cfg.n_steps)] for _ in range(n)]
    u = rng.random((n, cfg.n_steps, 3))
    decision_at = {int(p): d for d, p in enumerate(task.pos)}
    for i in range(n):
        for t in range(cfg.n_steps):
            d = decision_at.get(t)
            if d is None:
                if u[i, t, 0] < cfg.rule_evidence_filler:
                    hits[i][t] = {"evidence": [f"e{int(u[i, t, 1] * 3)}"]}
                continue
            ok = good[i, d]
            step = {}
            if u[i, t, 0] < (cfg.rule_exec_good if ok else cfg.rule_exec_bad):
                step["execution"] = [f"x{d}"]
            if not ok and u[i, t, 2] < cfg.rule_invalid_bad:
                step["invalidity"] = ["error"]
            hits[i][t] = step
    return hits


def group_credit(rule: str, task: SyntheticTask, probs: np.ndarray, actions: np.ndarray, tokens: np.ndarray,
                 cfg: SimConfig, rng: np.random.Generator) -> tuple[np.ndarray, int, np.ndarray]:
    """(N, T) step advantages of one group under ``rule``, the extra episodes it ran, and
    the group advantages A_i."""
    good = task.good(actions)
    rewards, passes, fails = judge_group(task, good, cfg, rng)
    adv = group_advantages(rewards.tolist())
    T = actions.shape[1]
    extra = 0
    success = good.all(axis=1).astype(float)
    if rule == "uniform":
        out = np.repeat(np.asarray(adv)[:, None], T, axis=1)
    elif rule == "draco":
        out = np.array([draco_credit(a, tokens[i].tolist(), passes[i].tolist(), fails[i].tolist()) for i, a in enumerate(adv)])
    elif rule == "trace":  # A_out: the outcome's group advantage, as the paper
        logp = reference_logprobs(task, good, cfg, rng)
        a_out = group_advantages(success.tolist())
        out = np.array([trace_credit(logp[i].tolist(), a, TraceOptions()) for i, a in enumerate(a_out)])
    elif rule == "trca":  # the paper's: A_i from the outcome (0 without a success), r_env = outcome at the end
        env = np.zeros((len(success), T))
        env[:, -1] = success
        out = np.array(trca_credit(rule_hits(task, good, cfg, rng), outcome_advantages(success.tolist()),
                                   families=trca_families(cfg), env_rewards=env.tolist()))
    elif rule == "prover":  # the mean-centred success, as the paper
        out = np.repeat(np.asarray(prover_base_advantages(success.tolist()))[:, None], T, axis=1)
        if prover_eligible(success.tolist()):
            star = int(np.flatnonzero(success)[0])  # all rollouts have T steps: the first success
            length = int(rng.integers(1, cfg.prover_max_len + 1))
            if rng.random() < cfg.p:  # the judge points at an arbitrary stretch
                start = int(rng.integers(1, T - length + 1))
            else:  # a stretch holding a true decision
                pos = int(rng.choice(task.pos)) + 1
                start = int(rng.integers(max(1, pos - length + 1), min(pos, T - length) + 1))
            seg = validate_segment(start, start + length - 1, T, cfg.prover_max_len)
            pre = task.continue_success(probs, seg.start - 1, cfg.prover_k, rng)
            post = task.continue_success(probs, seg.end, cfg.prover_k, rng)
            extra = 2 * cfg.prover_k
            out[star] = apply_segment_bonus(out[star].tolist(), seg, prover_delta(pre.tolist(), post.tolist()))
    else:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return out, extra, np.asarray(adv)


def attribution_precision(task: SyntheticTask, actions: np.ndarray, tokens: np.ndarray, step_adv: np.ndarray) -> list[float]:
    """Per trajectory with any push: share of sum_j n_j |a_j| pushed the right way on a
    decision step."""
    good = task.good(actions)
    push = tokens * np.abs(step_adv)
    right = np.zeros_like(push)
    sign = np.sign(step_adv[:, task.pos])
    right[:, task.pos] = push[:, task.pos] * (np.where(good, sign > 0, sign < 0))
    total = push.sum(axis=1)
    keep = total > 1e-12
    return (right.sum(axis=1)[keep] / total[keep]).tolist()


def match_uniform_push(step_adv: np.ndarray, tokens: np.ndarray, advantages: np.ndarray) -> np.ndarray:
    """Scale a group's step advantages so that sum_ij n_ij |a_ij| equals uniform credit's
    sum_i |A_i| N_i: what is left of a rule's speed-up is where it pushes, not how hard.
    (DRACO conserves the push already; TRACE, ProVer and TRCA add to it.)"""
    rule_push = float((tokens * np.abs(step_adv)).sum())
    if rule_push <= 1e-12:
        return step_adv
    return step_adv * (float((np.abs(advantages) * tokens.sum(axis=1)).sum()) / rule_push)


# -- one training run ------------------------------------------------------------------------


@dataclass
class RunResult:
    rule: str
    p: float
    q: float
    seed: int
    episodes: int  # episodes until the target (or the budget, when not reached)
    reached: bool
    precision: float
    push: float  # mean token-weighted |a_j| per trajectory: how hard the rule pushes overall
    final_success: float


def train(rule: str, cfg: SimConfig, seed: int) -> RunResult:
    task = SyntheticTask(cfg, np.random.default_rng([seed, 0]))
    rng = np.random.default_rng([seed, 1, RULES.index(rule)])
    theta = np.zeros((cfg.n_steps, cfg.n_actions))
    eye = np.eye(cfg.n_actions)
    episodes, shares, pushes = 0, [], []
    success = task.success_prob(softmax(theta))
    while success < cfg.target and episodes < cfg.max_episodes:
        probs = softmax(theta)
        grad = np.zeros_like(theta)
        total_tokens = 0
        for _ in range(cfg.groups_per_update):
            actions = sample(probs, cfg.group_size, rng)
            tokens = rng.integers(cfg.min_tokens, cfg.max_tokens + 1, size=actions.shape)
            step_adv, extra, adv = group_credit(rule, task, probs, actions, tokens, cfg, rng)
            if cfg.match_push:
                step_adv = match_uniform_push(step_adv, tokens, adv)
            episodes += cfg.group_size + extra
            shares += attribution_precision(task, actions, tokens, step_adv)
            pushes += ((tokens * np.abs(step_adv)).sum(axis=1) / tokens.sum(axis=1)).tolist()
            coef = tokens * step_adv  # n_ij a_ij
            grad += (coef[..., None] * (eye[actions] - probs[None])).sum(axis=0)
            total_tokens += int(tokens.sum())
        theta += cfg.lr * grad / total_tokens
        success = task.success_prob(softmax(theta))
    return RunResult(rule, cfg.p, cfg.q, seed, min(episodes, cfg.max_episodes) if success < cfg.target else episodes,
                     success >= cfg.target, float(np.mean(shares)) if shares else float("nan"),
                     float(np.mean(pushes)) if pushes else float("nan"), success)


# -- the report ------------------------------------------------------------------------------


def summarise(results: list[RunResult], rules: tuple[str, ...]) -> list[dict]:
    """One row per (q, p, rule): means and spreads over seeds, ratios against uniform."""
    rows = []
    for q, p in sorted({(r.q, r.p) for r in results}):
        base = None
        for rule in rules:
            rs = [r for r in results if r.rule == rule and r.p == p and r.q == q]
            episodes = np.array([r.episodes for r in rs], dtype=float)
            precision = np.array([r.precision for r in rs])
            row = {
                "q": q, "p": p, "rule": rule, "seeds": len(rs), "reached": sum(r.reached for r in rs),
                "precision_mean": float(precision.mean()), "precision_std": float(precision.std()),
                "episodes_mean": float(episodes.mean()), "episodes_std": float(episodes.std()),
                "push_mean": float(np.mean([r.push for r in rs])),
            }
            if rule == "uniform":
                base = row
            if base is not None:
                row["precision_x_uniform"] = row["precision_mean"] / base["precision_mean"]
                row["speedup_x_uniform"] = base["episodes_mean"] / row["episodes_mean"]
                row["push_x_uniform"] = row["push_mean"] / base["push_mean"]
            rows.append(row)
    return rows


def format_table(rows: list[dict], budget: int) -> str:
    head = (f"{'q':>4} {'p':>4}  {'rule':<8} {'precision':>15} {'x unif':>7} "
            f"{'episodes to 90%':>19} {'reached':>8} {'speed-up':>9} {'push':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['q']:>4.1f} {r['p']:>4.1f}  {r['rule']:<8} {r['precision_mean']:>7.3f} ± {r['precision_std']:<5.3f} "
            f"{r.get('precision_x_uniform', float('nan')):>7.2f} "
            f"{r['episodes_mean']:>9.0f} ± {r['episodes_std']:<7.0f} {r['reached']:>4}/{r['seeds']:<3} "
            f"{r.get('speedup_x_uniform', float('nan')):>8.2f}x {r.get('push_x_uniform', float('nan')):>7.2f}"
        )
    lines.append(f"(mean ± std over seeds; a seed that missed 90% counts as the budget, {budget} episodes; "
                 "speed-up = uniform's mean episodes / the rule's;\n push = the rule's mean token-weighted |a_j| / "
                 "uniform's: above 1 the rule also pushes harder overall, which one learning rate rewards)")
    return "\n".join(lines)


def plot(rows: list[dict], rules: tuple[str, ...], path: Path, cfg: SimConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qs = sorted({r["q"] for r in rows})
    fig, axes = plt.subplots(len(qs), 2, figsize=(11, 4.2 * len(qs)), squeeze=False)
    for (ax_prec, ax_eps), q in zip(axes, qs):
        for rule in rules:
            rs = [r for r in rows if r["rule"] == rule and r["q"] == q]
            ps = [r["p"] for r in rs]
            ax_prec.errorbar(ps, [r["precision_mean"] for r in rs], yerr=[r["precision_std"] for r in rs],
                             marker="o", capsize=3, label=rule)
            ax_eps.errorbar(ps, [r["episodes_mean"] for r in rs], yerr=[r["episodes_std"] for r in rs],
                            marker="o", capsize=3, label=rule)
        ax_prec.set(xlabel="judge citation noise p", ylabel="attribution precision",
                    title=f"Push on the responsible steps (leniency q = {q})")
        ax_eps.set(xlabel="judge citation noise p", ylabel="episodes to 90% success",
                   title=f"Sample cost (leniency q = {q}; dotted: budget)")
        ax_eps.axhline(cfg.max_episodes, color="grey", lw=0.8, ls=":")
        ax_prec.grid(alpha=0.3)
        ax_eps.grid(alpha=0.3)
        ax_eps.legend(fontsize=8, loc="upper left", ncol=len(rules))
    fig.suptitle(f"Credit quality: T = {cfg.n_steps} steps, {cfg.n_pivots} pivots + {cfg.n_hazards} hazards, "
                 f"G = {cfg.group_size}, mean ± std over seeds" + (", push matched to uniform" if cfg.match_push else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_benchmark(ps: list[float], seeds: int, rules: tuple[str, ...] = RULES, cfg: SimConfig = SimConfig(),
                  out_dir: Path | None = None, qs: list[float] | None = None, log=print) -> list[dict]:
    """Train every rule on ``seeds`` tasks for each (q, p); print progress, the table, and
    write the PNG and JSON to ``out_dir``."""
    qs = [cfg.q] if qs is None else qs
    results: list[RunResult] = []
    start = time.perf_counter()
    n_total, done = len(qs) * len(ps) * len(rules) * seeds, 0
    for q in qs:
        for p in ps:
            for rule in rules:
                rs = [train(rule, replace(cfg, p=p, q=q), seed) for seed in range(seeds)]
                results += rs
                done += seeds
                log(f"[{done:>4}/{n_total}] q={q:.1f} p={p:.1f} {rule:<8} "
                    f"episodes {np.mean([r.episodes for r in rs]):6.0f}  precision {np.mean([r.precision for r in rs]):.3f}"
                    f"  ({time.perf_counter() - start:5.1f} s)")
    rows = summarise(results, rules)
    log("")
    if cfg.match_push:
        log("every rule's step advantages rescaled per group to uniform's total push (--match-push)")
    log(format_table(rows, cfg.max_episodes))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "credit_quality.json").write_text(json.dumps(
            {"config": asdict(cfg), "ps": ps, "qs": qs, "seeds": seeds, "rows": rows,
             "runs": [asdict(r) for r in results]}, indent=1))
        plot(rows, rules, out_dir / "credit_quality.png", cfg)
        log(f"\nwrote {out_dir / 'credit_quality.png'} and {out_dir / 'credit_quality.json'} "
            f"({time.perf_counter() - start:.0f} s in all)")
    return rows


# -- command line (draco-gym bench credit) --------------------------------------------------


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected probabilities in [0, 1], got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=["credit"], help="which benchmark (credit: credit-rule quality)")
    parser.add_argument("--p", type=_floats, default=[0.0, 0.2, 0.4], help="judge citation-noise levels (default 0,0.2,0.4)")
    parser.add_argument("--q", type=_floats, default=[SimConfig.q], help="judge leniency levels (default 0.1)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell (default %(default)s)")
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated rules (default all)")
    parser.add_argument("--budget", type=int, default=SimConfig.max_episodes, help="episode budget per run")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="where the PNG and JSON go")
    parser.add_argument("--match-push", action="store_true",
                        help="rescale every rule's step advantages to uniform's total push per group")


def run(args: argparse.Namespace) -> int:
    rules = tuple(r.strip() for r in args.rules.split(",") if r.strip())
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        print(f"--rules: unknown {unknown}; known: {list(RULES)}", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.budget < 1:
        print("--seeds and --budget must be >= 1", file=sys.stderr)
        return 2
    cfg = SimConfig(max_episodes=args.budget, match_push=args.match_push)
    run_benchmark(args.p, args.seeds, rules, cfg, args.out, qs=args.q)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="credit_quality", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(["credit", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
