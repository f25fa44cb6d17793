"""Gymnasium ids of the built-in environments.

Entry points are strings, so registering an id imports nothing: AppWorld's HTTP client and
tau-bench's packages load only when ``gym.make`` builds that environment. Gymnasium 1.x
has no plugin entry points; ``import draco_gym`` (or the ``"draco_gym:<id>"`` form of
``gym.make``) runs this module.

Your own code-step environment registers the same way, with your own namespace::

    gym.register(id="my_lab/Shop-v0", entry_point="my_lab.shop:ShopEnv", kwargs={"max_turns": 30})
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

NAMESPACE = "draco_gym"

ENVIRONMENTS: dict[str, str] = {
    "PythonTools-v0": "draco_gym.envs.python_tools:PythonToolsEnv",
    "TauBench-v0": "draco_gym.envs.tau.env:TauBenchEnv",
    "AppWorld-v0": "draco_gym.envs.appworld.env:AppWorldEnv",
    "Corridor-v0": "draco_gym.envs.corridor:CorridorEnv",
}


def register_all() -> None:
    for name, entry_point in ENVIRONMENTS.items():
        env_id = f"{NAMESPACE}/{name}"
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


# -- an environment named in a config -------------------------------------------------------
#
# A trainer names its environment once, in the driver, but builds it in every env runner (Ray
# actors, other processes, other machines): whatever registered a user's id in the driver
# must happen there too. ``env_entry`` turns the name into something any process can build
# from (a registered ``EnvSpec``, or a class), and ``env_tasks`` asks the environment for its
# tasks, so both mistakes surface in the driver, before an actor starts.


class EnvSourceError(ValueError):
    """The environment named in a config cannot be found or built, or lists no tasks."""


_NOT_REGISTERED_HINT = ("register it in a module (gym.register(...)) and list that module in env.modules "
                        "(Python: GRPOConfig().environment(..., env_modules=['my_lab.envs'])), or name it as "
                        "'module:id' (e.g. 'my_lab.envs:my_lab/Shop-v0'), or pass the env class")


def import_env_modules(modules) -> None:
    """Import the modules that register environments (``env.modules``), here and in every
    env runner, before the environment is looked up."""
    import importlib

    for name in modules or ():
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise EnvSourceError(f"env.modules: cannot import {name!r} ({type(exc).__name__}: {exc}); the module "
                                 "must be importable where the trainer runs (installed, or on PYTHONPATH)") from None


def env_entry(env: Any, modules=()) -> Any:
    """What an environment name refers to: a registered ``gymnasium.envs.registration.EnvSpec``
    for an id (``"ns/Name-v0"``, or ``"module:ns/Name-v0"`` whose module registers it), a
    class for ``"module:Class"``; a class or a creator function is returned as given.

    The spec carries the entry point and keyword arguments, so a process that never ran the
    user's ``gym.register`` (an env runner) still builds the same environment from it."""
    import difflib
    import importlib

    register_all()
    import_env_modules(modules)
    if isinstance(env, gym.envs.registration.EnvSpec):
        return env
    if not isinstance(env, str):
        if callable(env):
            return env
        raise EnvSourceError(f"env must be a Gymnasium id, 'module:id', an env class or a creator function, "
                             f"got {type(env).__name__} {env!r}")
    if ":" in env:
        module_name, _, name = env.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EnvSourceError(f"env {env!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); "
                                 "it must be importable where the trainer runs (installed, or on PYTHONPATH)") from None
        if name in gym.registry:
            return gym.spec(name)
        attr = getattr(module, name, None)
        if isinstance(attr, type) and issubclass(attr, gym.Env):
            return attr
        candidates = [k for k in gym.registry if k.startswith(module_name.split(".")[0])] + [
            k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, gym.Env)]
        hint = difflib.get_close_matches(name, candidates, n=1)
        raise EnvSourceError(f"env {env!r}: after importing {module_name!r}, {name!r} is neither a registered "
                             f"Gymnasium id nor a gymnasium.Env class in it"
                             + (f"; did you mean {module_name + ':' + hint[0]!r}?" if hint else ""))
    if env in gym.registry:
        return gym.spec(env)
    hint = difflib.get_close_matches(env, list(gym.registry), n=1)
    close = f"; did you mean {hint[0]!r}?" if hint else ""
    if env.startswith(f"{NAMESPACE}/"):
        raise EnvSourceError(f"env {env!r} is not a registered Gymnasium id{close}")
    raise EnvSourceError(f"env {env!r} is not a registered Gymnasium id in this process{close} If it is your "
                         f"own: {_NOT_REGISTERED_HINT}")


def make_from_entry(entry: Any, env_config: dict) -> gym.Env:
    """Build an environment from ``env_entry``'s result: a spec or a class takes
    ``env_config`` as keyword arguments, a creator function takes the dict itself."""
    if isinstance(entry, gym.envs.registration.EnvSpec):
        return gym.make(entry, **dict(env_config))
    if isinstance(entry, type):
        return entry(**dict(env_config))
    return entry(dict(env_config))


def env_tasks(env: gym.Env, name: Any, task_ids=None) -> list[str]:
    """The tasks to train on, by the task protocol:

    - the environment lists its tasks in a ``task_ids`` attribute or property (a list of
      strings) and ``reset(options={"task_id": id})`` starts that task; ``task_ids`` given in
      the config must be among them;
    - or the config lists ``task_ids`` and the environment's ``reset(options={"task_id": id})``
      accepts each (each is tried here, once).
    """
    import difflib

    listed = getattr(env.unwrapped, "task_ids", None)
    if listed is not None and (isinstance(listed, (str, bytes)) or not all(isinstance(t, str) for t in listed)):
        raise EnvSourceError(f"env {name!r}: task_ids must be a list of strings, got {listed!r:.200}")
    listed = list(listed) if listed is not None else None
    if task_ids:
        wanted = list(task_ids)
        if listed is not None:
            unknown = [t for t in wanted if t not in listed]
            if unknown:
                hint = difflib.get_close_matches(unknown[0], listed, n=1)
                raise EnvSourceError(f"task_ids: {unknown[:5]} not among the {len(listed)} tasks env {name!r} lists"
                                     + (f"; did you mean {hint[0]!r}?" if hint else f" (e.g. {listed[:3]})"))
        else:
            for task_id in wanted:
                try:
                    env.reset(seed=0, options={"task_id": task_id})
                except Exception as exc:  # noqa: BLE001 - the env's own error, named
                    raise EnvSourceError(f"task_ids: env {name!r} lists no tasks, and reset(options={{'task_id': "
                                         f"{task_id!r}}}) failed: {type(exc).__name__}: {exc}") from exc
        return wanted
    if listed is None:
        raise EnvSourceError(f"env {name!r} does not list its tasks: give the env class a `task_ids` attribute "
                             "(the ids its reset(options={'task_id': id}) accepts), or set env.task_ids in the "
                             "config (Python: .training(task_ids=[...]))")
    if not listed:
        raise EnvSourceError(f"env {name!r} lists no tasks (task_ids is empty)")
    return listed
