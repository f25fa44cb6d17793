"""Multi-turn draco-gym episodes inside TRL's own ``GRPOTrainer``.

TRL 1.16 offers two hooks for agents. ``environment_factory`` makes an environment's
methods into tools the model calls through its chat template's tool-call format, so a step
is a tool call, not a code block. ``rollout_func`` hands generation over entirely: it gets
the batch's prompts (each repeated ``num_generations`` times, adjacent) and the trainer, and
returns ``prompt_ids``, ``completion_ids`` and ``logprobs`` per row; any other key reaches
the reward functions as a column, and ``env_mask`` marks which completion tokens the model
wrote (1) and which the environment did (0: no loss). ``EnvRollout`` is a ``rollout_func``
that keeps draco-gym's step boundary, one code block per turn: each prompt names a task of a
draco-gym environment, the trainer's current model plays it with the trainer's rollout loop
(``algos/policy/rollout.py``, the same chat layout and sampler as the RLlib trainer), and the whole
episode, its turns and the observations between them, is the completion::

    from trl import GRPOConfig, GRPOTrainer
    from draco_gym.algos.trl import EnvRollout, task_dataset
    from draco_gym.reward import TRLReward, build_reward

    rollout = EnvRollout("draco_gym/Corridor-v0", max_new_tokens=64)
    reward = TRLReward(build_reward("corridor"), num_generations=4)   # or any draco-gym reward
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, rollout_func=rollout,
                          train_dataset=task_dataset(rollout.task_ids),
                          args=GRPOConfig(num_generations=4, per_device_train_batch_size=4))

``TRLReward`` scores each group from the ``trajectory`` column (the env's own record: code,
observations, metrics), so the judge sees exactly what ran. ``DracoCreditGRPOTrainer``
goes one step further and gives TRL's loss per-token advantages from a credit rule.

Needs ``trl`` (``pip install -e ".[trl]"``) and torch; importing this module imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draco_gym.metrics import group_advantages, learned_episodes
from draco_gym.types import GAP, Trajectory

from draco_gym.algos.policy.chat import ChatFormat, eos_token_ids
from draco_gym.algos.config import EpisodeLimits


def task_dataset(task_ids: Sequence[str], repeat: int = 1):
    """A ``datasets.Dataset`` whose ``prompt`` column names the tasks (``EnvRollout`` reads
    the task id from it), each ``repeat`` times."""
    from datasets import Dataset

    ids = [str(t) for t in task_ids for _ in range(repeat)]
    return Dataset.from_dict({"prompt": ids, "task_id": ids})


class EnvRollout:
    """A TRL ``rollout_func`` playing one draco-gym episode per prompt row (module docstring).

    ``env`` is named as in the trainer (``"ns/Name-v0"``, ``"module:id"``, ``"module:Class"``,
    a class; ``env_modules`` imported first). A prompt row is a task id (a string, or chat
    messages whose last user message is the id). Budgets are the trainer's
    (``max_new_tokens`` per turn, ``max_prompt_tokens``, ``max_response_tokens`` for the
    whole episode after the prompt); ``temperature`` defaults to TRL's ``args.temperature``.
    """

    def __init__(self, env: Any, env_config: dict | None = None, *, env_modules: Sequence[str] = (),
                 max_new_tokens: int = 256, max_prompt_tokens: int = 4096, max_response_tokens: int = 4096,
                 temperature: float | None = None, seed: int = 0) -> None:
        from draco_gym.registration import env_entry, env_tasks, make_from_entry

        self.entry = env_entry(env, env_modules)
        self.env_config = dict(env_config or {})
        self.limits = EpisodeLimits(max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                                    max_response_tokens=max_response_tokens)
        self.temperature = temperature
        self.seed = seed
        self._envs = [make_from_entry(self.entry, self.env_config)]
        self.task_ids = env_tasks(self._envs[0], env)
        self.calls = 0
        self.last_trajectories: list[Trajectory] = []

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        import torch

        from draco_gym.algos.policy.generation import TorchSampler
        from draco_gym.algos.policy.rollout import Episode, run_episodes
        from draco_gym.registration import make_from_entry

        tokenizer = trainer.processing_class
        chat = ChatFormat.from_tokenizer(tokenizer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        eos = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        temperature = self.temperature if self.temperature is not None else trainer.args.temperature
        sampler = TorchSampler(model, eos_ids=eos, pad_id=pad, temperature=temperature)
        while len(self._envs) < len(prompts):
            self._envs.append(make_from_entry(self.entry, self.env_config))
        seed = self.seed * 1_000_003 + self.calls
        self.calls += 1
        episodes = [Episode.start(self._envs[k], chat, self.limits, task_id=_task_id(p), seed=seed + k)
                    for k, p in enumerate(prompts)]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                trajectories = run_episodes(episodes, sampler, chat, self.limits, seed=seed)
        finally:
            model.train(was_training)
        self.last_trajectories = trajectories
        cut = [_prompt_length(t) for t in trajectories]
        return {
            "prompt_ids": [t.token_ids[:n] for t, n in zip(trajectories, cut)],
            "completion_ids": [t.token_ids[n:] for t, n in zip(trajectories, cut)],
            "logprobs": [t.token_logprobs[n:] for t, n in zip(trajectories, cut)],
            "env_mask": [[int(s != GAP) for s in t.token_step[n:]] for t, n in zip(trajectories, cut)],
            "trajectory": trajectories,
        }

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


def _task_id(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(f"a prompt row must name a task id (a string, or a user message holding it), got {prompt!r:.200}")
    return users[-1]


def _credit_trainer_class():
    """``DracoCreditGRPOTrainer``, built on first use so that importing this module does not
    import TRL."""
    import torch
    from trl import GRPOTrainer

    from draco_gym.algos.credit import get_credit_rule
    from draco_gym.algos.policy import iteration
    from draco_gym.reward.trl import TRLReward
    from draco_gym.types import RolloutGroup

    class DracoCreditGRPOTrainer(GRPOTrainer):
        """TRL's ``GRPOTrainer`` whose loss takes per-token advantages from a draco-gym credit
        rule (``credit="draco"``, ``credit_options``) instead of one advantage per sequence.

        TRL computes each row's group-normalised advantage A_i as usual; the rule turns it
        into per-step advantages from the group's verdicts (DRACO: towards the steps the judge
        cited), spread over each step's tokens (observation tokens get 0 and carry no loss
        anyway: ``env_mask``). TRL's loss accepts advantages of shape [B, T]. TRL's logs
        then show what the credit did, ``apply_credit``'s measures as the RLlib trainer logs
        them (``CreditedBatch.metrics``): ``credit/changed_token_share``,
        ``credit/step_advantage_spread``, ``credit/step_advantage_abs_mean``, both inert
        shares and ``credit/uncredited_citations``. Needs
        ``EnvRollout`` as ``rollout_func`` (its ``trajectory`` column) and one ``TRLReward``
        among ``reward_funcs`` (its verdicts); with several reward functions the credit
        follows that one's verdicts. The G rows of a group must sit on one process (checked):
        verified on one process only."""

        def __init__(self, *args, credit: str = "draco", credit_options: dict | None = None,
                     turns_without_code: str = "trajectory", **kwargs) -> None:
            super().__init__(*args, **kwargs)
            options = trl_credit_options(credit, credit_options or {}, self.model)
            self.credit_rule = get_credit_rule(credit, turns_without_code=turns_without_code, **options)
            rewards = [f for f in self.reward_funcs if isinstance(f, TRLReward)]
            if len(rewards) != 1:
                raise ValueError(f"DracoCreditGRPOTrainer needs exactly one TRLReward in reward_funcs (its verdicts "
                                 f"drive the credit), got {len(rewards)}")
            self.rubric_reward = rewards[0]
            self.last_token_advantages: list[list[float]] = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            trajectories = [row.get("trajectory") for row in inputs]
            if any(t is None for t in trajectories):
                raise ValueError("DracoCreditGRPOTrainer needs a `trajectory` column: use EnvRollout as rollout_func")
            groups = self.rubric_reward.last_groups
            if [t for members, _ in groups for t in members] != trajectories:
                raise RuntimeError("the reward's groups are not this process's rows: the G rows of a group must "
                                   "sit on one process")
            advantages, start = out["advantages"].tolist(), 0
            per_group = []
            for members, score in groups:
                per_group.append(without_env_errors(advantages[start : start + len(members)], members, score.rewards))
                start += len(members)
            # TRL's own A_i, credited by the rule: the iteration's credit step, as in every trainer
            credited = iteration.credit([RolloutGroup(task_id=members[0].task.id, trajectories=members, score=score)
                                     for members, score in groups], self.credit_rule, per_group)
            width = out["completion_ids"].shape[1]
            rows = []
            for traj, per_token in zip(credited.trajectories, credited.token_advantages):
                tail = per_token[_prompt_length(traj) :][:width]
                rows.append(tail + [0.0] * (width - len(tail)))
            self.last_token_advantages = rows
            mode = "train" if self.model.training else "eval"
            for key, value in credited.metrics().items():
                self._metrics[mode][key].append(value)
            out["advantages"] = torch.tensor(rows, dtype=out["advantages"].dtype, device=out["advantages"].device)
            return out

    return DracoCreditGRPOTrainer


def without_env_errors(advantages: list[float], members: Sequence[Trajectory], rewards: Sequence[float]) -> list[float]:
    """A group's A_i as TRL computed them, unless an episode of the group ended in
    ``env_error``: then the others' A_i are GRPO's over the episodes that count
    (``learned_episodes``), as the RLlib trainer computes them. TRL leaves a failed row out of
    its mean and std only when every reward function returned None for it (``TRLReward``
    does; another reward function may score it), and uses its own std; this gives the same
    A_i either way. The failed episodes' entries are never read (``apply_credit`` leaves them
    out of the loss)."""
    kept = learned_episodes(t.termination for t in members)
    if len(kept) == len(members):
        return list(advantages)
    out = [0.0] * len(members)
    for i, a in zip(kept, group_advantages([rewards[i] for i in kept])):
        out[i] = a
    return out


def trl_credit_options(name: str, options: dict, model) -> dict:
    """``options`` plus what TRL's trainer can supply for what the rule declares it needs
    (``credit_spec(name)``): its base model as the frozen reference (``Need.BASE_POLICY``:
    the model's ``name_or_path``). Continuations of the current policy (``Need.CONTINUATIONS``)
    it cannot run: they must be given (``continue_fn``, e.g. a ``prover.EnvContinuations``)."""
    from draco_gym.algos.credit import Need, credit_spec

    spec = credit_spec(name)
    out = dict(options)
    for need, keyword in spec.trainer_inputs(spec.parse(out)[0]).items():
        if out.get(keyword) is not None:
            continue
        if need is Need.BASE_POLICY:
            base = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(model, "name_or_path", None)
            if not base:
                raise ValueError(f"credit {name!r} needs a frozen reference model and the trainer's model names no "
                                 f"path: give credit_options={{{keyword!r}: PATH}}")
            out[keyword] = base
        else:
            raise ValueError(f"credit {name!r} needs {need.value} ({keyword}), which TRL's trainer cannot supply: give "
                             f"credit_options={{{keyword!r}: ...}}")
    return out


def _prompt_length(traj: Trajectory) -> int:
    """The prompt is every gap token before the first sampled one (EnvRollout's cut)."""
    return next((t for t, s in enumerate(traj.token_step) if s != GAP), len(traj.token_step))


def __getattr__(name: str):
    if name == "DracoCreditGRPOTrainer":
        return _credit_trainer_class()
    raise AttributeError(name)
