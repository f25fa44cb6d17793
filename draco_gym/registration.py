"""Gymnasium ids of the built-in environments.

Entry points are strings, so registering an id imports nothing: AppWorld's HTTP client and
tau-bench's packages load only when ``gym.make`` builds that environment. Gymnasium 1.x
has no plugin entry points; ``import draco_gym`` (or the ``"draco_gym:<id>"`` form of
``gym.make``) runs this module.

Your own code-step environment registers the same way, with your own namespace::

    gym.register(id="my_lab/Shop-v0", entry_point="my_lab.shop:ShopEnv", kwargs={"max_turns": 30})
"""

from __future__ import annotations

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
