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
    algo.train()

    register_with_tune()                           # once, after ray.init(): then
    tune.Tuner("GRPO", param_space=config).fit()   # (or tune.Tuner(GRPO, ...) without it)

The knobs, their defaults and bounds are declared once, in ``algos/config.py``.
``training_step`` is the whole iteration: sample, score, credit, update, sync. With
``rollout.pipeline: one_step`` the next iteration's sample is drawn while this one learns:

    off       sample_k(v_k) score_k | credit update -> v_k+1 | sync
    one_step  wait for sample_k(v_k-1), scored | sync v_k | start sample_k+1(v_k) | credit update -> v_k+1

so every iteration after the first learns from rollouts one update old (recorded per group as
``policy_version``; the loss's ratio takes the drawing policy's log-probs). The first
iteration of a run, and the first after a restore or an evaluation, samples on the spot.
"""

from __future__ import annotations

import inspect
import logging
import shutil
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import ray
from pydantic import BaseModel, ValidationError
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import ALL_MODULES, COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (ENV_RUNNER_RESULTS, LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED,
                                     NUM_ENV_STEPS_SAMPLED_LIFETIME, NUM_EPISODES, NUM_EPISODES_LIFETIME,
                                     WEIGHTS_SEQ_NO)
from ray.tune.result import TRAINING_ITERATION

from draco_gym.algos.checkpoints import install, require_complete, resume_point, seal, staging_dir
from draco_gym.algos.policy import iteration
from draco_gym.algos.config import ConfigError, RunConfig, draft_run
from draco_gym.algos.credit import Need, credit_spec, get_credit_rule
from draco_gym.algos.credit.apply import CreditedBatch
from draco_gym.algos.rllib.env_runner import RESTORED, LLMEnvRunner, env_source
from draco_gym.algos.rllib.learner import GRPOTorchLearner
from draco_gym.algos.policy.models import adapter_base, check_adapter_base, model_location, resolve_model
from draco_gym.algos.rllib.module import HFPolicyModule
from draco_gym.algos.rllib.reporting import (NOTE_KEY, OUTCOME, PHASES, MetricsLog, RolloutLog, compact,
                                            iteration_metrics, reward_hacking_warning, run_alarms)
from draco_gym.metrics import reward_outcome_divergence
from draco_gym.reward.judge_health import DeadJudge, dead_judge, judge_down
from draco_gym.types import RolloutGroup

logger = logging.getLogger(__name__)

# A checkpoint's subfolder holding the LoRA adapter in PEFT's own format.
ADAPTER_DIR = "adapter"

# The tag of the env runners' calls that sample the next iteration while this one learns.
DRAWN_AHEAD = "drawn_ahead"


def _builder_keywords() -> dict[str, tuple[str, ...]]:
    """GRPOConfig's builder keyword -> the field it sets in the run schema. A keyword is the
    field's own name; a named component's name and options are KEY and KEY_options
    (``.training(credit="trca", credit_options={...})``); the env's are RLlib's."""
    out: dict[str, tuple[str, ...]] = {"env": ("env", "id"), "env_config": ("env", "config"),
                                       "env_modules": ("env", "modules"), "task_ids": ("env", "task_ids"),
                                       "seed": ("seed",)}
    for section in ("policy", "rollout", "reward", "credit", "optim", "resources"):
        for key in RunConfig.model_fields[section].annotation.model_fields:
            keyword = {"name": section, "options": f"{section}_options"}.get(key, key) \
                if section in ("reward", "credit") else key
            assert keyword not in out, f"two knobs answer to {keyword!r}"
            out[keyword] = (section, key)
    for key in ("ray_address", "ray_num_cpus", "object_store_memory_mb"):  # the command's, before Ray exists
        del out[key]
    return out


KEYWORDS = _builder_keywords()

# The knobs RLlib reads itself: they stay AlgorithmConfig attributes, set by RLlib's builder
# methods too (``.env_runners(num_env_runners=2)``, ``.debugging(seed=3)``), and
# ``validate`` copies them into ``run``.
RLLIB_KNOBS = ("env", "env_config", "seed", "lr", "grad_clip", "minibatch_size", "num_epochs", "num_env_runners",
               "num_cpus_per_env_runner", "num_gpus_per_env_runner", "num_learners", "num_gpus_per_learner",
               "custom_resources_per_env_runner")

# Keywords of each builder method (RLlib's own ones pass through to it).
_POLICY = {key for key, path in KEYWORDS.items() if path[0] == "policy"}
_TRAINING = {key for key, path in KEYWORDS.items() if path[0] in ("rollout", "reward", "credit", "optim")} | {
    "task_ids", "sync_timeout_s", "output_dir", "restore_from"}


class GRPOConfig(AlgorithmConfig):
    """An RLlib ``AlgorithmConfig`` holding a run schema (``algos/config.py``; defaults are
    DRACO's, Table 10, where the paper gives one) in ``run``: the builder methods fill it in
    by field name (``.training(group_size=4)`` sets ``run.rollout.group_size``), ``validate``
    checks it, and the trainer, env runners and learner read each knob from it
    (``config.run.rollout.group_size``, ``config.run.optim`` for the loss). The knobs RLlib
    reads itself (``RLLIB_KNOBS``: the env, seed, learning rate, batch sizes and resources)
    stay its own attributes, read there by RLlib and by us alike (a learner may be built from
    a config never validated), and ``validate`` copies them into ``run`` to check them."""

    def __init__(self, algo_class=None) -> None:
        super().__init__(algo_class=algo_class or GRPO)
        self.run: RunConfig = draft_run()
        for attr in RLLIB_KNOBS:
            if attr != "env":
                setattr(self, attr, _field(self.run, KEYWORDS[attr]))
        self.output_dir: str | None = None  # rollouts.jsonl goes here when set
        self.restore_from: str | None = None  # a checkpoint to continue from (adapter, optimizer, iteration)
        # RLlib plumbing: our own runner, no policy copy in the driver
        self.env_runner_cls = LLMEnvRunner
        self.create_local_env_runner = False
        self.env_entry = None  # what the env runners build from: set by validate (env_runner.env_source)
        # An env runner's error reaches the driver as raised (an actor that died in its
        # constructor, a failed sample), instead of the runner being dropped silently and a
        # later call finding no runner at all.
        self.restart_failed_env_runners = False
        # Our env runners have no connector state: RLlib's gathering of it after each
        # iteration would only wait on them (behind a sample drawn ahead, for a whole sample).
        self.merge_env_runner_states = False
        self.broadcast_env_runner_states = False

    @classmethod
    def from_run_config(cls, run: RunConfig, *, output_dir: str | None = None) -> GRPOConfig:
        """The algorithm config a validated YAML run describes (``algos/config.py``)."""
        config = cls()
        config.run = run
        for attr in RLLIB_KNOBS:
            setattr(config, attr, _field(run, KEYWORDS[attr]))
        config.output_dir = output_dir
        config.log_level = "WARN"
        return config

    def environment(self, env=NotProvided, *, env_modules: list[str] | None = None,
                    task_ids: list[str] | None = None, **kwargs) -> GRPOConfig:
        """RLlib's ``environment`` plus ``env_modules`` (modules imported before the env is
        looked up, in the driver and in every env runner: the ones that call ``gym.register``
        for your ids) and ``task_ids`` (the tasks to train on; default: the env's
        ``task_ids``). ``env`` is a registered id, ``"module:id"``, ``"module:Class"``, an env
        class or a creator function."""
        super().environment(env, **kwargs)
        return self._set({k: list(v) for k, v in (("env_modules", env_modules), ("task_ids", task_ids))
                          if v is not None})

    def policy(self, **knobs) -> GRPOConfig:
        """The policy: ``model`` (a local directory or ``"smollm2-135m-instruct"``), ``dtype``,
        ``lora``, ``sampler``, ``gradient_checkpointing``, ``torch_threads``."""
        _known(knobs, _POLICY, "policy")
        return self._set(knobs)

    def training(self, **kwargs) -> GRPOConfig:
        """Rollout, reward, credit, loss and optimizer knobs, plus RLlib's own ``training`` keywords."""
        ours = {k: kwargs.pop(k) for k in list(kwargs) if k in _TRAINING}
        rllib = set(inspect.signature(AlgorithmConfig.training).parameters) - {"self"}
        _known(kwargs, rllib | _TRAINING, "training")
        super().training(**kwargs)
        return self._set(ours)

    def _set(self, values: dict) -> GRPOConfig:
        # The paths a script gives, made absolute here, in the driver: Tune validates the
        # config again inside the trial, whose working folder is the trial's own.
        absolute = {"model": model_location, "output_dir": local_path, "restore_from": local_path}
        values = {k: absolute[k](v) if k in absolute and v is not None else v for k, v in values.items()}
        for key, value in values.items():
            if key in RLLIB_KNOBS or key not in KEYWORDS:
                setattr(self, key, value)
            else:
                self.run = _with_field(self.run, KEYWORDS[key], value)
        return self

    @property
    def model_path(self) -> str:
        if not self.run.policy.model:
            raise ValueError("no policy model: call config.policy(model=...)")
        return resolve_model(self.run.policy.model)

    def validate(self) -> None:
        run = self._checked_run()
        if not self._is_frozen:
            self.run = run
        super().validate()
        if run.rollout.pipeline == "one_step" and not self.in_evaluation:
            spec = credit_spec(run.credit.name)
            if Need.CONTINUATIONS in spec.needs(spec.parse(run.credit.options)[0]) \
                    and run.credit.options.get("continue_fn") is None:
                raise ConfigError(f"rollout.pipeline: one_step with credit {run.credit.name!r}: its continuations run "
                                  "on the env runners, which are sampling the next iteration while credit is "
                                  "computed; set the pipeline off for this credit rule")
        if run.policy.sampler == "vllm" and not self.in_evaluation:
            from draco_gym.algos.policy.vllm_runtime import SetupError, VLLMRuntime

            try:
                VLLMRuntime().engine_python()
            except SetupError as exc:
                raise ConfigError(f"policy.sampler: {exc}") from None
        if self.output_dir and not self._is_frozen:  # Tune runs the trial in a folder of its own
            self.output_dir = local_path(self.output_dir)
        if not self.in_evaluation:
            entry = self.env_source()[0]
            if not self._is_frozen:
                self.env_entry = entry

    def _checked_run(self) -> RunConfig:
        """``run`` with RLlib's own knobs copied in, validated against the schema; an error
        names the builder keyword (``GRPOConfig: group_size: ...``)."""
        raw = self.run.model_dump(warnings=False)
        for attr in RLLIB_KNOBS:
            if attr == "num_env_runners" and self.in_evaluation:  # RLlib's evaluation copy runs no rollouts of ours
                continue
            node = raw
            *sections, key = KEYWORDS[attr]
            for part in sections:
                node = node[part]
            node[key] = getattr(self, attr)
        for section, key in (("env", "id"), ("policy", "model")):
            if raw[section][key] is None:  # reported as not set, below
                del raw[section][key]
        try:
            return RunConfig.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError("GRPOConfig: " + "; ".join(_problem(err) for err in exc.errors())) from None

    def env_source(self) -> tuple[Any, list[str]]:
        """The environment's entry and the tasks to train on, checked here in the driver by
        building the environment once (``env_runner.env_source``), so a wrong id, a module
        that does not register it or an env that lists no tasks fails before any actor starts."""
        from draco_gym.registration import EnvSourceError

        try:
            return env_source(self.env, self.env_config, self.run.env.modules, self.run.env.task_ids)
        except EnvSourceError as exc:
            raise ConfigError(f"GRPOConfig: {exc}") from None

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=HFPolicyModule, model_config=self.policy_model_config())

    def policy_model_config(self) -> dict:
        policy, temperature = self.run.policy, self.run.rollout.temperature
        return {"model": self.model_path, "dtype": policy.dtype, "lora": dict(policy.lora), "seed": self.seed or 0,
                "temperature": temperature if temperature > 0 else 1.0,
                "gradient_checkpointing": policy.gradient_checkpointing, "torch_threads": policy.torch_threads}

    def get_default_learner_class(self):
        return GRPOTorchLearner

    # -- ``run`` through RLlib's and Tune's copies of a config -------------------------------

    def to_dict(self) -> dict:
        """RLlib's, with ``run`` as nested plain dicts: Tune's trial config, and so W&B's
        config and MLflow's params, show every knob (``run/rollout/group_size``)."""
        config = super().to_dict()
        config["run"] = self.run.model_dump(warnings=False)
        return config

    def update_from_dict(self, config_dict: dict) -> GRPOConfig:
        config_dict = dict(config_dict)
        run = config_dict.pop("run", None)
        super().update_from_dict(config_dict)
        if run is not None:
            self.run = run if isinstance(run, RunConfig) else draft_run(run)
        return self

    def __setattr__(self, key, value) -> None:
        # a knob of ``run`` set as an attribute would be read by nothing: refuse it, by name
        path = KEYWORDS.get(key)
        if path is not None and key not in RLLIB_KNOBS and key != "model":
            builder = {"policy": "policy", "env": "environment"}.get(path[0], "training")
            raise AttributeError(f"GRPOConfig.{key} is not an attribute: the knob is run.{'.'.join(path)} "
                                 f"(set it with .{builder}({key}=...))")
        super().__setattr__(key, value)


def _field(model: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        model = getattr(model, part)
    return model.model_dump() if isinstance(model, BaseModel) else model


def _with_field(model: BaseModel, path: tuple[str, ...], value: Any) -> BaseModel:
    """A copy of ``model`` with the field at ``path`` set (checked later, by ``validate``)."""
    head, *rest = path
    return model.model_copy(update={head: _with_field(getattr(model, head), tuple(rest), value) if rest else value})


_ERROR_NAMES = {path: key for key, path in KEYWORDS.items()}


def _problem(err: dict) -> str:
    """One schema error, named by the builder keyword that sets the field."""
    loc = tuple(str(p) for p in err["loc"])
    name = next((_ERROR_NAMES[loc[:n]] + "".join(f".{p}" for p in loc[n:])
                 for n in range(len(loc), 0, -1) if loc[:n] in _ERROR_NAMES), ".".join(loc))
    if err["type"] == "missing":
        hint = {"env": ".environment(env=...)", "model": ".policy(model=...)"}.get(name, "")
        return f"{name} is not set{': call ' + hint if hint else ''}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{name}: {msg}" if name else msg


def _known(kwargs: dict, known: set[str], method: str) -> None:
    import difflib

    for key in kwargs:
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise TypeError(f"GRPOConfig.{method}() got an unknown keyword {key!r}"
                            + (f"; did you mean {hint[0]!r}?" if hint else ""))


class GRPO(Algorithm):
    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    def setup(self, config) -> None:
        _ = config.model_path  # convert an aliased model once, before every actor loads it
        super().setup(config)
        self.rollout_log = RolloutLog(Path(config.output_dir) / "rollouts.jsonl") if config.output_dir else None
        self.metrics_log = MetricsLog(config.output_dir) if config.output_dir else None
        self._task_ids = self.config.env_source()[1]
        self._judged = deque(maxlen=self.config.run.reward.dead_judge_groups)  # the last groups' scores, in scoring order
        self._reward_and_outcome: list[tuple[float, float | None]] = []  # per iteration
        self._divergence_warned = False
        self._rows: list[dict[str, Any]] = []  # compact results, per iteration (the collapse alarm's)
        self._collapse_warned = False
        self._judge_down_named = False  # the current streak of iterations without a judge answer is named
        self._notes: list[str] = []  # the iteration's console lines (NOTE_KEY)
        self._tune_checkpoint: Path | None = None
        self._sampler_version: int | None = None  # updates in the env runners' weights (None: the learner's)
        self._ahead: tuple[int, tuple[int, ...], int] | None = None  # (iteration, runners, version) drawing ahead
        if self.config.restore_from:
            # Inside Tune too: the trial starts from the checkpoint's adapter, optimizer state
            # and iteration count, so the task draws and seeds continue where they left off.
            # A folder of checkpoints means its newest complete one.
            choice = resume_point(Path(self.config.restore_from).resolve())
            print(f"restoring {choice.describe()}", flush=True)
            self.restore_from_path(str(choice.checkpoint.path))

    # -- one iteration -------------------------------------------------------------------------

    def train(self) -> dict:
        """RLlib's ``train``; with an ``output_dir``, each result also goes to
        ``OUTPUT_DIR/metrics.jsonl`` and the plots, whoever calls it (a script, Tune,
        ``draco-gym train``). ``result[NOTE_KEY]`` holds the iteration's console lines (a
        judge that answered nothing), which ``draco-gym train`` prints under the progress line:
        the algorithm runs in a Tune actor whose own output does not reach the console."""
        self._notes = []
        result = super().train()
        result[NOTE_KEY] = "\n".join(self._notes)
        if self.metrics_log is not None:
            self.metrics_log.add(result)
        self._watch_for_collapse(result)
        return result

    def _watch_for_collapse(self, result: dict) -> None:
        """The collapse alarm (``draco_gym.metrics.success_kl_collapse``): the environment's
        success falling while the KL to the reference climbs. It warns once through this
        module's logger, for a run driven from Python (``draco-gym train``'s console hears it
        from ``runs.ProgressCallback``); the run goes on."""
        self._rows.append(compact(result))
        warning = run_alarms(self._rows).get("collapse")
        if warning is not None and not self._collapse_warned:
            self._collapse_warned = True
            logger.warning(warning)

    def training_step(self) -> None:
        timers: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        start = time.perf_counter()
        pipelined = self.config.run.rollout.pipeline == "one_step"
        if pipelined:
            waited = time.perf_counter()
            groups, sampled, judge_s = self._take_drawn_ahead(self.iteration)
            waited = time.perf_counter() - waited
            with _timed(timers, "sync"):
                self.sync_weights(version=self.iteration)
            self._draw_ahead(self.iteration + 1)
        else:
            groups, sampled = self.sample(self.sample_tasks(self.iteration), seed=self._iteration_seed(self.iteration),
                                          stream_scoring=self.config.run.rollout.scoring == "streaming")
            groups, scored = self.score(groups)
            judge_s = scored["judge"]
        self._stop_on_dead_judge(groups)
        drawn = groups
        if self.config.run.rollout.dynamic_sampling_rounds:
            groups, drawn, sampled, judge_s = self._dynamic_sampling(groups, sampled, judge_s)
        with _timed(timers, "credit"):
            batch = iteration.credit(groups, self.credit_rule())
        with _timed(timers, "learner"):
            self.update(batch)
        if not pipelined:
            with _timed(timers, "sync"):
                self.sync_weights(version=self.iteration + 1)
        if self.rollout_log:
            self.rollout_log.write(groups, iteration=self.iteration, step_advantages=batch.step_advantages)
        timers.update(sampled["timers"], judge=judge_s)
        # what was sampled counts every group drawn; the credit, the groups learned from
        metrics = iteration_metrics(drawn, batch, timers, time.perf_counter() - start, sampled["generated_tokens"])
        if self.config.run.rollout.dynamic_sampling_rounds:
            metrics["env_runners/groups_drawn"] = len(drawn)
            metrics["credit/groups_teaching"] = sum(map(iteration.teaches, groups))
        staleness = [self.iteration - group.policy_version for group in groups]
        metrics["env_runners/policy_staleness_mean"] = float(np.mean(staleness))
        metrics["env_runners/policy_staleness_max"] = max(staleness)
        if pipelined:  # the part of the sampling this iteration did not hide behind the last one's learning
            metrics["timers/waited_for_sample"] = waited
        self._watch_reward_against_outcome(metrics)
        self._log(metrics)

    def _dynamic_sampling(self, groups: list[RolloutGroup], sampled: dict,
                          judge_s: float) -> tuple[list[RolloutGroup], list[RolloutGroup], dict, float]:
        """DAPO's dynamic sampling (``rollout.dynamic_sampling_rounds``): each round samples
        and scores one group per group of the batch that cannot teach
        (``iteration.teaches``), of tasks not yet drawn this iteration where there are
        enough, each round from its own seed (a resumed run draws the same); a group that can
        teach takes the place of the first one that cannot, in batch order. What is still
        left after the last round stays: its rubric may still spread its rewards.

        Returns the batch, every group drawn (the batch's first, in order), the sampling
        figures summed over the rounds and the judge's seconds summed likewise."""
        batch, drawn = list(groups), list(groups)
        rollout = self.config.run.rollout
        for round_ in range(1, rollout.dynamic_sampling_rounds + 1):
            idle = [k for k, group in enumerate(batch) if not iteration.teaches(group)]
            if not idle:
                break
            seen = {group.task_id for group in drawn}
            fresh = [t for t in self._task_ids if t not in seen]
            pool = fresh if len(fresh) >= len(idle) else self._task_ids
            rng = np.random.default_rng([self.config.seed or 0, self.iteration, 2, round_])
            tasks = [pool[i] for i in rng.choice(len(pool), size=len(idle), replace=len(idle) > len(pool))]
            more, more_sampled = self.sample(tasks, seed=self._iteration_seed(self.iteration, round_),
                                             stream_scoring=rollout.scoring == "streaming")
            more, scored = self.score(more)
            self._stop_on_dead_judge(more)
            drawn += more
            judge_s += scored["judge"]
            sampled = {"timers": {phase: sampled["timers"][phase] + more_sampled["timers"].get(phase, 0.0)
                                  for phase in sampled["timers"]},
                       "generated_tokens": sampled["generated_tokens"] + more_sampled["generated_tokens"]}
            for slot, group in zip(idle, [g for g in more if iteration.teaches(g)]):
                batch[slot] = group
        return batch, drawn, sampled, judge_s

    def _draw_ahead(self, iteration: int) -> None:
        """Start sampling and scoring ``iteration`` on the env runners, with the weights they
        hold now, without waiting (``_take_drawn_ahead`` collects it)."""
        tasks = self.sample_tasks(iteration)
        ids, kwargs = self._sample_calls(tasks, seed=self._iteration_seed(iteration),
                                         stream_scoring=self.config.run.rollout.scoring == "streaming", score=True)
        made = self.env_runner_group.foreach_env_runner_async("sample", tag=DRAWN_AHEAD, kwargs=kwargs,
                                                              remote_worker_ids=list(ids))
        if made != len(ids):
            raise RuntimeError(f"{len(ids) - made} of {len(ids)} env runners refused to sample ahead: each must be "
                               "idle (max_requests_in_flight_per_env_runner)")
        self._ahead = (iteration, ids, self.sampler_version)

    def _take_drawn_ahead(self, iteration: int) -> tuple[list[RolloutGroup], dict, float]:
        """The scored groups of ``iteration``: the ones drawn ahead when they are that
        iteration's, else (the first iteration, after a restore or an evaluation) sampled and
        scored now. Returns them, the sampling figures and the judge's seconds."""
        if self._ahead is None or self._ahead[0] != iteration:
            self._drop_drawn_ahead()
            groups, sampled = self.sample(self.sample_tasks(iteration), seed=self._iteration_seed(iteration),
                                          stream_scoring=self.config.run.rollout.scoring == "streaming")
            groups, scored = self.score(groups)
            return groups, sampled, scored["judge"]
        _, ids, version = self._ahead
        outs = self._collect_drawn_ahead(ids)
        return *self._gathered(ids, outs, version), max(out["judge_s"] for out in outs)

    def _collect_drawn_ahead(self, ids: tuple[int, ...]) -> list[dict]:
        self._ahead = None
        answers = dict(self.env_runner_group.fetch_ready_async_reqs(tags=DRAWN_AHEAD, timeout_seconds=None))
        outs = [answers[i] for i in ids if i in answers]
        _check_answered(outs, ids, "returned no episodes")
        return outs

    def _drop_drawn_ahead(self) -> None:
        """Wait for a sample drawn ahead that will not be learned from (its policy was
        replaced, or the run ends) and drop it: the env runners are free again."""
        if self._ahead is not None:
            self._collect_drawn_ahead(self._ahead[1])

    def _stop_on_dead_judge(self, groups: list[RolloutGroup]) -> None:
        """A judge that answers nothing would zero every reward in silence (the policy then
        learns nothing, or learns from the fallback): the run stops, naming the server, when
        each of the last ``reward.dead_judge_groups`` groups had every judge request fail.
        Before that, the first iteration in which every judge call failed names the judge at
        once, in one console line (``judge_health.judge_down``), however many groups ``k`` is."""
        down = judge_down([group.score for group in groups])
        if down is not None and not self._judge_down_named:
            logger.warning("iteration %d: %s", self.iteration + 1, down)  # Tune's training_iteration
            self._notes.append(f"warning: {down}")  # printed under the iteration's progress line
        self._judge_down_named = down is not None
        self._judged.extend(group.score for group in groups)
        message = dead_judge(list(self._judged), k=self.config.run.reward.dead_judge_groups)
        if message is not None:
            raise DeadJudge(message)

    def _watch_reward_against_outcome(self, metrics: dict[str, Any]) -> None:
        """The reward-hacking alarm (``draco_gym.metrics.reward_outcome_divergence``): the
        training reward rising while the environment's outcome falls, over the last
        iterations. It warns once and sets ``judge/reward_outcome_divergence`` to 1; the run
        goes on, since the outcome is only the environment's view of the task."""
        self._reward_and_outcome.append((metrics["env_runners/episode_return_mean"],
                                         metrics.get(f"env_runners/env/{OUTCOME}")))
        alarm = reward_outcome_divergence(*map(list, zip(*self._reward_and_outcome)))
        metrics["judge/reward_outcome_divergence"] = float(alarm is not None)
        if alarm is not None and not self._divergence_warned:
            self._divergence_warned = True
            logger.warning(reward_hacking_warning(self.iteration, *alarm))

    def sample_tasks(self, iteration: int) -> list[str]:
        """``tasks_per_iteration`` task ids, drawn from the iteration's own seed (a resumed run
        draws the same tasks)."""
        rng = np.random.default_rng([self.config.seed or 0, iteration])
        k = self.config.run.rollout.tasks_per_iteration
        picks = rng.choice(len(self._task_ids), size=k, replace=k > len(self._task_ids))
        return [self._task_ids[i] for i in picks]

    def _iteration_seed(self, iteration: int, round_: int = 0) -> int:
        """The sampling seed of ``iteration``; ``round_`` > 0: of its dynamic-sampling round."""
        extra = [round_] if round_ else []
        return int(np.random.default_rng([self.config.seed or 0, iteration, 1, *extra]).integers(2**31 - 1))

    def sample(self, tasks: list[str], *, seed: int, temperature: float | None = None,
               group_size: int | None = None, stream_scoring: bool = False) -> tuple[list[RolloutGroup], dict]:
        """G episodes of each task with the current policy, the tasks sharded over the env
        runners. Returns the groups (unscored, in task order, each with the ``policy_version``
        that drew it) and the slowest runner's phase times (runners work in parallel) and the
        tokens generated. ``stream_scoring``: each runner hands a group to its reward as soon
        as the group's episodes end, and ``score`` then waits only for the groups still being
        judged."""
        self._drop_drawn_ahead()
        ids, kwargs = self._sample_calls(tasks, seed=seed, temperature=temperature, group_size=group_size,
                                         stream_scoring=stream_scoring)
        outs = _call_env_runners(self.env_runner_group, "sample", ids, kwargs)
        _check_answered(outs, ids, "returned no episodes")
        return self._gathered(ids, outs, self.sampler_version)

    def _sample_calls(self, tasks: list[str], *, seed: int, temperature: float | None = None,
                      group_size: int | None = None, stream_scoring: bool = False,
                      score: bool = False) -> tuple[tuple[int, ...], list[dict]]:
        """The env runners to call and, for each, its ``LLMEnvRunner.sample`` keywords: its
        share of the tasks and its own seed."""
        ids, shards = _shard(self.env_runner_group, tasks)
        # Exactly one kwargs dict per actor: foreach_env_runner drops the dicts beyond that.
        return ids, [{"tasks": shard, "group_size": group_size or self.config.run.rollout.group_size, "seed": seed + 7919 * i,
                      "temperature": temperature, "stream_scoring": stream_scoring, "score": score}
                     for i, shard in enumerate(shards)]

    def _gathered(self, ids: tuple[int, ...], outs: list[dict], version: int) -> tuple[list[RolloutGroup], dict]:
        # Which weights each runner sampled with: the newest, after a sync (tests check it).
        self.sampled_weights = {i: {"seq_no": out[WEIGHTS_SEQ_NO], "digest": out["weights_digest"],
                                    "node_id": out["node_id"]} for i, out in zip(ids, outs)}
        timers = {phase: max(out["timers"][phase] for out in outs) for phase in outs[0]["timers"]}
        groups = [g.drawn_by(version) for out in outs for g in out["groups"]]
        return groups, {"timers": timers, "generated_tokens": sum(out["generated_tokens"] for out in outs)}

    def score(self, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], dict]:
        """The groups with their scores (new groups; the given ones stay unscored) and the
        slowest runner's judge seconds. The env runners score in parallel, the groups sharded
        over them as ``sample`` shards tasks, so each runner scores the groups it sampled (a
        self-judge judges with that runner's policy copy)."""
        ids, shards = _shard(self.env_runner_group, groups)
        outs = _call_env_runners(self.env_runner_group, "score", ids, [{"groups": shard} for shard in shards])
        _check_answered(outs, ids, "returned no scores")
        scored = [g for out in outs for g in out["groups"]]
        if [g.task_id for g in scored] != [g.task_id for g in groups]:
            raise RuntimeError(f"the env runners returned {len(scored)} scored groups for the {len(groups)} sent, "
                               "not the same ones in the same order")
        return scored, {"judge": max((out["seconds"] for out in outs), default=0.0)}

    def credit_rule(self):
        """The configured credit rule, built with the configured options plus what only the
        trainer can supply, for what the rule declares it needs (``credit_spec(name).needs``):
        ``Need.CONTINUATIONS``, continuations of the current policy from a restored prefix run
        on an env runner (ProVer), and ``Need.BASE_POLICY``, a frozen reference that defaults
        to the initial policy, the base model (TRACE)."""
        credit = self.config.run.credit
        return get_credit_rule(credit.name, turns_without_code=credit.turns_without_code, **self.credit_options())

    def credit_options(self) -> dict:
        credit = self.config.run.credit
        options = dict(credit.options)
        spec = credit_spec(credit.name)
        for need, keyword in spec.trainer_inputs(spec.parse(options)[0]).items():
            if options.get(keyword) is not None:
                continue
            if need is Need.CONTINUATIONS:
                from draco_gym.algos.credit.prover import env_runner_continuations

                options[keyword] = env_runner_continuations(self.env_runner_group)
            elif need is Need.BASE_POLICY:
                options[keyword] = self.config.model_path
        return options

    def update(self, batch: CreditedBatch) -> None:
        """One learner step per minibatch of trajectories, ``num_epochs`` times, over the
        trajectories the loss takes (``CreditedBatch.learned``: no ``env_error`` episode)."""
        optim = self.config.run.optim
        arrays = iteration.to_batch(batch, pad_id=0)
        if arrays is None:  # every group was skipped: nothing to learn from this iteration
            return
        # (one_step: the drawing policy is an update behind the learner; only the sampler has its log-probs)
        default = self.config.run.policy.sampler == "vllm" and self.config.run.rollout.pipeline == "off"
        if optim.recompute_old_logprobs or (optim.recompute_old_logprobs is None and default):
            results = self.learner_group.foreach_learner(
                lambda learner, b=arrays: learner.policy_logprobs(b, DEFAULT_MODULE_ID))
            first = next(iter(results))  # a list (local learner) or RemoteCallResults
            learner_logp = first.get() if hasattr(first, "get") else first
            self._log_sampler_agreement(arrays, learner_logp)
            arrays["old_logp"] = learner_logp
        n = len(arrays["input_ids"])
        size = self.config.minibatch_size or n
        n_learners = len(self.learner_group)  # 0: the local learner
        results = []
        for _ in range(self.config.num_epochs):
            for start in range(0, n, size):
                part = {k: v[start : start + size] for k, v in arrays.items()}
                timesteps = {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                    (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)}
                if n_learners:  # each remote learner its own rows; they all-reduce the gradient
                    results.append(self.learner_group.update(
                        batches=[_module_batch(shard) for shard in shard_rows(part, n_learners)],
                        num_epochs=1, timesteps=timesteps))
                else:
                    results.append(self.learner_group.update(batch=_module_batch(part), num_epochs=1,
                                                             timesteps=timesteps))
        for result in results:
            self.metrics.aggregate(result if isinstance(result, list) else [result], key=LEARNER_RESULTS)

    def _log_sampler_agreement(self, arrays: dict, learner_logp) -> None:
        """How far the sampler's log-probs of the sampled tokens are from the learner's, before
        the update: the largest absolute difference, and the largest deviation from 1 of the
        importance ratio the first minibatch would see with the sampler's as old log-probs
        (``learners/__all_modules__/sampler_logp_max_abs_diff`` and ``.../sampler_ratio_max_abs_dev``:
        RLlib's place for a learner statistic of no one module)."""
        mask = arrays["policy_mask"][:, 1:].astype(bool)
        gap = (np.asarray(learner_logp, np.float64)[:, 1:] - np.asarray(arrays["old_logp"], np.float64)[:, 1:])[mask]
        diff = float(np.abs(gap).max()) if gap.size else 0.0
        ratio = float(np.abs(np.expm1(gap)).max()) if gap.size else 0.0
        self.metrics.log_value((LEARNER_RESULTS, ALL_MODULES, "sampler_logp_max_abs_diff"), diff, window=1)
        self.metrics.log_value((LEARNER_RESULTS, ALL_MODULES, "sampler_ratio_max_abs_dev"), ratio, window=1)

    def sync_weights(self, *, version: int | None = None) -> None:
        """The learner's LoRA weights to every env runner: the next rollouts are on-policy.
        ``version``: the updates in those weights (default: the iterations done)."""
        self._drop_drawn_ahead()
        self.env_runner_group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True,
                                           timeout_seconds=self.config.run.resources.sync_timeout_s)
        self._sampler_version = version

    @property
    def sampler_version(self) -> int:
        """The updates in the weights the env runners sample with (a group's ``policy_version``)."""
        return self.iteration if self._sampler_version is None else self._sampler_version

    def restore_from_path(self, path, *args, **kwargs) -> None:
        """RLlib's restore of a complete checkpoint (an incomplete one raises
        ``CheckpointError`` naming what it lacks, before anything is read), then the restored
        adapter pushed to every env runner, waiting for each. RLlib's own push after a restore
        does not wait, and is dropped while an earlier push to that runner is still in flight
        (one request per runner at a time), and a runner keeps weights newer than the ones it
        is sent: either way the first iteration after a restore would sample with the wrong
        policy. An adapter trained on another base model than this algorithm's is refused
        (``models.check_adapter_base``), naming both."""
        if kwargs.get("filesystem") is None and "://" not in str(path):
            path = local_path(path)
            if not args and kwargs.get("component") is None:
                require_complete(path)
            check_adapter_base(Path(path) / ADAPTER_DIR, self.config.model_path,
                               fix=f"build the algorithm with .policy(model={str(adapter_base(Path(path) / ADAPTER_DIR))!r})")
        self._drop_drawn_ahead()
        super().restore_from_path(path, *args, **kwargs)
        self._sampler_version = None
        state = self.learner_group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}",
                                             inference_only=True)[COMPONENT_LEARNER]
        restored = {COMPONENT_RL_MODULE: ray.put(state[COMPONENT_RL_MODULE]), WEIGHTS_SEQ_NO: state[WEIGHTS_SEQ_NO],
                    RESTORED: True}
        group = self.env_runner_group
        if group.num_remote_workers():
            group.foreach_env_runner("set_state", local_env_runner=False, kwargs={"state": restored},
                                     timeout_seconds=self.config.run.resources.sync_timeout_s)
        if group.local_env_runner is not None:
            group.local_env_runner.set_state(restored)

    def _log(self, metrics: dict[str, Any]) -> None:
        """The iteration's metrics into RLlib's result tree (``env_runners/episode_return_mean``
        lands in ``result["env_runners"]["episode_return_mean"]``), plus RLlib's lifetime
        counters, which a checkpoint carries over."""
        for key, value in metrics.items():
            self.metrics.log_value(tuple(key.split("/")), value, window=1)
        for counter, lifetime in ((NUM_ENV_STEPS_SAMPLED, NUM_ENV_STEPS_SAMPLED_LIFETIME),
                                  (NUM_EPISODES, NUM_EPISODES_LIFETIME)):
            self.metrics.log_value((ENV_RUNNER_RESULTS, lifetime), metrics[f"{ENV_RUNNER_RESULTS}/{counter}"],
                                   reduce="lifetime_sum")

    def cleanup(self) -> None:
        """RLlib's, once a sample drawn ahead is in (at most one iteration's sampling: the
        env runners finish it before they can stop)."""
        try:
            self._drop_drawn_ahead()
        except Exception:  # noqa: BLE001 - a runner that failed is stopped all the same
            logger.exception("the sample drawn ahead failed; stopping anyway")
        super().cleanup()

    # -- checkpoints ---------------------------------------------------------------------------

    @classmethod
    def from_checkpoint(cls, path, filesystem=None, **kwargs) -> GRPO:
        """RLlib's ``from_checkpoint``, a relative folder taken from the current directory
        (``Algorithm.from_checkpoint`` itself needs an absolute path or a URI)."""
        return super().from_checkpoint(local_path(path) if filesystem is None else path, filesystem=filesystem,
                                       **kwargs)

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint (``Algorithm.from_checkpoint`` restores it, optimizer and
        iteration included) plus the trained policy in PEFT's format under ``adapter/``:
        ``PeftModel.from_pretrained(base_model, CHECKPOINT/adapter)`` opens it, and vLLM serves
        it as a LoRA module (``--enable-lora --lora-modules NAME=CHECKPOINT/adapter``).

        On a local path it is written into a hidden sibling, sealed (``checkpoints.seal``:
        the file list written last) and renamed onto ``path``: a kill leaves the previous
        checkpoint at ``path`` or the new one, complete. Remote storage (``filesystem``, a
        URI) gets RLlib's own write, without the seal."""
        if filesystem is not None or "://" in str(path or ""):
            return super().save_to_path(path, state=state, filesystem=filesystem, use_msgpack=use_msgpack)
        final = Path(local_path(path) if path is not None else tempfile.mkdtemp())
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_dir(final)
        try:
            super().save_to_path(str(staging), state=state, use_msgpack=use_msgpack)
            self.export_adapter(staging / ADAPTER_DIR)
            seal(staging, iteration=(state or {}).get(TRAINING_ITERATION, self.iteration))
            install(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return str(final)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Tune's checkpoints. Tune has a class trainable write into a temporary folder, then
        copies that folder to the trial's ``checkpoint_<index>`` (pyarrow's threaded copy: a
        kill mid-copy leaves that folder with some of the files). On local storage the
        checkpoint is written straight to where Tune puts it instead, staged and renamed
        (``save_to_path``); the temporary folder stays empty and Tune's copy adds nothing."""
        self._tune_checkpoint = _tune_checkpoint_dir(getattr(self, "_storage", None))
        self.save_to_path(str(self._tune_checkpoint or checkpoint_dir),
                          use_msgpack=self.config._use_msgpack_checkpoints)

    def save(self, checkpoint_dir: str | None = None):
        """Tune's ``save``: a relative folder is taken from the current directory, as any path
        (RLlib's storage layer reads a relative one as a URI without a scheme and fails); then
        a check that Tune registered the checkpoint where it was written."""
        result = super().save(local_path(checkpoint_dir) if checkpoint_dir else checkpoint_dir)
        written, self._tune_checkpoint = self._tune_checkpoint, None
        registered = getattr(getattr(result, "checkpoint", None), "path", None)
        if written is not None and registered is not None and Path(registered).resolve() != written.resolve():
            raise RuntimeError(f"Tune registered checkpoint {registered}, but it was written to {written}: "
                               "this Ray version names its checkpoint folders differently")
        return result

    def export_adapter(self, path: str | Path) -> str:
        """The learner's LoRA adapter, written by the learner (one writer among several)."""
        target = str(Path(path).resolve())

        def save(learner, target=target):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
                return None
            module = learner.module[DEFAULT_MODULE_ID]
            return getattr(module, "unwrapped", lambda: module)().save_adapter(target)

        for result in self.learner_group.foreach_learner(save):
            if hasattr(result, "get"):  # a remote learner's: raises its error, if any
                result.get()
        return target

    # -- beyond training -----------------------------------------------------------------------

    def rollout(self, task_ids: list[str], *, group_size: int = 1, temperature: float | None = None,
                score: bool = True, seed: int = 0) -> list[RolloutGroup]:
        """Episodes of the given tasks with the current policy, no update (evaluation).

        Sampled at most a training iteration's episodes at a time (``rollout_chunks``): an
        env runner's memory grows with the episodes it samples at once (their KV cache, one
        environment each), and an evaluation of every held-out task in one call would peak
        far above the training it evaluates. Each chunk has a seed of its own, the same for
        the same tasks, so two policies evaluated with one seed still meet the same episodes."""
        rows = self.config.run.rollout.group_size * self.config.run.rollout.tasks_per_iteration
        out: list[RolloutGroup] = []
        chunks = rollout_chunks(list(task_ids), group_size, rows)
        started = time.perf_counter()
        for k, chunk in enumerate(chunks):
            groups, _ = self.sample(chunk, seed=seed + CHUNK_SEED_STRIDE * k, temperature=temperature,
                                    group_size=group_size)
            out += self.score(groups)[0] if score else groups
            if len(chunks) > 1:  # an evaluation takes minutes on a CPU: show that it moves
                done = sum(len(g.trajectories) for g in out)
                print(f"  evaluation: {done} of {len(task_ids) * group_size} episodes "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
        return out


# Seeds of consecutive evaluation chunks lie this far apart (a prime above any chunk's episodes,
# so no two episodes of an evaluation share a seed).
CHUNK_SEED_STRIDE = 104_729


def rollout_chunks(task_ids: list[str], group_size: int, max_episodes: int) -> list[list[str]]:
    """``task_ids`` cut into consecutive chunks of as even size as they divide, each of at most
    ``max_episodes`` episodes (``group_size`` per task; a task whose group alone is larger
    makes a chunk of its own)."""
    if not task_ids:
        return []
    per_chunk = max(1, max_episodes // max(1, group_size))
    n = -(-len(task_ids) // per_chunk)
    return [list(part) for part in np.array_split(np.array(task_ids, dtype=object), n)]


# The id of the env runner in the trainer's own process (``num_env_runners: 0``), RLlib's.
LOCAL_RUNNER = 0


def _shard(runners, items: list) -> tuple[tuple[int, ...], tuple[list, ...]]:
    """Consecutive items per healthy env runner, as even as they divide; a runner left without
    one (fewer items than runners) is not called. Without remote runners, every item goes to
    the trainer's own (``LOCAL_RUNNER``)."""
    healthy = runners.healthy_env_runner_ids()
    if not healthy and runners.local_env_runner is not None:
        return (LOCAL_RUNNER,), (list(items),)
    if not healthy:
        raise RuntimeError("no healthy env runner to sample with")
    cuts = np.array_split(np.arange(len(items)), len(healthy))
    ids, shards = zip(*[(i, [items[k] for k in cut]) for i, cut in zip(healthy, cuts) if len(cut)])
    return ids, shards


def _call_env_runners(runners, method: str, ids: tuple[int, ...], kwargs: list[dict]) -> list:
    """``method`` on each env runner of ``ids`` with its keywords (one dict per runner), in
    parallel, the answers in ``ids``' order; the trainer's own runner is called in place."""
    if ids == (LOCAL_RUNNER,) and runners.local_env_runner is not None:
        return [getattr(runners.local_env_runner, method)(**kwargs[0])]
    return runners.foreach_env_runner(method, local_env_runner=False, remote_worker_ids=list(ids), kwargs=kwargs)


def _check_answered(outs: list, ids: tuple[int, ...], what: str) -> None:
    if len(outs) != len(ids):  # a runner lost without a Ray error (a dead one raises its own)
        raise RuntimeError(f"{len(ids) - len(outs)} of {len(ids)} env runners {what}; see the Ray logs (a runner "
                           "killed by Ray's memory monitor says so there)")


def local_path(path) -> str:
    """A checkpoint location as RLlib's storage layer takes it: a URI (``s3://...``) as it is,
    a local path made absolute here, in the driver (a learner resolves nothing against its own
    working directory)."""
    text = str(path)
    return text if "://" in text else str(Path(text).expanduser().resolve())


def _tune_checkpoint_dir(storage) -> Path | None:
    """The folder Tune is about to persist this trial's next checkpoint to, when its storage is
    a local filesystem (None otherwise, or outside Tune)."""
    if storage is None:
        return None
    import pyarrow.fs
    from ray.train._internal.storage import StorageContext

    if not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return None
    return Path(storage.trial_fs_path) / StorageContext._make_checkpoint_dir_name(storage.current_checkpoint_index + 1)


def shard_rows(batch: dict, n: int) -> list[dict]:
    """A minibatch (numpy arrays [rows, width]) cut into ``n`` shards of consecutive rows,
    one per learner, as even as the rows allow. A learner left without rows still takes
    part in the gradient all-reduce: its shard is one padding token with no policy token."""
    shards = []
    for rows in np.array_split(np.arange(len(batch["input_ids"])), n):
        if len(rows):
            shards.append({k: v[rows] for k, v in batch.items()})
        else:
            empty = {k: np.zeros((1, 1), v.dtype) for k, v in batch.items()}
            empty["attention_mask"][:] = 1
            shards.append(empty)
    return shards


def _module_batch(arrays: dict) -> MultiAgentBatch:
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(arrays)}, env_steps=len(arrays["input_ids"]))


@contextmanager
def _timed(timers: dict[str, float], phase: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timers[phase] += time.perf_counter() - start


def _grpo_with_default_config():
    return GRPO, GRPO.get_default_config()


def register_with_tune() -> None:
    """Make ``tune.Tuner("GRPO", ...)`` work, in this Ray session and in every later one.

    ``draco-gym train`` calls it where it starts Ray; from Python, call it once before
    ``tune.Tuner("GRPO", ...)`` (or pass the class: ``tune.Tuner(GRPO, ...)``). Tune keeps
    its trainables in the Ray session, so a plain ``register_trainable`` is lost after
    ``ray.shutdown()``; RLlib re-registers the algorithms of its own table whenever Tune
    meets an unknown name, so GRPO joins that table too.
    """
    from ray.rllib.algorithms.registry import ALGORITHMS
    from ray.tune.registry import register_trainable

    ALGORITHMS.setdefault("GRPO", _grpo_with_default_config)
    register_trainable("GRPO", GRPO)


__all__ = ["ADAPTER_DIR", "GRPO", "ConfigError", "GRPOConfig", "register_with_tune"]
