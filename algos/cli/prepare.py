"""What every command that runs the policy does first, in this process, before Ray starts:
the model converted if it is an alias and its tokenizer read, the environment built once and
asked for its tasks. A converted model, an AppWorld runtime set up with visible progress and
an environment's keyword errors so surface here, not inside an actor, and each error names
the config key to fix (``ConfigError``)."""

from __future__ import annotations

from draco_gym.algos.config import ConfigError


def prepare(config, *, env_config: dict | None = None, task_ids: list[str] | None = None) -> list[str]:
    """Convert the model if needed, read its config and tokenizer, build the environment once;
    returns the task ids. Raises ``ConfigError`` naming ``policy.model``, ``env.id``,
    ``env.config``, ``env.modules`` or ``env.task_ids``."""
    from draco_gym.algos.rllib.env_runner import env_source

    print(f"preparing model {config.policy.model} ...", flush=True)
    check_model(config.policy.model)
    print(f"preparing environment {config.env.id} ...", flush=True)
    env_config = env_config if env_config is not None else config.env.config
    try:
        return list(env_source(config.env.id, env_config, config.env.modules, task_ids)[1])
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError) as exc:
        raise ConfigError(_env_key(str(exc)) + str(exc)) from None


def check_model(model: str) -> str:
    """The model's local directory, with a config and a tokenizer transformers can read."""
    from draco_gym.algos.policy.models import resolve_model

    try:
        path = resolve_model(model)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"policy.model: {exc}") from None
    try:
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(path)
        AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises names the problem
        raise ConfigError(f"policy.model: {path} cannot be loaded by transformers ({type(exc).__name__}: "
                          f"{str(exc)[:300]})") from None
    return path


def _env_key(message: str) -> str:
    """The key prefix for an environment error that does not start with one."""
    if message.startswith(("env.", "task_ids")):
        return "env." if message.startswith("task_ids") else ""
    return "env.config: " if "could not be built" in message else "env.id: "


def probe_judge(config) -> str:
    """One small request to the run's judge server (``reward.options.judge`` with an HTTP
    judge): what was probed, or why nothing was. Raises ``ConfigError`` naming the key when
    the judge does not answer."""
    judge = config.reward.options.get("judge")
    if not isinstance(judge, dict):
        return "no judge server configured (reward.options.judge): nothing to probe"
    name = judge.get("name", "openai")
    if name != "openai":
        return f"judge {name!r} runs in the trainer's processes, not behind a server: not probed"
    from draco_gym.reward.judge_health import probe_judge as probe

    try:
        probe(judge)
    except Exception as exc:  # noqa: BLE001 - JudgeUnavailable, or a judge the options cannot build
        raise ConfigError(f"reward.options.judge: {exc}") from None
    return f"judge at {judge.get('base_url') or 'the default OpenAI endpoint'} answered a probe"
