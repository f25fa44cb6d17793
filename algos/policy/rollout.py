"""The multi-turn generation loop: many episodes advanced in lockstep, one batched sampling
call per turn across every live episode.

This is the piece other algorithms reuse. ``run_episodes`` takes episodes that start
anywhere, so:
  - GRPO starts them fresh (``Episode.start``): G episodes per task, all tasks of a shard
    batched together;
  - ProVer's restarts start them from a restored prefix of messages
    (``Episode.from_prefix``) and run K continuations with the current policy; on the
    trainer this is ``LLMEnvRunner.continue_from``.

Each finished episode is a ``Trajectory`` whose token arrays hold exactly what the policy
saw and sampled: prompt and observation tokens are gap tokens (step -1), the sampled tokens
of turn j (end-of-turn token included) belong to step j and carry their sampling log-probs.
A turn without a code block (the closing message) is recorded the same way, under its own
number: it is sampled, so it is trained, and the credit rules' step boundary
(``algos/credit/registry.py``) gives its tokens the trajectory's A_i rather than a share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from draco_gym.types import GAP, Termination, Trajectory

from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.config import EpisodeLimits  # the token budgets, declared with the run's knobs
from draco_gym.algos.policy.generation import Sampler


@dataclass
class Episode:
    """One episode in flight: its environment and the token record so far."""

    env: Any
    tokens: list[int]
    token_step: list[int]
    logprobs: list[float]
    prompt_len: int
    n_steps: int = 0
    step_tokens: list[int] = field(default_factory=list)
    trajectory: Trajectory | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.trajectory is not None

    @classmethod
    def with_prompt(cls, env, prompt_ids: list[int]) -> Episode:
        return cls(env=env, tokens=list(prompt_ids), token_step=[GAP] * len(prompt_ids),
                   logprobs=[0.0] * len(prompt_ids), prompt_len=len(prompt_ids))

    @classmethod
    def start(cls, env, chat: ChatFormat, limits: EpisodeLimits, *, task_id: str | None = None,
              seed: int | None = None) -> Episode:
        options = {} if task_id is None else {"task_id": task_id}
        prompt, _ = env.reset(seed=seed, options=options)
        return cls.with_prompt(env, chat.prompt_ids(prompt, limits.max_prompt_tokens))

    @classmethod
    def from_prefix(cls, env, chat: ChatFormat, limits: EpisodeLimits, task_id: str,
                    messages: Sequence[str]) -> Episode:
        """Restore ``task_id`` after ``messages`` (``env.restore``) and continue from there.

        The replayed turns are context, not samples of the current policy: their tokens are
        gap tokens and their steps have ``n_tokens == 0``, so they carry no advantage.
        """
        env.unwrapped.restore(task_id, list(messages))
        so_far = env.unwrapped.trajectory()
        ep = cls.with_prompt(env, chat.prompt_ids(so_far.task.agent_prompt, limits.max_prompt_tokens))
        for step in so_far.steps:
            turn = chat.encode(step.text) + [chat.eos_ids[0]] + chat.observation_ids(step.observation, True)
            ep.tokens += turn
            ep.token_step += [GAP] * len(turn)
            ep.logprobs += [0.0] * len(turn)
            ep.step_tokens.append(0)
        ep.n_steps = len(so_far.steps)
        return ep


def run_episodes(episodes: Sequence[Episode], sampler: Sampler, chat: ChatFormat, limits: EpisodeLimits,
                 *, seed: int = 0, stats: dict | None = None,
                 on_done: Callable[[int], None] | None = None) -> list[Trajectory]:
    """Advance every episode to its end; return their trajectories in the same order.

    Per turn: one batched sampling call over all live episodes, then each environment steps
    on its decoded message. A sampler with ``session`` (``TorchSampler``) keeps the live
    episodes' KV cache across turns, so each token is encoded once. An environment that
    raises, or whose observation the tokenizer refuses, ends its episode as ``env_error``
    (recorded in ``metrics["env_exception"]``), never the whole batch. ``stats``, when
    given, accumulates ``sampling_s`` and ``sampled_tokens``. ``on_done(i)``, when given,
    is called once for each episode, with its index, in the turn it ends
    (``streaming.GroupWatch``: a group whose episodes have all ended goes to the judge while
    the others keep sampling).
    """
    stats = stats if stats is not None else {}
    stats.setdefault("sampling_s", 0.0)
    stats.setdefault("sampled_tokens", 0)
    session, rows, turn = None, [], 0
    reported = [False] * len(episodes)

    def report() -> None:
        for i, ep in enumerate(episodes):
            if ep.done and not reported[i]:
                reported[i] = True
                if on_done is not None:
                    on_done(i)

    while True:
        live = [ep for ep in episodes if not ep.done]
        budgets = [min(limits.max_new_tokens, limits.max_response_tokens - (len(ep.tokens) - ep.prompt_len))
                   for ep in live]
        for ep, budget in zip(live, budgets):
            if budget <= 0:
                _finish(ep, Termination.LENGTH)
        report()  # the episodes the last turn ended, and those out of token budget
        budgets = [b for ep, b in zip(live, budgets) if not ep.done]
        live = [ep for ep in live if not ep.done]
        if not live:
            break
        t0 = time.perf_counter()
        turn_seed = seed * 1_000_003 + turn
        if hasattr(sampler, "session"):
            if session is None:
                session, rows = sampler.session([ep.tokens for ep in live]), list(live)
            elif rows != live:
                session.keep([_index(rows, ep) for ep in live])
                rows = list(live)
            samples = session.sample(budgets, turn_seed)
        else:
            samples = sampler.sample([ep.tokens for ep in live], budgets, turn_seed)
        stats["sampling_s"] += time.perf_counter() - t0
        stats["sampled_tokens"] += sum(len(s.token_ids) for s in samples)
        appended = [_advance(ep, sample, chat, limits) for ep, sample in zip(live, samples)]
        if session is not None:
            t0 = time.perf_counter()
            session.extend(appended)
            stats["sampling_s"] += time.perf_counter() - t0
        turn += 1
    return [ep.trajectory for ep in episodes]


def _index(rows: list[Episode], ep: Episode) -> int:
    return next(i for i, other in enumerate(rows) if other is ep)


def _advance(ep: Episode, sample, chat: ChatFormat, limits: EpisodeLimits) -> list[int]:
    """Record the sampled turn, step the environment; returns the gap tokens appended."""
    ep.n_steps += 1
    ep.tokens += sample.token_ids
    ep.token_step += [ep.n_steps] * len(sample.token_ids)
    ep.logprobs += sample.logprobs
    ep.step_tokens.append(len(sample.token_ids))
    try:
        observation, _, terminated, truncated, _ = ep.env.step(chat.decode(sample.token_ids))
        gap = None if terminated or truncated else chat.observation_ids(observation, sample.ended_with_eos)
    except Exception as exc:  # noqa: BLE001 - one broken environment (or observation) must not sink the batch
        ep.error = f"{type(exc).__name__}: {exc}"
        _finish(ep, Termination.ENV_ERROR)
        return []
    if gap is None:
        _finish(ep, None)
        return []
    ep.tokens += gap
    ep.token_step += [GAP] * len(gap)
    ep.logprobs += [0.0] * len(gap)
    if len(ep.tokens) - ep.prompt_len >= limits.max_response_tokens:
        _finish(ep, Termination.LENGTH)
        return []
    return gap


def _finish(ep: Episode, termination: str | None) -> None:
    """Close the record: the environment's trajectory plus the token arrays.

    ``termination`` overrides the environment's own reason when the trainer ended the
    episode (token budget, environment exception); the environment then ends it too
    (``CodeStepEnv.end_episode``), so the episode is evaluated like any other and its outcome
    is there for the reward. The environment may have recorded fewer steps than were sampled
    only when it raised; the token record is cut to match.
    """
    env = ep.env.unwrapped
    end = getattr(env, "end_episode", None) if termination is not None else None
    traj = end(termination) if end is not None else env.trajectory()
    steps = traj.steps
    n = len(steps)
    if n < ep.n_steps:  # the failing step never reached the environment's record
        keep = [s if s <= n else GAP for s in ep.token_step]
        ep.token_step = keep
    for step, count in zip(steps, ep.step_tokens):
        step.n_tokens = count
    metrics = dict(traj.metrics)
    if ep.error:
        metrics["env_exception"] = ep.error
    ep.trajectory = Trajectory(
        task=traj.task,
        steps=steps,
        termination=termination or traj.termination or Termination.LENGTH,
        metrics=metrics,
        token_ids=list(ep.tokens),
        token_step=list(ep.token_step),
        token_logprobs=list(ep.logprobs),
    )
