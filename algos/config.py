"""The run schema: every knob of a GRPO run, declared once with its default, bound and meaning.

Two doors lead to the same declarations:

- a YAML file (``draco-gym train CONFIG.yaml``): ``load_config`` reads it into a ``RunConfig``,
  the sections below, and rejects an unknown key with the closest known one;
- Python: ``GRPOConfig().training(group_size=4, ...)`` fills in the same ``RunConfig``
  (``GRPOConfig.run``; the keyword is the field's name) and ``GRPOConfig.validate`` checks it
  against the same fields. The trainer reads every knob from there (``config.run.rollout``,
  ``config.run.optim``).

``python -m draco_gym.algos.config`` prints every key with its default and meaning. A file
may start with ``base: other.yaml`` (a path relative to it) and override only what follows,
merged key by key; a section that names a different component (``reward: {name: ...}``)
replaces the base's section instead of merging into it.

A judge's API key never goes in the file: give the *name* of the environment variable that
holds it (``api_key_env``); a literal ``api_key`` is rejected, so keys cannot reach logs,
checkpoints or saved rollouts through the config.

Importing this module loads neither torch nor Ray: ``draco-gym train --check`` stays fast.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from draco_gym.algos.credit.core import TurnsWithoutCode


class ConfigError(ValueError):
    """A config is invalid; the message names the file (or ``GRPOConfig``) and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class EnvSection(_Section):
    id: str | Callable[..., Any] = Field(description="a registered Gymnasium id, 'module:id' (the module registers "
                                                     "the id) or 'module:Class'; from Python also an env class or a "
                                                     "creator function")
    config: dict[str, Any] = Field(default_factory=dict, description="the environment's constructor keyword arguments")
    modules: list[str] = Field(default_factory=list, description="modules imported before the env is looked up, in "
                                                                 "the driver and in every env runner: the ones that "
                                                                 "call gym.register for your own ids")
    task_ids: list[str] | None = Field(None, description="train on these tasks; null: every task the env lists "
                                                         "(its task_ids); either way reset(options={task_id: ...}) "
                                                         "starts one")


class LoraSection(_Section):
    r: int = Field(16, ge=1, description="LoRA rank")
    alpha: float = Field(32, gt=0, description="LoRA scale numerator (scale = alpha / r)")
    target_modules: str | list[str] = Field("all-linear", description="modules that get an adapter")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout (0: the sampler's and learner's log-probs agree)")


class PolicySection(_Section):
    model: str = Field(description="a local HF directory (a relative path is taken from the folder the command "
                                   "runs in) or the alias 'smollm2-135m-instruct'")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights' dtype")
    lora: LoraSection = Field(default_factory=LoraSection, description="the trained adapter")
    sampler: Literal["torch", "vllm"] = Field("torch", description="torch: transformers in the env runner; vllm: a vLLM "
                                                                   "engine actor per env runner (draco-gym setup vllm)")
    vllm_kv_cache_gib: int = Field(1, ge=1, description="vllm on CPU: the engine's KV cache, GiB (VLLM_CPU_KVCACHE_SPACE)")
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="vllm on GPU: the share of its GPU "
                                                                             "the engine takes")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer in the backward (learner "
                                                            "and warm start): less activation memory, one more forward")
    torch_threads: int | None = Field(None, ge=1, description="intra-op threads per process (null: Ray's, one per "
                                                              "reserved CPU; a trial with no env runner or learner "
                                                              "actor reserves every CPU of the Ray its command starts)")

    @field_validator("model")
    @classmethod
    def _absolute(cls, value):
        from draco_gym.algos.policy.models import model_location

        return model_location(value)


class EpisodeLimits(_Section):
    """Token budgets of one episode. ``max_response_tokens`` counts everything after the
    prompt (sampled turns and observations): when it runs out the episode ends as ``length``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(1024, ge=1, description="tokens per assistant turn")
    max_prompt_tokens: int = Field(4096, ge=1, description="the first prompt, left-truncated")
    max_response_tokens: int = Field(24576, ge=1, description="everything after the prompt; beyond: termination 'length'")


class RolloutSection(EpisodeLimits):
    group_size: int = Field(6, ge=2, description="G episodes per task (a group of one has no baseline)")
    tasks_per_iteration: int = Field(16, ge=1, description="tasks drawn per iteration (seeded by the iteration)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0: greedy)")
    scoring: Literal["streaming", "sequential"] = Field(
        "streaming", description="streaming: a group goes to the reward as soon as its G episodes end, judged while "
                                 "the others sample (same rewards); sequential: every group after the rollout. A "
                                 "self-judge (judge: policy) is always sequential: it judges with the policy copy "
                                 "that samples")
    pipeline: Literal["off", "one_step"] = Field(
        "off", description="one_step: the env runners sample and score iteration k+1 with the weights they hold (one "
                           "update behind) while the learner trains on iteration k; the loss's ratio takes the "
                           "drawing policy's log-probs, each rollout records its policy_version. off: each iteration "
                           "samples with the newest weights")
    dynamic_sampling_rounds: int = Field(
        0, ge=0, description="DAPO's dynamic sampling: up to this many extra sampling rounds per iteration, each "
                             "drawing other tasks for the groups that cannot teach (every episode the same outcome; "
                             "for an environment without one, the same reward), which the first group found that "
                             "can teach replaces in the batch. 0: off. Not with pipeline: one_step")


class NamedSection(_Section):
    name: str = Field(description="a registered name")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the component")


class PolicyJudgeOptions(_Section):
    """``reward.options.judge: {name: policy, ...}``: the self-judge (the policy judges its own
    rollouts, ``draco_gym.algos.policy.self_judge``). The paper's cheap variant is ``thinking: off``
    with ``score_samples: 1`` beside it in ``reward.options``."""

    name: Literal["policy"] = "policy"
    thinking: bool = Field(True, description="the paper's thinking switch (on|off), passed to the chat template as "
                                             "enable_thinking (Qwen3); templates without it ignore it")
    thinking_tokens: int = Field(1024, ge=1, description="most tokens of reasoning before the answer (thinking on)")
    constrained: bool = Field(True, description="decode each answer under the stage's JSON schema (llguidance)")
    max_prompt_tokens: int = Field(6144, ge=256, description="prompt budget; over it the rollouts are shortened in "
                                                             "their middle, never the rules, task or rubric")


class RewardSection(NamedSection):
    name: str | Callable[..., Any] = Field("rule", description="a name in draco_gym.reward.REWARDS; from Python also "
                                                               "a factory called with the options")

    @field_validator("name")
    @classmethod
    def _known(cls, value):
        from draco_gym.reward import REWARDS

        if isinstance(value, str) and value not in REWARDS:
            raise ValueError(REWARDS.unknown(value))
        return value

    dead_judge_groups: int = Field(3, ge=1, description="stop the run (naming the judge's server) once this many "
                                   "groups in a row had every judge request fail")

    @field_validator("options")
    @classmethod
    def _no_secrets(cls, value):
        reject_literal_secrets(value, "reward.options")
        judge = value.get("judge")
        if judge == "policy" or (isinstance(judge, dict) and judge.get("name") == "policy"):
            options = {} if judge == "policy" else judge
            try:
                value = {**value, "judge": PolicyJudgeOptions.model_validate(options).model_dump()}
            except ValidationError as exc:
                raise ValueError("; ".join(f"judge.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                           for e in exc.errors())) from None
        return value


class CreditSection(NamedSection):
    name: str = Field("draco", description="a name in draco_gym.algos.credit.CREDIT_RULES")
    options: dict[str, Any] = Field(default_factory=dict, description="the rule's options (its declaration, "
                                    "draco_gym.algos.credit.credit_spec(name).options, gives each with its default)")
    turns_without_code: TurnsWithoutCode = Field(
        "trajectory", description="a credit step is one code block (the paper's step); a turn without one (the "
        "closing message) is shown to the judge but gets the trajectory's A_i (trajectory, ours), joins the "
        "preceding code step's tokens and citations (attach, ours) or is a gap token with advantage 0 (gap, the "
        "paper's letter)")

    @field_validator("name")
    @classmethod
    def _known(cls, value):
        from draco_gym.algos.credit import CREDIT_RULES

        if value not in CREDIT_RULES:
            raise ValueError(CREDIT_RULES.unknown(value))
        return value

    @field_validator("options")
    @classmethod
    def _options_taken(cls, value, info):
        if "name" in info.data:  # else the name's own error says what is wrong
            check_credit_options(info.data["name"], value)
        return value


def check_credit_options(name: str, options: dict[str, Any]) -> None:
    """Every option is one the rule declares, with a value its options model accepts: checked
    where the config is read, not when the first iteration builds the rule on the driver after
    the env runners have sampled."""
    from draco_gym.algos.credit import credit_spec

    credit_spec(name).parse(options)


class LossConfig(_Section):
    """The policy loss's knobs (``algos/policy/loss.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_low: float = Field(0.2, ge=0, lt=1, description="eps_low of the ratio clip")
    clip_high: float = Field(0.2, ge=0, description="eps_high of the ratio clip")
    dual_clip: float = Field(3.0, ge=0, description="c of the dual clip for negative advantages; 0 turns it off")
    kl_coeff: float = Field(0.01, ge=0, description="beta of the k3 KL to the base model (adapter off)")

    @field_validator("dual_clip")
    @classmethod
    def _dual(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError("dual_clip must be 0 (off) or > 1")
        return value


class OptimSection(LossConfig):
    model_config = ConfigDict(extra="forbid", frozen=False)

    lr: float = Field(5e-5, gt=0, description="AdamW learning rate (constant)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    grad_clip: float | None = Field(1.0, gt=0, description="global-norm gradient clip (null: off)")
    minibatch_size: int | None = Field(8, ge=1, description="trajectories per optimizer step (null: all)")
    num_epochs: int = Field(1, ge=1, description="passes over the iteration's trajectories")
    micro_batch_tokens: int = Field(4096, ge=16, description="gradient accumulation unit, in padded tokens")
    recompute_old_logprobs: bool | None = Field(None, description="old log-probs from the learner instead of the "
                                                                  "sampler (null: only with the vllm sampler, "
                                                                  "and never with rollout.pipeline: one_step)")
    share_prefix: bool = Field(True, description="compute a group's shared prompt once in the learner (exact; "
                                                 "falls back, with the reason logged, where a model cannot)")


class ResourcesSection(_Section):
    num_env_runners: int = Field(1, ge=0, description="rollout actors (0: the training process samples too, on "
                                                      "the learner's copy of the base weights: one process fewer)")
    num_cpus_per_env_runner: float = Field(1, ge=0, description="CPUs Ray reserves per env runner")
    num_gpus_per_env_runner: float = Field(0, ge=0, description="GPUs Ray reserves per env runner")
    num_learners: int = Field(0, ge=0, description="learner actors (0: the learner lives in the training process)")
    num_gpus_per_learner: float = Field(0, ge=0, description="GPUs per learner")
    sync_timeout_s: float = Field(300.0, gt=0, description="seconds a weight sync to the env runners may take")
    custom_resources_per_env_runner: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each env runner needs: on a cluster, places the "
                                          "runners on the nodes that offer them (e.g. {appworld: 1})")
    ray_address: str | None = Field(None, description="join this running Ray cluster ('auto', 'HOST:6379', "
                                                      "'ray://HOST:10001'); null: $RAY_ADDRESS if set, else the "
                                                      "command starts a local Ray")
    ray_num_cpus: int | None = Field(None, ge=1, description="ray.init(num_cpus=...) when the command starts Ray")
    object_store_memory_mb: int = Field(256, ge=75, description="Ray's object store when the command starts Ray")
    allocator: Literal["mimalloc", "system"] = Field(
        "mimalloc", description="the heap allocator of the processes that hold the policy (the Ray workers of a "
                                "Ray this command starts, the warm start's and evaluations' processes): mimalloc "
                                "(Linux, the cmeel-mimalloc wheel) peaks 0.4-0.5 GiB lower in the trainer than "
                                "the C library's (system) at the same speed")


class CheckpointSection(_Section):
    every: int = Field(1, ge=1, description="iterations between checkpoints")
    keep: int | None = Field(2, ge=1, description="checkpoints kept (null: all)")


class EvalSection(_Section):
    env_config: dict[str, Any] = Field(default_factory=dict, description="merged over env.config")
    task_ids: list[str] | None = Field(None, description="null: every task of the (eval) env")
    max_tasks: int | None = Field(None, ge=1, description="only the first N of them")
    episodes_per_task: int = Field(1, ge=1, description="n runs per task: pass@k / pass^k for k = 1..n (paper: 3)")
    temperature: float = Field(0.0, ge=0, description="0: greedy")
    score: bool = Field(False, description="also run the reward on each task's episodes")
    success_metric: str = Field("success", description="the env metric that means 'solved'")
    splits: list[str] | None = Field(None, description="evaluate each split (env config `split`) apart, e.g. "
                                     "[test_normal, test_challenge]; splits the data lacks are skipped and "
                                     "recorded; null: the env config's own")
    last_checkpoints: int = Field(1, ge=1, description="`--checkpoint last` takes the run's last N checkpoints and "
                                  "reports each split's mean over them (paper: 3)")


class WandbSection(_Section):
    """Weights & Biases through Tune's ``WandbLoggerCallback``."""

    project: str = Field(description="the W&B project")
    mode: Literal["online", "offline"] = Field("online", description="offline: the run folder is written under the "
                                                                    "trial folder, for `wandb sync` later")
    entity: str | None = Field(None, description="team or user (null: the key's default)")
    group: str | None = Field(None, description="run group (null: the run name)")
    api_key_env: str = Field("WANDB_API_KEY", description="the environment variable holding the API key (online "
                                                         "mode; `wandb login` works too), never the key itself")
    upload_checkpoints: bool = Field(False, description="also upload each checkpoint as a W&B artifact")


class MlflowSection(_Section):
    """MLflow through Tune's ``MLflowLoggerCallback``."""

    tracking_uri: str | None = Field(None, description="a tracking server URL or sqlite:///PATH/mlflow.db "
                                                       "(null: sqlite:///OUTPUT_DIR/mlflow.db)")
    experiment_name: str | None = Field(None, description="null: the run name")
    save_artifacts: bool = Field(True, description="upload the trial folder (plots, params, progress) at the end")
    tracking_token_env: str = Field("MLFLOW_TRACKING_TOKEN", description="the environment variable holding a "
                                                                       "server's token, never the token itself")


class LoggingSection(_Section):
    """Trackers beside the TensorBoard files Tune always writes."""

    wandb: WandbSection | None = Field(None, description="{project, mode: online|offline, entity, group, "
                                                         "api_key_env, upload_checkpoints}")
    mlflow: MlflowSection | None = Field(None, description="{tracking_uri, experiment_name, save_artifacts, "
                                                           "tracking_token_env}")

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data):
        reject_literal_secrets(data, "logging")
        return data


# The groups of a result, RLlib's new API stack shape (``rllib/reporting.py`` fills them).
RESULT_GROUPS = ("env_runners", "learners", "judge", "credit", "timers")
# Top-level keys of every result (Tune's and RLlib's), usable as stop criteria too.
RESULT_TOP_KEYS = ("training_iteration", "time_this_iter_s", "time_total_s", "num_training_step_calls_per_iteration")


def check_stop(stop: dict[str, float]) -> dict[str, float]:
    """Stop criteria are result keys as Tune spells them (``env_runners/episode_return_mean``):
    a top-level key or one under a result group."""
    for key in stop:
        if key in RESULT_TOP_KEYS or (key.split("/", 1)[0] in RESULT_GROUPS and "/" in key):
            continue
        known = [*RESULT_TOP_KEYS, *(f"{g}/..." for g in RESULT_GROUPS)]
        hint = difflib.get_close_matches(key, [*RESULT_TOP_KEYS, "env_runners/episode_return_mean",
                                               "env_runners/env/success", "judge/rubric_pass_rate"], n=1)
        raise ValueError(f"{key!r} is not a result key{f'; did you mean {hint[0]!r}?' if hint else ''} "
                         f"(known: {', '.join(known)})")
    return stop


class WarmStartSection(_Section):
    """A supervised LoRA warm start on reference solutions before GRPO (``draco_gym.algos.policy.sft``)."""

    epochs: int = Field(0, ge=0, description="passes over the demonstrations (0: no warm start; GRPO starts "
                                             "from policy.model)")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate of the warm start's LoRA adapter")
    batch_size: int = Field(4, ge=1, description="demonstrations per optimizer step")
    task_ids: list[str] | None = Field(None, description="demonstrate these tasks' reference solutions (null: "
                                                         "env.task_ids, else every task the env lists)")
    check_tasks: int = Field(8, ge=0, description="then try the warm-started policy at rollout.temperature on this "
                                                  "many of GRPO's train tasks (check_train_episodes each) and as "
                                                  "many held-out tasks (eval.task_ids, else the env's tasks not "
                                                  "trained on; 2 episodes each), and say whether it is ready for "
                                                  "GRPO; 0: no check")
    check_train_episodes: int = Field(4, ge=2, description="episodes per train task in the check: a task whose "
                                                           "episodes hold both a success and a failure is one a "
                                                           "GRPO group can learn from")


class RunConfig(_Section):
    name: str = Field("run", description="run name (a file's default: its stem)")
    output_dir: str = Field("runs/run", description="metrics.jsonl, rollouts.jsonl, plots/, checkpoint/, tune/ (a "
                                                    "relative path is taken from the folder the command runs in)")
    seed: int = Field(0, description="seeds the task draws and the sampling")
    iterations: int = Field(3, ge=1, description="training iterations, one GRPO step each")
    env: EnvSection
    policy: PolicySection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    reward: RewardSection = Field(default_factory=RewardSection)
    credit: CreditSection = Field(default_factory=CreditSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    warm_start: WarmStartSection = Field(default_factory=WarmStartSection, description="draco-gym train first "
                                         "fine-tunes policy.model on the env's reference solutions, writes it to "
                                         "OUTPUT_DIR/warm_start and runs GRPO from it")
    stop: dict[str, float] = Field(default_factory=dict, description="Tune stop criteria: result key -> threshold; "
                                   "the run stops once a result reaches one (>=), e.g. "
                                   "{env_runners/episode_return_mean: 0.8}; training_iteration is `iterations`")
    logging: LoggingSection = Field(default_factory=LoggingSection, description="trackers: wandb, mlflow")

    @field_validator("stop")
    @classmethod
    def _stop_keys(cls, value):
        return check_stop(value)

    @field_validator("output_dir")
    @classmethod
    def _absolute(cls, value):
        # Made absolute where the config is read, in the driver: Tune runs the trial in a
        # folder of its own, where a relative path names another place.
        import os

        return os.path.abspath(os.path.expanduser(value))

    @model_validator(mode="after")
    def _outcome_based_credit(self):
        check_outcome_base(self.credit, self.reward)
        return self

    @model_validator(mode="after")
    def _one_iteration_budget(self):
        given = self.stop.get("training_iteration")
        if given is not None:
            if "iterations" in self.model_fields_set and given != self.iterations:
                raise ValueError(f"iterations={self.iterations} and stop.training_iteration={given:g} disagree; "
                                 "give one of them")
            self.iterations = int(given)
        return self

    @model_validator(mode="after")
    def _ratio_of_the_drawing_policy(self):
        if self.rollout.pipeline == "one_step" and self.optim.recompute_old_logprobs:
            raise ValueError("rollout.pipeline: one_step with optim.recompute_old_logprobs: true: the learner would "
                             "recompute the old log-probs with weights one update newer than the ones that drew the "
                             "tokens; leave recompute_old_logprobs unset (null) or set the pipeline off")
        return self

    @model_validator(mode="after")
    def _dynamic_sampling_on_the_newest_policy(self):
        if self.rollout.pipeline == "one_step" and self.rollout.dynamic_sampling_rounds:
            raise ValueError("rollout.dynamic_sampling_rounds with rollout.pipeline: one_step: the extra rounds would "
                             "wait for the sample drawn ahead; set one of them off")
        return self

    @model_validator(mode="after")
    def _drawn_ahead_on_a_runner(self):
        if self.rollout.pipeline == "one_step" and self.resources.num_env_runners == 0:
            raise ValueError("rollout.pipeline: one_step with resources.num_env_runners: 0: the next iteration is "
                             "sampled on an env runner while the learner steps, and with 0 the learner's own "
                             "process samples; give it an env runner or set the pipeline off")
        return self

    def tune_stop(self) -> dict[str, float]:
        """The ``stop`` of ``tune.RunConfig``: the criteria plus the iteration budget."""
        return {**self.stop, "training_iteration": self.iterations}


def check_outcome_base(credit: CreditSection, reward: RewardSection) -> None:
    """A rule that needs the outcome reward (``Need.OUTCOME_REWARD``: TRACE's A_out and
    ProVer's GRPO advantage under ``base_advantage: outcome``, their papers' reading) gets the
    ``outcome`` reward, on the metric the rule reads as success."""
    from draco_gym.algos.credit import Need, credit_spec
    from draco_gym.reward import OutcomeReward

    spec = credit_spec(credit.name)
    options = spec.parse(credit.options)[0]
    if Need.OUTCOME_REWARD not in spec.needs(options):
        return
    key = getattr(options, "outcome_key", None)
    if reward.name in ("outcome", OutcomeReward):
        metric = reward.options.get("metric", "success")
        if key is not None and "ratio" not in reward.options and metric != key:
            raise ValueError(f"credit {credit.name!r} reads success from metrics[{key!r}] but reward.options.metric "
                             f"is {metric!r}; make them the same")
        return
    shown = reward.name if isinstance(reward.name, str) else getattr(reward.name, "__name__", "a factory")
    raise ValueError(
        f"credit {credit.name!r} takes its base advantage from the environment's verifiable outcome, as its paper "
        f"does, but reward.name is {shown!r}, which cannot supply it. Fix: set reward: {{name: outcome, options: "
        f"{{metric: {key or 'success'}}}}}; or, to build on this reward on purpose (not the paper's method), set "
        f"credit.options.base_advantage: reward")


def reject_literal_secrets(options: Any, where: str) -> None:
    """Secrets never sit in a config: it is copied into checkpoints and logs."""
    if isinstance(options, dict):
        for key, value in options.items():
            if key in ("api_key", "token", "password") and value:
                raise ValueError(
                    f"{where}.{key}: secrets do not belong in a config file (it is copied into checkpoints "
                    f"and logs); export the key and give the variable's name as {where}.{key}_env"
                    if key == "api_key" else f"{where}.{key}: secrets do not belong in a config file"
                )
            reject_literal_secrets(value, f"{where}.{key}")


# -- a run not yet validated ------------------------------------------------------------------


def draft_run(data: dict[str, Any] | None = None) -> RunConfig:
    """A ``RunConfig`` built from ``data`` without validation, nested sections included, the
    declared defaults for the rest: what ``GRPOConfig`` holds while its builder methods fill
    it in (no env or model yet), until ``GRPOConfig.validate`` checks the finished run."""
    return _construct(RunConfig, data or {"env": {"id": None}, "policy": {"model": None}})


def _construct(model: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    values = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        section = field.annotation if field is not None else None
        nested = isinstance(section, type) and issubclass(section, BaseModel) and isinstance(value, dict)
        values[name] = _construct(section, value) if nested else value
    return model.model_construct(**values)


# -- reading a file ---------------------------------------------------------------------------


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, apply ``key.sub=value`` overrides, validate. Raises ``ConfigError``."""
    path = Path(path)
    raw = _read(path, seen=())
    for item in overrides or []:
        _apply_override(raw, item, path)
    raw.setdefault("name", path.stem)
    raw.setdefault("output_dir", str(Path("runs") / raw["name"]))
    if (raw.get("env") or {}).get("modules"):
        _importable_from(path.parent)
    return parse_config(raw, source=str(path))


def _importable_from(folder: Path) -> None:
    """``env.modules`` import from the config file's folder first (then ``PYTHONPATH``), as a
    script's own folder is: here, and, through ``PYTHONPATH``, in the processes of the local
    Ray cluster this command starts (env runners, learners)."""
    import os
    import sys

    folder_s = str(folder.resolve())
    if folder_s not in sys.path:
        sys.path.insert(0, folder_s)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder_s not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder_s, *paths])


def _read(path: Path, seen: tuple) -> dict:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    base_path = (path.parent / str(base)).resolve()
    if base_path in seen:
        raise ConfigError(f"{path}: base {base!r} includes itself")
    return _merge(_read(base_path, (*seen, base_path)), raw)


def _merge(base: dict, over: dict) -> dict:
    """Deep merge; a section naming a different component (``name:``) replaces the base's
    whole section, so an ablation's reward never inherits options meant for another."""
    if "name" in over and "name" in base and over["name"] != base["name"] and "options" in base:
        return dict(over)
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_config(raw: dict, source: str = "config") -> RunConfig:
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_describe(err) for err in exc.errors())) from None
    if not isinstance(config.env.id, str):
        raise ConfigError(f"{source}: env.id must be a Gymnasium id, got {type(config.env.id).__name__}")
    _check_env(config, source)
    return config


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p.startswith(("str", "callable"))))
    if err["type"] == "extra_forbidden":
        parent, key = _model_at(err["loc"][:-1]), str(err["loc"][-1])
        known = list(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(key, known, n=1)
        close = f"; did you mean {'.'.join([*map(str, err['loc'][:-1]), hint[0]])!r}?" if hint else ""
        return f"{loc}: unknown key{close} (known here: {', '.join(known)})"
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc and not msg.startswith(loc) else msg


def _model_at(loc) -> type[BaseModel] | None:
    model: type[BaseModel] | None = RunConfig
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        ann = next((a for a in typing.get_args(ann) if a is not type(None)), ann)  # an optional section
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def _apply_override(raw: dict, item: str, path: Path) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    dotted, value = item.split("=", 1)
    node = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a section in {path}")
    node[parts[-1]] = yaml.safe_load(value)


def _check_env(config: RunConfig, source: str) -> None:
    """The id resolves here (``env.modules`` imported first); building it and asking for its
    tasks is ``GRPOConfig.validate``'s part, before any actor starts."""
    from draco_gym.registration import EnvSourceError, env_entry

    try:
        env_entry(config.env.id, config.env.modules)
    except EnvSourceError as exc:
        raise ConfigError(f"{source}: env.id: {exc}") from None


# -- the schema as text -----------------------------------------------------------------------


def schema_text(model: type[BaseModel] = RunConfig, indent: str = "") -> str:
    """Every key with its default and meaning, in the file's layout."""
    lines = []
    for key, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and key != "lora":
            lines.append(f"{indent}{key}:" + (f"  # {field.description}" if field.description else ""))
            lines.append(schema_text(ann, indent + "  "))
            continue
        if field.is_required():
            shown = "REQUIRED"
        else:
            value = field.get_default(call_default_factory=True)
            shown = yaml.safe_dump(value.model_dump() if isinstance(value, BaseModel) else value,
                                   default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()
        lines.append(f"{indent}{key}: {shown}" + (f"  # {field.description}" if field.description else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_text())
