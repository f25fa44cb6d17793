"""What every command that runs the policy does first, in this process, before Ray starts:
the model converted if it is an alias, the environment built once and asked for its tasks.
A converted model, an AppWorld runtime set up with visible progress and an environment's
keyword errors so surface here, not inside an actor."""

from __future__ import annotations


def prepare(config, *, env_config: dict | None = None, task_ids: list[str] | None = None) -> list[str]:
    """Convert the model if needed and build the environment once; returns the task ids."""
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.algos.rllib.env_runner import env_source

    print(f"preparing model {config.policy.model} ...", flush=True)
    resolve_model(config.policy.model)
    print(f"preparing environment {config.env.id} ...", flush=True)
    env_config = env_config if env_config is not None else config.env.config
    return list(env_source(config.env.id, env_config, config.env.modules, task_ids)[1])
