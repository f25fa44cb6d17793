"""ProVer: credit a pivotal segment by how much it raises the policy's chance of success.

For a group where the policy sometimes succeeds but mostly fails, the best evidence of what
made the difference is counterfactual: put the agent back just before and just after the
step segment a judge calls pivotal, let the current policy finish from both points, and
compare:

    eligible    0 < success rate of the group < 0.5     (rare successes carry the news)
    tau*        the shortest successful rollout
    [s, e]      a judge-proposed segment of tau*: 1 <= s <= e < T, e - s + 1 <= 4
                (at most four action turns, never the terminal turn)
    R_pre       K = 8 outcomes of the current policy continuing from after step s-1
    R_post      K = 8 outcomes continuing from after step e
    Delta       = mean(R_post) - mean(R_pre)
    A_i         = R_i - mean_g R          the group's mean-centred outcome, R_i = success
    a_j         = A_i + lambda * Delta    for j in [s, e] of tau*, if Delta > 0   (lambda = 1)
    a_j         = A_i                     everywhere else

Only the positive half is used: a segment that did not help is left to the group advantage
rather than punished on a K-sample estimate. A_i is centred, not divided by the group's std:
at G = 8 with one success the winner's A_i is 0.875, where GRPO's standardised advantage
would be 2.646 and make the same bonus about 3x weaker beside it (``base_scale=
"standardised"`` gives that reading). R_i is read from ``metrics["success"]``; the shipped
config uses the ``outcome`` reward, and a config pairing prover with another reward is
refused (``algos/config.py``) unless ``base_advantage: reward`` says the base is the run's
reward on purpose.

Whose is each value (paper: the ProVer paper, as DESIGN.md reads it; ours: this project's):

    eligibility 0 < success rate < 0.5, strictly                            paper
    tau*, the shortest successful rollout (the first one on a tie)          paper (tie: ours)
    a segment of action turns, never the terminal turn                      paper
    at most 4 action turns                                                  ours (the paper
        gives no length; ``max_segment_len``)
    the judge sees tau* and the group's failed rollouts                     paper
    K continuations from each boundary, with the current policy             paper
    K = 8                                                                   ours (the paper
        gives no K)
    Delta = mean(R_post) - mean(R_pre); bonus lambda * Delta only if > 0    paper
    lambda = 1                                                              ours (the paper
        gives no lambda)
    A_i from binary success (``metrics["success"]``)                        paper
    A_i = R_i - mean R, not divided by the std                              paper, as a
        write-up of it reads it ("the group's mean-centred outcome reward as the advantage");
        ``base_scale="standardised"`` (GRPO's (R - mean) / std) is an option
    state restored by replaying the episode's messages                      ours
    judge settings: temperature 0.1, 256 answer tokens, 2 repairs, views    ours
    an episode cut by the token budget or an env crash counts as failed     ours
    a turn without code is no credit step (a bonus there becomes A_i)       ours The state at a boundary is rebuilt by replaying
the episode's messages into a fresh episode (``CodeStepEnv.restore``), so only environments
with ``can_restore`` qualify, and the group needs an outcome signal (``metrics["success"]``).

Where a trainer plugs in: ``ProVerRule`` takes ``continue_fn(task_id, prefix_messages, k)
-> list[float]``, k outcomes of the *current* policy run from the restored prefix. The RLlib
trainer supplies ``env_runner_continuations`` (``GRPO.credit_options``), which runs
``LLMEnvRunner.continue_from`` on one of its env runners; ``EnvContinuations`` does the same
around any ``policy(task, history) -> message``, for other training loops and for tests.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

from draco_gym.algos.credit.core import BaseAdvantage, CreditRule, group_advantages, outcome_number
from draco_gym.algos.credit.registry import credit_rule
from draco_gym.algos.credit.spec import Need, RuleOptions, option
from draco_gym.reward import stages
from draco_gym.reward.base import run_sync
from draco_gym.reward.judge_client import JudgeClient, StageFailed, UsageMeter, as_client
from draco_gym.reward.stages import Segment, View
from draco_gym.reward.stages import check_segment as validate_segment
from draco_gym.types import GroupScore, Termination, Trajectory

__all__ = [
    "EnvContinuations",
    "JudgeSegmentProposer",
    "ProVerOptions",
    "ProVerRule",
    "Segment",
    "apply_segment_bonus",
    "env_runner_continuations",
    "prover_base_advantages",
    "prover_delta",
    "prover_eligible",
    "shortest_success",
    "validate_segment",
]

log = logging.getLogger(__name__)

ContinueFn = Callable[[str, list[str], int], Sequence[float]]
Proposer = Callable[[Trajectory, int, Sequence[Trajectory]], tuple[Segment | None, str]]


# -- the options ----------------------------------------------------------------------------


class ProVerOptions(RuleOptions):
    """ProVer's options (``credit.options`` of a run config), each labelled with whose value its
    default is."""

    K: int = option(8, "ours", "continuations from each boundary (the paper gives no K)", ge=1, strict=True)
    lam: float = option(1.0, "ours", "the bonus lam * Delta on the segment when Delta > 0 (the paper gives no "
                                     "lambda)", ge=0, allow_inf_nan=False)
    max_segment_len: int = option(4, "ours", "the segment's most action turns; never the terminal turn (the paper "
                                             "gives no length)", ge=1, strict=True)
    base_advantage: BaseAdvantage = option(
        "outcome", "paper", "A_i from binary success (reward: the run's reward's, on purpose)")
    base_scale: Literal["centred", "standardised"] = option(
        "centred", "paper", "A_i = R_i - mean R, as a write-up of the paper reads it (standardised: GRPO's "
                            "(R - mean) / std)")
    outcome_key: str = option("success", "ours", "the Trajectory.metrics entry that means success (eligibility, "
                                                 "continuations)")
    judge: Any = option(None, "ours", "the judge proposing the segment: a registered judge's name (with "
                                      "judge_options) or a reward-layer Judge")
    judge_options: dict[str, Any] | None = option(None, "ours", "the named judge's options")
    max_repairs: int = option(2, "ours", "re-asks of the judge after an invalid segment", ge=0, strict=True)


DEFAULTS = ProVerOptions()


def prover_needs(options: ProVerOptions) -> set[Need]:
    """Continuations of the current policy and the outcome; the base from the outcome reward
    unless ``base_advantage: reward``."""
    base = Need.OUTCOME_REWARD if options.base_advantage == "outcome" else Need.REWARD_ADVANTAGE
    return {Need.CONTINUATIONS, Need.OUTCOME, base}


# -- the rule's arithmetic -----------------------------------------------------------------


def prover_eligible(successes: Sequence[float], low: float = 0.0, high: float = 0.5) -> bool:
    """low < success rate < high, strictly (default 0 < rate < 0.5)."""
    if not successes:
        return False
    rate = sum(float(s) for s in successes) / len(successes)
    return low < rate < high


def shortest_success(trajectories: Sequence[Trajectory], successes: Sequence[float]) -> int:
    """Index of the successful rollout with the fewest steps (the first one on a tie)."""
    winners = [i for i, s in enumerate(successes) if float(s) > 0]
    if not winners:
        raise ValueError("no successful rollout in the group")
    return min(winners, key=lambda i: (len(trajectories[i].steps), i))


BASE_SCALES = ("centred", "standardised")
"""ProVer's base advantage from the group's outcomes: "centred", R_i - mean R (the paper's),
or "standardised", GRPO's (R_i - mean R) / (std R + eps)."""


def prover_base_advantages(outcomes: Sequence[float], scale: str = "centred") -> list[float]:
    """A_i for every rollout of the group: R_i - mean R, or with ``scale="standardised"``
    GRPO's group advantage. G = 8 with one success: 0.875 (centred), 2.646 (standardised)."""
    if scale not in BASE_SCALES:
        raise ValueError(f"base_scale must be one of {BASE_SCALES}, got {scale!r}")
    values = [float(o) for o in outcomes]
    if scale == "standardised":
        return group_advantages(values)
    mean = sum(values) / len(values) if values else 0.0
    return [v - mean for v in values]


def prover_delta(pre_outcomes: Sequence[float], post_outcomes: Sequence[float]) -> float:
    """Delta = mean(R_post) - mean(R_pre)."""
    if not pre_outcomes or not post_outcomes:
        raise ValueError("pre_outcomes and post_outcomes must each hold at least one continuation outcome")
    for name, xs in (("pre_outcomes", pre_outcomes), ("post_outcomes", post_outcomes)):
        for k, x in enumerate(xs):
            if not math.isfinite(float(x)):
                raise ValueError(f"{name}[{k}] must be finite, got {x!r}")
    return sum(map(float, post_outcomes)) / len(post_outcomes) - sum(map(float, pre_outcomes)) / len(pre_outcomes)


def apply_segment_bonus(step_advantages: Sequence[float], segment: Segment, delta: float,
                        lam: float = DEFAULTS.lam) -> list[float]:
    """a_j + lambda * Delta on the segment's steps when Delta > 0; unchanged otherwise."""
    out = [float(a) for a in step_advantages]
    if not 1 <= segment.start <= segment.end <= len(out):
        raise ValueError(f"segment {segment.start}..{segment.end} lies outside the trajectory's {len(out)} steps")
    if delta > 0:
        for j in range(segment.start - 1, segment.end):
            out[j] += lam * delta
    return out


# -- proposing the segment -----------------------------------------------------------------


class JudgeSegmentProposer:
    """Asks a judge for the pivotal segment through the reward layer's ``segment`` stage
    (its judge client shows the judge an invalid answer's errors and asks again, at most
    ``max_repairs`` times). Returns (segment or None, reason); ``usage`` adds up calls and
    billed tokens.

    ``judge`` is a reward-layer ``Judge``, a ``JudgeClient``, a config dict
    (``{"name": "openai", ...}``) or any function ``judge(messages) -> text`` (sync or async).
    """

    def __init__(self, judge: Any, *, max_repairs: int = DEFAULTS.max_repairs, max_step_chars: int = 1500,
                 temperature: float = 0.1, max_tokens: int = 256, retries: int = 1) -> None:
        if isinstance(max_repairs, bool) or not isinstance(max_repairs, int) or max_repairs < 0:
            raise ValueError(f"max_repairs must be an integer >= 0, got {max_repairs!r}")
        settings = {} if isinstance(judge, JudgeClient) else {
            "max_repairs": max_repairs, "temperature": temperature, "max_tokens": max_tokens, "retries": retries}
        self.client = as_client(judge, **settings)
        self.view = View(max_step_chars, max_step_chars, 60_000)
        self.usage: Counter[str] = Counter()

    def __call__(self, traj: Trajectory, max_len: int,
                 failures: Sequence[Trajectory] = ()) -> tuple[Segment | None, str]:
        meter = UsageMeter()
        try:
            segment = run_sync(stages.segment(self.client, meter, traj, max_len=max_len, view=self.view,
                                              failures=failures))
            reason = "repaired" if meter.stages["segment"].calls > 1 else "ok"
        except StageFailed as exc:
            segment, reason = None, exc.reason
        used = meter.stages.get("segment")
        if used is not None:
            self.usage.update(calls=used.calls, prompt_tokens=used.prompt_tokens,
                              completion_tokens=used.completion_tokens)
        return segment, reason


# -- the rule ------------------------------------------------------------------------------


UNFINISHED = (Termination.LENGTH, Termination.ENV_ERROR)
"""Endings imposed from outside the environment (token budget, a crash): the environment
never evaluated the episode, which did not succeed."""


def _outcome(traj: Trajectory, key: str, i: int) -> float:
    if key not in traj.metrics:
        if traj.termination in UNFINISHED:
            return 0.0
        raise ValueError(f"trajectories[{i}].metrics[{key!r}] is missing; ProVer needs an outcome signal")
    return outcome_number(traj, key, i)


class ProVerRule:
    """The ``prover`` credit rule (see the module docstring) with ``options``.

    ``continue_fn(task_id, prefix_messages, k)`` returns k outcomes of the current policy from
    the restored prefix; ``propose(trajectory, max_len, failures)`` returns (Segment or None,
    reason) for the shortest success given the group's failed rollouts, e.g. a
    ``JudgeSegmentProposer``. ``stats`` counts what happened to each group, so an inert rule
    is visible in the metrics rather than silent.

    The base A_i comes from the outcomes (``base_advantage="outcome"``, ``base_scale``
    "centred": R_i - mean R) or, with ``base_advantage="reward"``, from the run's reward
    (centred: R_i - mean R of ``group.rewards``; standardised: the advantages handed in).
    """

    def __init__(self, continue_fn: ContinueFn, propose: Proposer, options: ProVerOptions = DEFAULTS) -> None:
        if not callable(continue_fn):
            raise ValueError("continue_fn must be callable: (task_id, prefix_messages, k) -> outcomes")
        if not callable(propose):
            raise ValueError("propose must be callable: (trajectory, max_len, failures) -> (segment, reason)")
        self.continue_fn = continue_fn
        self.propose = propose
        self.options = options
        self.K = options.K
        self.lam = options.lam
        self.max_segment_len = options.max_segment_len
        self.outcome_key = options.outcome_key
        self.base_advantage = options.base_advantage
        self.base_scale = options.base_scale
        self.stats: Counter[str] = Counter()
        self.last: dict[str, Any] = {}

    def episode_advantages(self, trajectories: Sequence[Trajectory], group: GroupScore,
                           advantages: Sequence[float]) -> list[float]:
        """The base A_i (see the class docstring); also what the tokens of a turn without code get."""
        if self.base_advantage == "outcome":
            return prover_base_advantages([_outcome(t, self.outcome_key, i) for i, t in enumerate(trajectories)],
                                          self.base_scale)
        if self.base_scale == "standardised":
            return [float(a) for a in advantages]
        if len(group.rewards) != len(trajectories):
            raise ValueError(f"base_scale 'centred' on the reward needs the group's rewards: got {len(group.rewards)} "
                             f"for {len(trajectories)} trajectories")
        return prover_base_advantages(group.rewards, "centred")

    def __call__(self, trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float]) -> list[list[float]]:
        successes = [_outcome(t, self.outcome_key, i) for i, t in enumerate(trajectories)]
        base = [[a] * len(t.steps) for t, a in zip(trajectories, self.episode_advantages(trajectories, group, advantages))]
        self.stats["groups"] += 1
        self.last = {"eligible": False}
        if not prover_eligible(successes):
            self.stats["ineligible"] += 1
            return base
        star = shortest_success(trajectories, successes)
        traj = trajectories[star]
        if len(traj.steps) < 2:  # no non-terminal segment exists: do not ask the judge
            self.stats["too_short"] += 1
            return base
        failures = [t for t, s in zip(trajectories, successes) if s <= 0]
        segment, reason = self.propose(traj, self.max_segment_len, failures)
        if segment is not None:  # a custom proposer gets the same checks as the judge's
            try:
                segment = validate_segment(segment.start, segment.end, len(traj.steps), self.max_segment_len)
            except ValueError as exc:
                segment, reason = None, f"invalid segment: {exc}"
        self.last = {"eligible": True, "trajectory": star, "proposal": reason}
        if segment is None:
            self.stats["no_segment"] += 1
            return base
        # The messages that rebuild the state before step s and after step e.
        messages = [step.text for step in traj.steps]
        try:
            pre = list(self.continue_fn(traj.task.id, messages[: segment.start - 1], self.K))
            post = list(self.continue_fn(traj.task.id, messages[: segment.end], self.K))
        except Exception as exc:  # noqa: BLE001 - a failed restart costs this group its bonus, counted
            self.stats["continuation_error"] += 1
            self.last["error"] = f"{type(exc).__name__}: {exc}"
            log.warning("ProVer continuations failed for task %s: %s", traj.task.id, self.last["error"])
            return base
        delta = prover_delta(pre, post)
        self.stats["credited" if delta > 0 else "no_gain"] += 1
        self.last.update(segment=(segment.start, segment.end), delta=delta, pre=pre, post=post)
        base[star] = apply_segment_bonus(base[star], segment, delta, self.lam)
        return base


# -- continuations in a restorable environment ---------------------------------------------


class EnvContinuations:
    """``continue_fn`` for any restorable ``CodeStepEnv``: restore the prefix into a fresh
    episode, let ``policy(task, history) -> message`` finish it, and read the outcome from the
    end metrics. ``history`` alternates observations and assistant messages, starting with the
    agent prompt, so a policy sees exactly what it saw the first time.

    The trainer's generation loop is the natural ``policy``; scripted policies serve tests.
    """

    def __init__(self, env, policy: Callable[[Any, list[str]], str], *, outcome_key: str = "success") -> None:
        base = getattr(env, "unwrapped", env)
        if not getattr(base, "can_restore", False):
            raise ValueError(f"{type(base).__name__} cannot restore episode state (can_restore is False); ProVer needs it")
        self.env = env
        self.policy = policy
        self.outcome_key = outcome_key

    def _history(self, base) -> list[str]:
        history = [base.task.agent_prompt]
        for step in base.trajectory().steps:
            history += [step.text, step.observation]
        return history

    def __call__(self, task_id: str, prefix_messages: list[str], k: int) -> list[float]:
        base = self.env.unwrapped if hasattr(self.env, "unwrapped") else self.env
        outcomes = []
        for _ in range(k):
            base.restore(task_id, list(prefix_messages))
            history = self._history(base)
            done = False
            info: dict[str, Any] = {}
            while not done:
                message = self.policy(base.task, history)
                observation, _, terminated, truncated, info = self.env.step(message)
                history += [message, observation]
                done = terminated or truncated
            metrics = info.get("metrics", {})
            if self.outcome_key not in metrics:
                raise ValueError(f"the environment's end metrics lack {self.outcome_key!r}: {sorted(metrics)}")
            outcomes.append(float(metrics[self.outcome_key]))
        return outcomes


def env_runner_continuations(env_runner_group, *, outcome_key: str = "success", seed: int = 0) -> ContinueFn:
    """``continue_fn`` for the RLlib trainer: the k continuations run on one of its env
    runners (``LLMEnvRunner.continue_from``), so they use the policy weights just synced
    there; the outcome is read from each continuation's end metrics."""

    def continue_fn(task_id: str, prefix_messages: list[str], k: int) -> list[float]:
        ids = env_runner_group.healthy_env_runner_ids()
        if ids:
            trajectories = env_runner_group.foreach_env_runner(
                lambda runner: runner.continue_from(task_id, list(prefix_messages), k, seed),
                local_env_runner=False, remote_worker_ids=ids[:1])[0]
        elif env_runner_group.local_env_runner is not None:  # num_env_runners: 0, the trainer's own
            trajectories = env_runner_group.local_env_runner.continue_from(task_id, list(prefix_messages), k, seed)
        else:
            raise RuntimeError("no healthy env runner to run ProVer's continuations on")
        return [_outcome(t, outcome_key, i) for i, t in enumerate(trajectories)]

    return continue_fn


# -- the registry entry --------------------------------------------------------------------

@credit_rule("prover", ProVerOptions, needs=prover_needs, inputs=("continue_fn", "propose"))
def prover_rule(options: ProVerOptions, *, continue_fn: ContinueFn | None = None,
                propose: Proposer | None = None) -> CreditRule:
    """ProVer: ``continue_fn`` from the trainer (see the module docstring) and the options'
    ``judge`` (a reward-layer ``Judge``, or its registered name with ``judge_options``, as a
    YAML config gives it) wrapped in a ``JudgeSegmentProposer``, or a ready ``propose``."""
    if continue_fn is None:
        raise ValueError("prover needs continue_fn=(task_id, prefix_messages, k) -> outcomes, "
                         "continuations of the current policy (the trainer's env runner provides it)")
    if propose is None:
        judge = options.judge
        if judge is None:
            raise ValueError("prover needs judge= (proposes the pivotal segment) or propose=")
        if isinstance(judge, str):
            from draco_gym.reward import build_judge

            judge = build_judge(judge, **(options.judge_options or {}))
        propose = JudgeSegmentProposer(judge, max_repairs=options.max_repairs)
    return ProVerRule(continue_fn, propose, options)
