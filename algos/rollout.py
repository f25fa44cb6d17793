"""The multi-turn generation loop: many episodes advanced in lockstep, one batched sampling
call per turn across every live episode.

This is the piece other algorithms reuse. ``run_episodes`` takes episodes that start
anywhere, so:
  - GRPO starts them fresh (``Episode.start``): G episodes per task, all tasks of a shard
    batched together;
  - ProVer's restarts (credit engineer) start them from a restored prefix of messages
    (``Episode.from_prefix``) and run K continuations with the current policy; on the
    trainer this is ``LLMEnvRunner.continue_from`` / ``GRPO.run_continuations``.

Each finished episode is a ``Trajectory`` whose token arrays hold exactly what the policy
saw and sampled: prompt and observation tokens are gap tokens (step -1), the sampled tokens
of turn j (end-of-turn token included) belong to step j and carry their sampling log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from draco_gym.types import GAP, Termination, Trajectory

from draco_gym.algos.chat import ChatFormat
from draco_gym.algos.generation import Sampler


@dataclass(frozen=True)
class EpisodeLimits:
    """Token budgets. ``max_response_tokens`` counts everything after the prompt (sampled
    turns and observations): when it runs out the episode ends as ``length``."""

    max_new_tokens: int = 256
    max_prompt_tokens: int = 4096
    max_response_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_prompt_tokens", "max_response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


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
    def start(cls, env, chat: ChatFormat, limits: EpisodeLimits, *, task_id: str | None = None,
              seed: int | None = None) -> Episode:
        options = {} if task_id is None else {"task_id": task_id}
        prompt, _ = env.reset(seed=seed, options=options)
        ids = chat.prompt_ids(prompt, limits.max_prompt_tokens)
        return cls(env=env, tokens=ids, token_step=[GAP] * len(ids), logprobs=[0.0] * len(ids), prompt_len=len(ids))

    @classmethod
    def from_prefix(cls, env, chat: ChatFormat, limits: EpisodeLimits, task_id: str,
                    messages: Sequence[str]) -> Episode:
        """Restore ``task_id`` after ``messages`` (``env.restore``) and continue from there.

        The replayed turns are context, not samples of the current policy: their tokens are
        gap tokens and their steps have ``n_tokens == 0``, so they carry no advantage.
        """
        env.unwrapped.restore(task_id, list(messages))
        so_far = env.unwrapped.trajectory()
        ep = cls.start.__func__(cls, _NoReset(env, so_far.task.agent_prompt), chat, limits)  # prompt only
        ep.env = env
        for step in so_far.steps:
            turn = chat.encode(step.text) + [chat.eos_ids[0]] + chat.observation_ids(step.observation, True)
            ep.tokens += turn
            ep.token_step += [GAP] * len(turn)
            ep.logprobs += [0.0] * len(turn)
            ep.step_tokens.append(0)
        ep.n_steps = len(so_far.steps)
        return ep


class _NoReset:
    """Lets ``Episode.start`` build the prompt of an environment that is already restored."""

    def __init__(self, env, prompt: str) -> None:
        self.env, self.prompt = env, prompt

    def reset(self, **_):
        return self.prompt, {}


def run_episodes(episodes: Sequence[Episode], sampler: Sampler, chat: ChatFormat, limits: EpisodeLimits,
                 *, seed: int = 0, on_turn=None) -> list[Trajectory]:
    """Advance every episode to its end; return their trajectories in the same order.

    Per turn: one ``sampler.sample`` call over all live episodes, then each environment
    steps on its decoded message. An environment that raises ends its episode as
    ``env_error`` (recorded in ``metrics["env_exception"]``), never the whole batch.
    ``on_turn(turn, n_live, n_new_tokens)`` is called after each turn (timing, progress).
    """
    turn = 0
    while True:
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        budgets = [min(limits.max_new_tokens, limits.max_response_tokens - (len(ep.tokens) - ep.prompt_len))
                   for ep in live]
        for ep, budget in zip(live, budgets):
            if budget <= 0:
                _finish(ep, Termination.LENGTH)
        live = [ep for ep in live if not ep.done]
        budgets = [b for b in budgets if b > 0]
        if not live:
            break
        samples = sampler.sample([ep.tokens for ep in live], budgets, seed=seed * 1_000_003 + turn)
        for ep, sample in zip(live, samples):
            _advance(ep, sample, chat, limits)
        turn += 1
        if on_turn is not None:
            on_turn(turn, len(live), sum(len(s.token_ids) for s in samples))
    return [ep.trajectory for ep in episodes]


def _advance(ep: Episode, sample, chat: ChatFormat, limits: EpisodeLimits) -> None:
    ep.n_steps += 1
    ep.tokens += sample.token_ids
    ep.token_step += [ep.n_steps] * len(sample.token_ids)
    ep.logprobs += sample.logprobs
    ep.step_tokens.append(len(sample.token_ids))
    try:
        observation, _, terminated, truncated, _ = ep.env.step(chat.decode(sample.token_ids))
    except Exception as exc:  # noqa: BLE001 - one broken environment must not sink the batch
        ep.error = f"{type(exc).__name__}: {exc}"
        _finish(ep, Termination.ENV_ERROR)
        return
    if terminated or truncated:
        _finish(ep, None)
        return
    gap = chat.observation_ids(observation, sample.ended_with_eos)
    ep.tokens += gap
    ep.token_step += [GAP] * len(gap)
    ep.logprobs += [0.0] * len(gap)
    if len(ep.tokens) - ep.prompt_len >= limits.max_response_tokens:
        _finish(ep, Termination.LENGTH)


def _finish(ep: Episode, termination: str | None) -> None:
    """Close the record: the environment's trajectory plus the token arrays.

    ``termination`` overrides the environment's own reason when the trainer ended the
    episode (token budget, environment exception). The environment may have recorded fewer
    steps than were sampled only when it raised; the token record is cut to match.
    """
    traj = ep.env.unwrapped.trajectory()
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
