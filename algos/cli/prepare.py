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


def named_judges(config) -> list[tuple[str, object]]:
    """Every judge the config names, with its key: ``reward.options.judge``, the judge of each
    part of a weighted reward (``reward.options.parts[k].options.judge``, parts of parts too)
    and a credit rule's (``credit.options.judge``, a registered name with ``judge_options``)."""
    def in_reward(options: dict, key: str) -> list[tuple[str, object]]:
        found = [(f"{key}.judge", options["judge"])] if options.get("judge") is not None else []
        for k, part in enumerate(options.get("parts") or []):
            if isinstance(part, dict) and isinstance(part.get("options"), dict):
                found += in_reward(part["options"], f"{key}.parts[{k}].options")
        return found

    judges = in_reward(config.reward.options, "reward.options")
    credit = config.credit.options
    if isinstance(credit.get("judge"), str):
        judges.append(("credit.options.judge", {"name": credit["judge"], **(credit.get("judge_options") or {})}))
    elif credit.get("judge") is not None:
        judges.append(("credit.options.judge", credit["judge"]))
    return judges


def probe_judge(config) -> str:
    """One small request to each judge server the run names (``named_judges`` with an HTTP
    judge): one line each, what was probed or why nothing was. Raises ``ConfigError`` naming
    the key when a judge does not answer."""
    from draco_gym.reward.judge_health import probe_judge as probe

    judges = named_judges(config)
    if not judges:
        return "no judge configured (reward.options.judge, a weighted reward's parts, credit.options.judge): " \
               "nothing to probe"
    lines = []
    for key, judge in judges:
        name = judge.get("name", "openai") if isinstance(judge, dict) else judge
        if name != "openai":
            lines.append(f"{key}: judge {name!r} runs in the trainer's processes, not behind a server: not probed")
            continue
        try:
            probe(judge)
        except Exception as exc:  # noqa: BLE001 - JudgeUnavailable, or a judge the options cannot build
            raise ConfigError(f"{key}: {exc}") from None
        lines.append(f"{key}: judge at {judge.get('base_url') or 'the default OpenAI endpoint'} answered a probe")
    return "\n".join(lines)
