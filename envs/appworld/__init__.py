"""AppWorld on the real engine: isolated runtime, environment servers, offline task suite.

Importing this package is cheap and never imports ``appworld`` itself (it lives in its
own virtual environment; see ``runtime.py``).
"""

from draco_gym.envs.appworld.env import AppWorldEnv
from draco_gym.envs.appworld.metrics import by_difficulty, sgc, tgc
from draco_gym.envs.appworld.runtime import AppWorldRuntime, SetupError
from draco_gym.envs.appworld.server import EnvServer, ServerPool
from draco_gym.envs.appworld.suite import TaskSource, ensure_offline_suite, list_tasks

__all__ = [
    "AppWorldEnv", "AppWorldRuntime", "EnvServer", "ServerPool", "SetupError", "TaskSource",
    "by_difficulty", "ensure_offline_suite", "list_tasks", "sgc", "tgc",
]
