"""The rollout actor: G episodes per task with the current policy, scored by the reward.

RLlib's stock ``SingleAgentEnvRunner`` cannot serve here: it treats a ``Text`` observation
as a sequence and splits it into characters, and it cannot choose the task at reset. This
runner owns a pool of environments, a sampling copy of the policy (LoRA state synced from
the learner) and the reward; ``sample`` returns whole groups of episodes (``RolloutGroup``),
``score`` returns the groups it is given with their scores, and the driver turns them into
credit and a batch.

Scoring happens here, next to the rollouts: groups of different runners are judged in
parallel, and a self-judging reward can use this runner's copy of the policy. In training
(``rollout.scoring: streaming``) a group goes to the reward as soon as its episodes end,
judged on a background thread while the other groups sample (``policy/streaming.py``); a
self-judge is scored after the rollout, since it judges with the copy that samples.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from draco_gym.types import RolloutGroup, Trajectory

from draco_gym.algos.memory import release_freed_memory
from draco_gym.algos.policy import iteration
from draco_gym.algos.policy.chat import ChatFormat, eos_token_ids
from draco_gym.algos.policy.rollout import Episode, run_episodes
from draco_gym.algos.policy.streaming import GroupScorer, GroupWatch, uses_policy_judge


def make_env(env: Any, env_config: dict, modules=()):
    """An environment from RLlib's ``config.env``: an id registered with
    ``ray.tune.register_env``, a Gymnasium id (``"module:id"`` and ``"module:Class"`` too;
    ``modules`` are imported first: the ones that register the user's ids), a registered
    ``EnvSpec``, a class (called with ``**env_config``) or a creator function (called with
    ``env_config``)."""
    from draco_gym.registration import env_entry, make_from_entry

    if isinstance(env, str):
        from ray.tune.registry import ENV_CREATOR, _global_registry

        if _global_registry.contains(ENV_CREATOR, env):
            return _global_registry.get(ENV_CREATOR, env)(dict(env_config))
    return make_from_entry(env_entry(env, modules), env_config)


_TASKS: dict = {}


def env_source(env: Any, env_config: dict, modules=(), task_ids=None) -> tuple[Any, list[str]]:
    """What the env runners build from and the tasks to train on, found in this process (the
    driver) by building the environment once (``registration.env_tasks``: the task protocol).
    Remembered per environment, config and task list: ``validate`` runs more than once.

    The first item is a ``gymnasium`` ``EnvSpec`` for an id registered here, so an env
    runner builds the user's environment without having run the user's ``gym.register``."""
    import json

    from draco_gym.registration import env_entry, env_tasks

    key = (env if isinstance(env, str) else id(env), json.dumps(env_config, sort_keys=True, default=repr),
           tuple(modules or ()), tuple(task_ids or ()))
    if key not in _TASKS:
        from ray.tune.registry import ENV_CREATOR, _global_registry

        tune_registered = isinstance(env, str) and _global_registry.contains(ENV_CREATOR, env)
        entry = env if tune_registered else env_entry(env, modules)
        probe = make_env(env, env_config, modules) if tune_registered else _build(entry, env, env_config)
        try:
            tasks = env_tasks(probe, env, task_ids)
        finally:
            probe.close()
        _TASKS[key] = (entry, tasks)
    return _TASKS[key]


def _build(entry, name, env_config):
    from draco_gym.registration import EnvSourceError, make_from_entry

    try:
        return make_from_entry(entry, env_config)
    except EnvSourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the env's own constructor error, named
        raise EnvSourceError(f"env {name!r} could not be built with env_config {env_config!r:.300}: "
                             f"{type(exc).__name__}: {exc}") from exc


def weights_digest(state: dict) -> str:
    """A short hash of a policy state (name -> tensor or array): two copies of the policy
    hold the same weights exactly when their digests match."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        h.update(name.encode())
        h.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


# Marks a weight sync that follows a checkpoint restore (see ``LLMEnvRunner.set_state``).
RESTORED = "restored"


class LLMEnvRunner(EnvRunner, Checkpointable):
    def __init__(self, *, config, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        from transformers import AutoTokenizer

        self._weights_seq_no = 0
        self._envs: list = []
        self._reward = None
        self._streamed: tuple[list[str], GroupScorer] | None = None  # the last sample's groups at the judge
        self._probe = self._make_env()
        self.module = config.get_rl_module_spec(spaces=self.get_spaces(), inference_only=True).build()
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path)
        self.chat = ChatFormat.from_tokenizer(self.tokenizer)
        self.sampler = self._make_sampler(config.run.rollout.temperature)

    def _make_sampler(self, temperature: float):
        from draco_gym.algos.policy.generation import TorchSampler

        eos = eos_token_ids(self.tokenizer, getattr(self.module.lm, "generation_config", None))
        if self.config.run.policy.sampler == "vllm":
            if getattr(self, "sampler", None) is not None:  # another temperature: the same engine
                return self.sampler.with_temperature(temperature)
            return self._start_vllm(eos, temperature)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        return TorchSampler(self.module.lm, eos_ids=eos, pad_id=pad, temperature=temperature)

    def _start_vllm(self, eos: list[int], temperature: float):
        """This runner's vLLM engine (its own actor, in vLLM's environment), serving the
        runner's adapter from the start: no request ever goes without one."""
        from draco_gym.algos.rllib.vllm_sampler import VLLMSampler, lora_rank_slot, start_engine

        policy, limits = self.config.run.policy, self.config.run.rollout
        self._engine, self.engine_info = start_engine(
            self.config.model_path, dtype=policy.dtype, max_lora_rank=lora_rank_slot(int(dict(policy.lora).get("r", 16))),
            max_model_len=limits.max_prompt_tokens + limits.max_response_tokens, seed=self.config.seed or 0,
            kv_cache_gib=policy.vllm_kv_cache_gib, gpu_memory_utilization=policy.vllm_gpu_memory_utilization)
        sampler = VLLMSampler(self._engine, eos_ids=eos, temperature=temperature)
        self._hand_adapter(sampler)
        return sampler

    def _hand_adapter(self, sampler) -> None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="draco_lora_") as folder:
            sampler.set_adapter(self.module.save_adapter(folder))

    # -- what the driver calls -------------------------------------------------------------

    def task_ids(self) -> list[str]:
        ids = getattr(self._probe.unwrapped, "task_ids", None)
        if ids is None:
            raise ValueError(f"environment {self.config.env!r} does not list its tasks (task_ids); "
                             "set task_ids in the config")
        return list(ids)

    def sample(self, *, tasks: list[str], group_size: int, seed: int, temperature: float | None = None,
               stream_scoring: bool = False, score: bool = False, **kwargs) -> dict:
        """G episodes of each task, batched into one sampling call per turn. Returns the
        groups (unscored), timings and token counts. With ``stream_scoring`` (and a reward
        that does not judge with this runner's policy copy) each group goes to the reward on
        a background thread as soon as its episodes end; ``score`` collects the scores.
        ``score=True`` collects them in this call (the groups come back scored, with the
        judge's seconds as ``judge_s``): one call for the trainer to wait on when it samples
        the next iteration while it learns."""
        t0 = time.perf_counter()
        sampler = self.sampler if temperature is None else self._make_sampler(temperature)
        self._ensure_envs(len(tasks) * group_size)
        limits = self.config.run.rollout
        episodes = [
            Episode.start(self._envs[k], self.chat, limits, task_id=task, seed=seed + k)
            for k, task in enumerate(t for t in tasks for _ in range(group_size))
        ]
        stats: dict = {}
        self._drop_streamed()
        scorer = None
        if stream_scoring and not uses_policy_judge(self.config.run.reward.options):
            scorer = GroupScorer(self.reward, len(tasks))
        try:
            trajectories = run_episodes(episodes, sampler, self.chat, limits, seed=seed, stats=stats,
                                        on_done=GroupWatch(scorer, episodes, group_size) if scorer else None)
        except BaseException:
            if scorer is not None:
                scorer.close()
            raise
        self._streamed = (list(tasks), scorer) if scorer is not None else None
        t_rollout = time.perf_counter() - t0
        release_freed_memory()  # the episodes' KV cache, before the learner's turn to peak
        groups = [RolloutGroup(task_id=task, trajectories=trajectories[i * group_size : (i + 1) * group_size])
                  for i, task in enumerate(tasks)]
        out = {
            "groups": groups,
            "timers": {"generation": stats["sampling_s"], "env": t_rollout - stats["sampling_s"]},
            "generated_tokens": stats["sampled_tokens"],
            WEIGHTS_SEQ_NO: self._weights_seq_no,
            "weights_digest": weights_digest(self.module.get_state()),
            "node_id": ray.get_runtime_context().get_node_id(),
        }
        if score:
            scored = self.score(groups=groups)
            out.update(groups=scored["groups"], judge_s=scored["seconds"])
        return out

    def score(self, *, groups: list[RolloutGroup]) -> dict:
        """One reward call per group: the groups with their ``GroupScore``, in the same order,
        and the seconds it took. Groups this runner's last ``sample`` streamed to the reward
        (the same tasks in the same order) are only waited for; any others are scored here."""
        t0 = time.perf_counter()
        streamed, self._streamed = self._streamed, None
        if streamed is not None and streamed[0] == [group.task_id for group in groups]:
            scored = [group.with_score(score) for group, score in zip(groups, streamed[1].results())]
        else:
            if streamed is not None:
                streamed[1].close()
            scored = iteration.score(groups, self.reward)  # the iteration's score step
        return {"groups": scored, "seconds": time.perf_counter() - t0}

    def _drop_streamed(self) -> None:
        """A streamed sample nobody asked to score (an evaluation came in between) stops here."""
        streamed, self._streamed = self._streamed, None
        if streamed is not None:
            streamed[1].close()

    def continue_from(self, task_id: str, messages: list[str], k: int, seed: int = 0) -> list[Trajectory]:
        """K continuations of ``task_id`` after replaying ``messages`` (ProVer's restarts),
        with the current policy. Needs an environment with ``can_restore``."""
        self._ensure_envs(k)
        limits = self.config.run.rollout
        episodes = [Episode.from_prefix(self._envs[i], self.chat, limits, task_id, messages) for i in range(k)]
        return run_episodes(episodes, self.sampler, self.chat, limits, seed=seed)

    @property
    def reward(self):
        if self._reward is None:
            from draco_gym.algos.policy.self_judge import build_trainer_reward

            self._reward = build_trainer_reward(self.config.run.reward.name, dict(self.config.run.reward.options), self)
        return self._reward

    def _ensure_envs(self, n: int) -> None:
        while len(self._envs) < n:
            self._envs.append(self._make_env())

    def _make_env(self):
        """From the driver's ``EnvSpec`` when ``validate`` found one (the user's
        ``gym.register`` need not run here), else from ``config.env``."""
        entry = getattr(self.config, "env_entry", None)
        return make_env(entry if entry is not None else self.config.env, self.config.env_config,
                        self.config.run.env.modules)

    # -- EnvRunner / Checkpointable contract -------------------------------------------------

    def assert_healthy(self) -> None:
        assert self.module is not None and self._probe is not None

    def get_spaces(self):
        spaces = (self._probe.observation_space, self._probe.action_space)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    def get_metrics(self) -> dict:
        return {}

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """The sampling adapter and its version; without the adapter where ``not_components``
        names it (the trainer's checkpoint of its own runner: the learner's state holds it)."""
        state = {WEIGHTS_SEQ_NO: self._weights_seq_no}
        excluded = {not_components} if isinstance(not_components, str) else set(not_components or ())
        if COMPONENT_RL_MODULE not in excluded:
            state[COMPONENT_RL_MODULE] = self.module.get_state()
        return state

    def set_state(self, state: dict) -> None:
        """The learner's adapter, when newer than this runner's. A ``RESTORED`` state (a
        checkpoint loaded into the trainer) replaces it whatever its version: an older
        checkpoint, or another run's at the same version, is still the policy to sample."""
        if COMPONENT_RL_MODULE not in state:
            return
        seq = state.get(WEIGHTS_SEQ_NO, 0)
        restored = state.get(RESTORED, False)
        if restored or seq == 0 or seq > self._weights_seq_no:
            weights = state[COMPONENT_RL_MODULE]
            if isinstance(weights, ray.ObjectRef):
                weights = ray.get(weights)
            weights = weights.get(DEFAULT_MODULE_ID, weights)
            self.module.set_state(weights)
            if hasattr(self.sampler, "set_adapter"):  # vLLM: hand the new adapter over
                self._hand_adapter(self.sampler)
        self._weights_seq_no = seq if restored else max(self._weights_seq_no, seq)

    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    def get_checkpointable_components(self):
        return []

    def stop(self) -> None:
        self._drop_streamed()
        for env in self._envs + [self._probe]:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._envs = []
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is not None:
            from draco_gym.algos.rllib.vllm_sampler import stop_engine

            stop_engine(engine)
