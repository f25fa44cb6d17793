"""The YAML schema of ``draco-gym train`` and ``draco-gym eval``, validated before anything starts.

A config file has these sections (every key optional unless marked; unknown keys are
errors that name the key, with the closest known one)::

    base: appworld_draco.yaml         # optional: start from another file (path relative to this
                                      # one) and override only what follows, merged key by key
    name: quickstart                  # run name (default: the file's stem)
    output_dir: runs/quickstart       # metrics.jsonl, rollouts.jsonl, plots/, checkpoint/, tune/
    seed: 0
    iterations: 3                     # training iterations (one GRPO step each)

    env:
      id: draco_gym/AppWorld-v0       # REQUIRED: a Gymnasium id (import path "module:Class" works too)
      config: {split: train, max_turns: 8}   # constructor keyword arguments
      task_ids: null                  # train on these; default: every task the env lists

    policy:
      model: smollm2-135m-instruct    # REQUIRED: local HF directory or the SmolLM2 alias
      dtype: float32                  # float32 | bfloat16 | float16
      lora: {r: 16, alpha: 32, target_modules: all-linear, dropout: 0.0}
      sampler: torch                  # torch | vllm (GPU; unverified)
      gradient_checkpointing: false
      torch_threads: null             # intra-op threads per process (null: Ray's, one per reserved CPU)

    rollout:
      group_size: 6                   # G episodes per task
      tasks_per_iteration: 16
      temperature: 1.0
      max_new_tokens: 1024            # per assistant turn
      max_prompt_tokens: 4096         # the first prompt, left-truncated
      max_response_tokens: 24576      # everything after the prompt; beyond: termination "length"

    reward: {name: rule, options: {}}         # a name in draco_gym.reward.REWARDS
    credit: {name: draco, options: {}}        # a name in draco_gym.algos.credit.CREDIT_RULES

    optim:
      lr: 5.0e-5
      weight_decay: 0.01
      grad_clip: 1.0
      kl_coeff: 0.01
      clip_low: 0.2
      clip_high: 0.2
      dual_clip: 3.0
      minibatch_size: 8               # trajectories per optimizer step (null: all)
      num_epochs: 1
      micro_batch_tokens: 4096        # gradient accumulation unit (padded tokens)

    resources:
      num_env_runners: 1
      num_cpus_per_env_runner: 1
      num_gpus_per_env_runner: 0
      num_learners: 0                 # 0: the learner lives in the training process
      num_gpus_per_learner: 0
      ray_num_cpus: null              # ray.init(num_cpus=...) when this process starts Ray
      object_store_memory_mb: 256

    checkpoint: {every: 1, keep: 2}

    eval:                             # draco-gym eval
      env_config: {split: dev}        # merged over env.config
      task_ids: null                  # default: every task of the (eval) env
      max_tasks: null                 # the first N of them
      episodes_per_task: 1            # k for pass@k / pass^k
      temperature: 0.0                # 0: greedy
      score: false                    # also run the reward on each task's episodes
      success_metric: success         # the env metric that means "solved"

A judge's API key never goes in the file: give the *name* of the environment variable that
holds it (``api_key_env``); a literal ``api_key`` is rejected, so keys cannot reach logs,
checkpoints or saved rollouts through the config.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A config file is invalid; the message names the file and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSection(_Section):
    id: str
    config: dict[str, Any] = Field(default_factory=dict)
    task_ids: list[str] | None = None


class LoraSection(_Section):
    r: int = Field(16, ge=1)
    alpha: float = Field(32, gt=0)
    target_modules: str | list[str] = "all-linear"
    dropout: float = Field(0.0, ge=0, lt=1)


class PolicySection(_Section):
    model: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraSection = Field(default_factory=LoraSection)
    sampler: Literal["torch", "vllm"] = "torch"
    gradient_checkpointing: bool = False
    torch_threads: int | None = Field(None, ge=1)


class RolloutSection(_Section):
    group_size: int = Field(6, ge=2)
    tasks_per_iteration: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(1024, ge=1)
    max_prompt_tokens: int = Field(4096, ge=1)
    max_response_tokens: int = Field(24576, ge=1)


class NamedSection(_Section):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class OptimSection(_Section):
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    kl_coeff: float = Field(0.01, ge=0)
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.2, ge=0)
    dual_clip: float = Field(3.0, ge=0)
    minibatch_size: int | None = Field(8, ge=1)
    num_epochs: int = Field(1, ge=1)
    micro_batch_tokens: int = Field(4096, ge=16)

    @field_validator("dual_clip")
    @classmethod
    def _dual(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError("dual_clip must be 0 (off) or > 1")
        return value


class ResourcesSection(_Section):
    num_env_runners: int = Field(1, ge=1)
    num_cpus_per_env_runner: float = Field(1, ge=0)
    num_gpus_per_env_runner: float = Field(0, ge=0)
    num_learners: int = Field(0, ge=0)
    num_gpus_per_learner: float = Field(0, ge=0)
    ray_num_cpus: int | None = Field(None, ge=1)
    object_store_memory_mb: int = Field(256, ge=75)


class CheckpointSection(_Section):
    every: int = Field(1, ge=1)
    keep: int | None = Field(2, ge=1)


class EvalSection(_Section):
    env_config: dict[str, Any] = Field(default_factory=dict)
    task_ids: list[str] | None = None
    max_tasks: int | None = Field(None, ge=1)
    episodes_per_task: int = Field(1, ge=1)
    temperature: float = Field(0.0, ge=0)
    score: bool = False
    success_metric: str = "success"


class RunConfig(_Section):
    name: str = "run"
    output_dir: str = "runs/run"
    seed: int = 0
    iterations: int = Field(3, ge=1)
    env: EnvSection
    policy: PolicySection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    reward: NamedSection = Field(default_factory=lambda: NamedSection(name="rule"))
    credit: NamedSection = Field(default_factory=lambda: NamedSection(name="draco"))
    optim: OptimSection = Field(default_factory=OptimSection)
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval: EvalSection = Field(default_factory=EvalSection)

    @model_validator(mode="after")
    def _names_exist(self) -> RunConfig:
        from draco_gym.algos.credit import CREDIT_RULES
        from draco_gym.reward import REWARDS

        if self.reward.name not in REWARDS:
            raise ValueError(f"reward.name: {REWARDS.unknown(self.reward.name)}")
        if self.credit.name not in CREDIT_RULES:
            raise ValueError(f"credit.name: {CREDIT_RULES.unknown(self.credit.name)}")
        _reject_literal_keys(self.reward.options, "reward.options")
        return self


def _reject_literal_keys(options: Any, where: str) -> None:
    if isinstance(options, dict):
        for key, value in options.items():
            if key in ("api_key", "token", "password") and value:
                raise ValueError(
                    f"{where}.{key}: secrets do not belong in a config file (it is copied into checkpoints "
                    f"and logs); export the key and give the variable's name as {where}.{key}_env"
                    if key == "api_key" else f"{where}.{key}: secrets do not belong in a config file"
                )
            _reject_literal_keys(value, f"{where}.{key}")


# -- loading ------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, apply ``key.sub=value`` overrides, validate. Raises ``ConfigError``."""
    path = Path(path)
    raw = _read(path, seen=())
    for item in overrides or []:
        _apply_override(raw, item, path)
    raw.setdefault("name", path.stem)
    raw.setdefault("output_dir", str(Path("runs") / raw["name"]))
    return parse_config(raw, source=str(path))


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
    _check_env(config, source)
    return config


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        parent, key = _model_at(err["loc"][:-1]), str(err["loc"][-1])
        known = list(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(key, known, n=1)
        close = f"; did you mean {'.'.join([*map(str, err['loc'][:-1]), hint[0]])!r}?" if hint else ""
        return f"{loc}: unknown key{close} (known here: {', '.join(known)})"
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _model_at(loc) -> type[BaseModel] | None:
    model: type[BaseModel] | None = RunConfig
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
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
    import gymnasium as gym

    import draco_gym  # noqa: F401 - registers the built-in ids

    if ":" not in config.env.id and config.env.id not in gym.registry:
        hint = difflib.get_close_matches(config.env.id, list(gym.registry), n=1)
        close = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(f"{source}: env.id: {config.env.id!r} is not a registered Gymnasium id{close}")


# -- to RLlib ------------------------------------------------------------------------------


def to_algorithm_config(config: RunConfig, *, output_dir: str | None = None):
    """The ``GRPOConfig`` this file describes (imports Ray and torch)."""
    from draco_gym.algos.grpo import GRPOConfig

    r, o, res = config.rollout, config.optim, config.resources
    return (
        GRPOConfig()
        .environment(config.env.id, env_config=dict(config.env.config))
        .policy(model=config.policy.model, dtype=config.policy.dtype, lora=config.policy.lora.model_dump(),
                gradient_checkpointing=config.policy.gradient_checkpointing, sampler=config.policy.sampler,
                torch_threads=config.policy.torch_threads)
        .training(group_size=r.group_size, tasks_per_iteration=r.tasks_per_iteration, task_ids=config.env.task_ids,
                  temperature=r.temperature, max_new_tokens=r.max_new_tokens, max_prompt_tokens=r.max_prompt_tokens,
                  max_response_tokens=r.max_response_tokens, reward=config.reward.name,
                  reward_options=dict(config.reward.options), credit=config.credit.name,
                  credit_options=dict(config.credit.options), lr=o.lr, weight_decay=o.weight_decay,
                  grad_clip=o.grad_clip, kl_coeff=o.kl_coeff, clip_low=o.clip_low, clip_high=o.clip_high,
                  dual_clip=o.dual_clip, minibatch_size=o.minibatch_size, num_epochs=o.num_epochs,
                  micro_batch_tokens=o.micro_batch_tokens, output_dir=output_dir)
        .env_runners(num_env_runners=res.num_env_runners, num_cpus_per_env_runner=res.num_cpus_per_env_runner,
                     num_gpus_per_env_runner=res.num_gpus_per_env_runner)
        .learners(num_learners=res.num_learners, num_gpus_per_learner=res.num_gpus_per_learner)
        .debugging(seed=config.seed, log_level="WARN")
    )
