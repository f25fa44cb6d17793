"""GRPO with step-level credit as an RLlib ``Algorithm``.

    config = (
        GRPOConfig()
        .environment("draco_gym/PythonTools-v0")
        .policy(model="smollm2-135m-instruct", lora={"r": 16, "alpha": 32})
        .training(group_size=4, tasks_per_iteration=2, reward="rule", credit="draco", kl_coeff=0.01)
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
    )
    algo = config.build_algo()
    algo.train()                                   # or tune.Tuner("GRPO", param_space=config)

One iteration (``training_step``):
  1. sample ``tasks_per_iteration`` task ids (seeded by the iteration, so a resumed run
     draws the same tasks);
  2. each env runner runs G episodes of its tasks and scores each group with the reward;
  3. per group: A_i = group-normalised reward, per-step credit by the configured rule,
     spread over each step's tokens (gap tokens 0);
  4. the learner steps once per minibatch of trajectories;
  5. the LoRA weights go back to the env runners, so the next rollouts are on-policy.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

from draco_gym.algos.credit import get_credit_rule, group_advantages, token_advantages

from draco_gym.algos.batch import token_batch
from draco_gym.algos.env_runner import LLMEnvRunner
from draco_gym.algos.learner import GRPOTorchLearner
from draco_gym.algos.models import resolve_model
from draco_gym.algos.module import DEFAULT_LORA, HFPolicyModule

PHASES = ("generation", "env", "judge", "credit", "learner", "sync")


class GRPOConfig(AlgorithmConfig):
    """Hyper-parameters; defaults are DRACO's (Table 10) where the paper gives one."""

    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or GRPO)
        # policy
        self.policy_model: str | None = None  # (AlgorithmConfig.model is the old stack's)
        self.dtype = "float32"
        self.lora = dict(DEFAULT_LORA)
        self.gradient_checkpointing = False
        self.torch_threads: int | None = None  # None: leave it to Ray (one per reserved CPU)
        self.sampler = "torch"  # "torch" (transformers, CPU or GPU) or "vllm" (GPU, unverified)
        # rollouts
        self.group_size = 6
        self.tasks_per_iteration = 16
        self.task_ids: list[str] | None = None
        self.temperature = 1.0
        self.max_new_tokens = 1024
        self.max_prompt_tokens = 4096
        self.max_response_tokens = 24576
        # reward and credit
        self.reward = "rule"
        self.reward_options: dict[str, Any] = {}
        self.credit = "draco"
        self.credit_options: dict[str, Any] = {}
        # loss and optimizer
        self.clip_low = 0.2
        self.clip_high = 0.2
        self.dual_clip = 3.0
        self.kl_coeff = 0.01
        self.lr = 5e-5
        self.weight_decay = 0.01
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.minibatch_size = 8  # trajectories per optimizer step
        self.num_epochs = 1
        self.micro_batch_tokens = 4096
        self.recompute_old_logprobs: bool | None = None  # None: only with the vllm sampler
        # output
        self.output_dir: str | None = None  # rollouts.jsonl goes here when set
        self.sync_timeout_s = 300.0
        self.restore_from: str | None = None  # a checkpoint to continue from (adapter, optimizer, iteration)
        # RLlib plumbing: our own runner, no policy copy in the driver
        self.env_runner_cls = LLMEnvRunner
        self.num_env_runners = 1
        self.create_local_env_runner = False

    def policy(self, *, model=NotProvided, dtype=NotProvided, lora=NotProvided,
               gradient_checkpointing=NotProvided, sampler=NotProvided, torch_threads=NotProvided) -> GRPOConfig:
        """The policy model: a local directory or ``"smollm2-135m-instruct"``."""
        return self._set(policy_model=model, dtype=dtype, lora=lora, gradient_checkpointing=gradient_checkpointing,
                         sampler=sampler, torch_threads=torch_threads)

    def training(self, *, group_size=NotProvided, tasks_per_iteration=NotProvided, task_ids=NotProvided,
                 temperature=NotProvided, max_new_tokens=NotProvided, max_prompt_tokens=NotProvided,
                 max_response_tokens=NotProvided, reward=NotProvided, reward_options=NotProvided,
                 credit=NotProvided, credit_options=NotProvided, clip_low=NotProvided, clip_high=NotProvided,
                 dual_clip=NotProvided, kl_coeff=NotProvided, weight_decay=NotProvided,
                 micro_batch_tokens=NotProvided, recompute_old_logprobs=NotProvided, output_dir=NotProvided,
                 restore_from=NotProvided, **kwargs) -> GRPOConfig:
        super().training(**kwargs)
        return self._set(group_size=group_size, tasks_per_iteration=tasks_per_iteration, task_ids=task_ids,
                         temperature=temperature, max_new_tokens=max_new_tokens,
                         max_prompt_tokens=max_prompt_tokens, max_response_tokens=max_response_tokens,
                         reward=reward, reward_options=reward_options, credit=credit,
                         credit_options=credit_options, clip_low=clip_low, clip_high=clip_high,
                         dual_clip=dual_clip, kl_coeff=kl_coeff, weight_decay=weight_decay,
                         micro_batch_tokens=micro_batch_tokens, recompute_old_logprobs=recompute_old_logprobs,
                         output_dir=output_dir, restore_from=restore_from)

    def _set(self, **values) -> GRPOConfig:
        for key, value in values.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

    @property
    def model_path(self) -> str:
        if not self.policy_model:
            raise ValueError("no policy model: call config.policy(model=...)")
        return resolve_model(self.policy_model)

    def validate(self) -> None:
        super().validate()
        from draco_gym.algos.credit import CREDIT_RULES

        if self.policy_model is None:
            raise ValueError("no policy model is set: config.policy(model='<local dir>' or 'smollm2-135m-instruct')")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if self.tasks_per_iteration < 1:
            raise ValueError(f"tasks_per_iteration must be >= 1, got {self.tasks_per_iteration}")
        if self.credit not in CREDIT_RULES:
            raise ValueError(CREDIT_RULES.unknown(self.credit))
        from draco_gym.reward import REWARDS

        if isinstance(self.reward, str) and self.reward not in REWARDS:
            raise ValueError(REWARDS.unknown(self.reward))
        from draco_gym.config import _reject_literal_keys

        _reject_literal_keys(self.reward_options, "reward_options")  # the config is pickled into checkpoints
        if self.sampler not in ("torch", "vllm"):
            raise ValueError(f"sampler must be 'torch' or 'vllm', got {self.sampler!r}")
        if self.num_env_runners < 1 and not self.in_evaluation:
            raise ValueError("GRPO needs num_env_runners >= 1 (rollouts run on env runner actors)")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {self.minibatch_size}")

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=HFPolicyModule, model_config=self.policy_model_config())

    def policy_model_config(self) -> dict:
        return {"model": self.model_path, "dtype": self.dtype, "lora": dict(self.lora), "seed": self.seed or 0,
                "temperature": self.temperature if self.temperature > 0 else 1.0,
                "gradient_checkpointing": self.gradient_checkpointing,
                "torch_threads": self.torch_threads}

    def get_default_learner_class(self):
        return GRPOTorchLearner


def credit_groups(groups: list[dict], rule):
    """Group advantages -> per-step credit -> per-token advantages, with the statistics
    of the reward and credit that the run reports."""
    rows, token_adv, step_adv = [], [], []
    rewards, inert, nonzero = [], 0, 0
    passes = fails = before = after = 0
    terminations, turns, env_metrics = Counter(), [], {}
    usage = Counter()
    fallbacks = 0
    for group in groups:
        trajs, score = group["trajectories"], group["score"]
        adv = group_advantages(score.rewards)
        per_step = rule(trajs, score, adv)
        for traj, a_i, a_steps, ts in zip(trajs, adv, per_step, score.scores):
            rows.append(traj)
            step_adv.append(a_steps)
            token_adv.append(token_advantages(a_steps, traj.token_step))
            if a_i != 0:
                nonzero += 1
                inert += all(math.isclose(a, a_i, rel_tol=1e-9, abs_tol=1e-12) for a in a_steps)
            terminations[traj.termination] += 1
            turns.append(len(traj.steps))
            passes, fails = passes + ts.p, fails + ts.f
            for key, value in traj.metrics.items():
                if isinstance(value, (bool, int, float)):
                    env_metrics.setdefault(key, []).append(float(value))
        rewards.extend(score.rewards)
        after += len(score.criteria)
        before += len(score.criteria) + len(score.dropped)
        fallbacks += len(score.fallbacks)
        total = score.total_usage
        usage.update({"calls": total.calls, "prompt_tokens": total.prompt_tokens,
                      "completion_tokens": total.completion_tokens, "cost": total.cost})
    n = max(len(rows), 1)
    stats = {
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "reward_std": float(np.std(rewards)) if rewards else 0.0,
        "rubric_pass_rate": passes / (passes + fails) if passes + fails else 0.0,
        "criteria_before_dropout": before / max(len(groups), 1),
        "criteria_after_dropout": after / max(len(groups), 1),
        "inert_credit_share": inert / nonzero if nonzero else 0.0,
        "episode_turns_mean": float(np.mean(turns)) if turns else 0.0,
        "judge_calls": usage["calls"], "judge_prompt_tokens": usage["prompt_tokens"],
        "judge_completion_tokens": usage["completion_tokens"], "judge_cost": float(usage["cost"]),
        "reward_fallbacks": fallbacks,
        **{f"termination/{k}": v / n for k, v in terminations.items()},
        **{f"env/{k}": float(np.mean(v)) for k, v in env_metrics.items()},
        "_step_advantages": step_adv,
    }
    return rows, token_adv, stats


class GRPO(Algorithm):
    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    def setup(self, config) -> None:
        _ = config.model_path  # convert an aliased model once, before every actor loads it
        super().setup(config)
        self._task_ids = list(self.config.task_ids or self.env_runner_group.foreach_env_runner(
            lambda runner: runner.task_ids(), local_env_runner=False)[0])
        if not self._task_ids:
            raise ValueError("the environment has no tasks to train on")
        if self.config.restore_from:
            # Inside Tune too: the trial starts from the checkpoint's adapter, optimizer state
            # and iteration count, so the task draws and seeds continue where they left off.
            self.restore_from_path(str(Path(self.config.restore_from).resolve()))
            self.env_runner_group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True,
                                               timeout_seconds=self.config.sync_timeout_s)

    # -- one iteration -------------------------------------------------------------------------

    def training_step(self) -> None:
        cfg = self.config
        t_start = time.perf_counter()
        timers = dict.fromkeys(PHASES, 0.0)

        tasks = self.sample_tasks(self.iteration)
        outs = self._sample(tasks, seed=self._iteration_seed(self.iteration))
        groups = [g for out in outs for g in out["groups"]]
        for out in outs:
            for phase, seconds in out["timers"].items():  # runners work in parallel: slowest counts
                timers[phase] = max(timers[phase], seconds)
        t_sampled = time.perf_counter()

        rows, advantages, stats = self.assign_credit(groups)
        timers["credit"] = time.perf_counter() - t_sampled

        t0 = time.perf_counter()
        self._update_learner(rows, advantages)
        timers["learner"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self.env_runner_group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True,
                                           timeout_seconds=cfg.sync_timeout_s)
        timers["sync"] = time.perf_counter() - t0

        if cfg.output_dir:
            self._save_rollouts(groups, stats.pop("_step_advantages"))
        stats.pop("_step_advantages", None)
        total = time.perf_counter() - t_start
        generated = sum(out["generated_tokens"] for out in outs)
        self._log(stats, timers, total, generated, len(rows))

    def sample_tasks(self, iteration: int) -> list[str]:
        rng = np.random.default_rng([self.config.seed or 0, iteration])
        k = self.config.tasks_per_iteration
        picks = rng.choice(len(self._task_ids), size=k, replace=k > len(self._task_ids))
        return [self._task_ids[i] for i in picks]

    def _iteration_seed(self, iteration: int) -> int:
        return int(np.random.default_rng([self.config.seed or 0, iteration, 1]).integers(2**31 - 1))

    def _sample(self, tasks: list[str], *, seed: int, score: bool = True, temperature: float | None = None,
                group_size: int | None = None) -> list[dict]:
        """Shard the tasks over the env runners: exactly one kwargs dict per actor, since
        ``foreach_env_runner`` silently drops the dicts beyond the number of actors."""
        ids = self.env_runner_group.healthy_env_runner_ids()
        shards = [list(s) for s in np.array_split(np.asarray(tasks, dtype=object), len(ids))]
        kwargs = [{"tasks": shard, "group_size": group_size or self.config.group_size, "seed": seed + 7919 * i,
                   "score": score, "temperature": temperature} for i, shard in enumerate(shards)]
        return self.env_runner_group.foreach_env_runner("sample", local_env_runner=False, remote_worker_ids=ids,
                                                        kwargs=kwargs)

    def assign_credit(self, groups: list[dict]):
        rule = get_credit_rule(self.config.credit, **self.credit_options())
        return credit_groups(groups, rule)

    def credit_options(self) -> dict:
        """The configured credit options plus what only the trainer can supply, offered to
        any rule whose factory takes it: ``continue_fn``, continuations of the current policy
        from a restored prefix run on an env runner (ProVer), and ``reference_model``, a
        frozen reference that defaults to the initial policy, the base model (TRACE)."""
        import inspect

        from draco_gym.algos.credit import CREDIT_RULES

        options = dict(self.config.credit_options)
        accepts = inspect.signature(CREDIT_RULES.get(self.config.credit)).parameters
        if "continue_fn" in accepts and options.get("continue_fn") is None:
            from draco_gym.algos.credit.prover import env_runner_continuations

            options["continue_fn"] = env_runner_continuations(self.env_runner_group)
        if "reference_model" in accepts and options.get("reference_model") is None and options.get("scorer") is None:
            options["reference_model"] = self.config.model_path
        return options

    def _update_learner(self, rows, advantages) -> None:
        cfg = self.config
        pad = 0
        arrays = token_batch(rows, advantages, pad_id=pad)
        if cfg.recompute_old_logprobs or (cfg.recompute_old_logprobs is None and cfg.sampler == "vllm"):
            results = self.learner_group.foreach_learner(
                lambda learner, b=arrays: learner.policy_logprobs(b, DEFAULT_MODULE_ID))
            first = next(iter(results))  # a list (local learner) or RemoteCallResults
            arrays["old_logp"] = first.get() if hasattr(first, "get") else first
        size = cfg.minibatch_size or len(rows)
        results = []
        for epoch in range(cfg.num_epochs):
            for start in range(0, len(rows), size):
                part = {k: v[start : start + size] for k, v in arrays.items()}
                batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(part)}, env_steps=len(part["input_ids"]))
                results.append(self.learner_group.update(batch=batch, num_epochs=1, timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(NUM_ENV_STEPS_SAMPLED_LIFETIME, default=0)}))
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, len(rows), reduce="lifetime_sum")
        for result in results:
            self.metrics.aggregate(result if isinstance(result, list) else [result], key=LEARNER_RESULTS)

    def _log(self, stats: dict, timers: dict, total: float, generated: int, n_rows: int) -> None:
        for key, value in stats.items():
            self.metrics.log_value(key, value, window=1)
        accounted = sum(timers.values())
        for phase, seconds in timers.items():
            self.metrics.log_value(f"time/{phase}", seconds, window=1)
        self.metrics.log_value("time/other", max(total - accounted, 0.0), window=1)
        self.metrics.log_value("time/iteration", total, window=1)
        self.metrics.log_value("tokens_per_s", generated / timers["generation"] if timers["generation"] else 0.0,
                               window=1)
        self.metrics.log_value("generated_tokens", generated, window=1)
        self.metrics.log_value("num_trajectories", n_rows, window=1)

    def _save_rollouts(self, groups: list[dict], step_advantages: list[list[float]]) -> None:
        """Every rollout with its verdicts and credit, one JSON line each: enough to replay
        and re-score later with another judge or credit rule."""
        path = Path(self.config.output_dir)
        path.mkdir(parents=True, exist_ok=True)
        flat = iter(step_advantages)
        with open(path / "rollouts.jsonl", "a") as fh:
            for group in groups:
                for i, (traj, score) in enumerate(zip(group["trajectories"], group["score"].scores)):
                    fh.write(json.dumps({
                        "iteration": self.iteration, "task_id": group["task_id"], "index": i,
                        "trajectory": traj.model_dump(mode="json"), "score": score.model_dump(mode="json"),
                        "criteria": [c.title for c in group["score"].criteria],
                        "dropped": group["score"].dropped, "fallbacks": group["score"].fallbacks,
                        "step_advantages": next(flat),
                    }) + "\n")

    # -- beyond training -----------------------------------------------------------------------

    def run_continuations(self, task_id: str, messages: list[str], k: int, seed: int = 0):
        """K episodes of ``task_id`` continued after ``messages`` with the current policy, on
        the first env runner (ProVer's restarts; the environment must support restore)."""
        return self.env_runner_group.foreach_env_runner(
            "continue_from", local_env_runner=False,
            remote_worker_ids=self.env_runner_group.healthy_env_runner_ids()[:1],
            kwargs=[{"task_id": task_id, "messages": list(messages), "k": k, "seed": seed}])[0]

    def rollout(self, task_ids: list[str], *, group_size: int = 1, temperature: float | None = None,
                score: bool = True, seed: int = 0) -> list[dict]:
        """Episodes of the given tasks with the current policy, no update (evaluation)."""
        return [g for out in self._sample(list(task_ids), seed=seed, score=score, temperature=temperature,
                                          group_size=group_size) for g in out["groups"]]


def _grpo_with_default_config():
    return GRPO, GRPO.get_default_config()


def register_with_tune() -> None:
    """Make ``tune.Tuner("GRPO", ...)`` work, in this Ray session and in every later one.

    Tune keeps its trainables in the Ray session, so a plain ``register_trainable`` is lost
    after ``ray.shutdown()``; RLlib re-registers the algorithms of its own table whenever
    Tune meets an unknown name, so GRPO joins that table too.
    """
    from ray.rllib.algorithms.registry import ALGORITHMS
    from ray.tune.registry import register_trainable

    ALGORITHMS.setdefault("GRPO", _grpo_with_default_config)
    register_trainable("GRPO", GRPO)


register_with_tune()
