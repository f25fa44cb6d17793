"""The import paths of the modules that moved into the rooms keep working for one release.

``import draco_gym.algos.grpo`` (and every other old path in ``MOVED``) gives a module that
forwards each name to the module that holds it now, after a ``DeprecationWarning`` that
names the new path. RLlib and Tune checkpoints pickle classes by module path
(``draco_gym.algos.grpo.GRPO``, ``draco_gym.algos.env_runner.LLMEnvRunner``, ...), so a
checkpoint written before the move still loads. The old paths have no files: a finder on
``sys.meta_path`` (installed by ``algos/__init__.py``) answers for exactly these names, so
the tree shows the rooms only. Delete this file and its two lines in ``algos/__init__.py``
in the release after.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

PACKAGE = "draco_gym.algos"

# old module under draco_gym.algos -> the modules (under draco_gym.algos) that hold its
# names now, searched in this order for each name
MOVED: dict[str, tuple[str, ...]] = {
    "batch": ("policy.batch",),
    "chat": ("policy.chat",),
    "generation": ("policy.generation",),
    "loss": ("policy.loss",),
    "models": ("policy.models",),
    "prefix": ("policy.prefix", "policy.lm"),
    "rollout": ("policy.rollout",),
    "sft": ("policy.sft",),
    "tokens": ("policy.tokens",),
    "policy_judge": ("policy.self_judge",),
    "grpo": ("rllib.grpo",),
    "env_runner": ("rllib.env_runner",),
    "learner": ("rllib.learner", "policy.gradients"),
    "module": ("rllib.module", "policy.lm"),
    "reporting": ("rllib.reporting",),
    "train_cli": ("cli.train", "cli.prepare", "rllib.session", "rllib.runs"),
    "eval_cli": ("cli.eval", "evaluation"),
    "sft_cli": ("cli.sft",),
    "setup_cli": ("cli.setup_model",),
    "demo": ("cli.demo",),
    "before_after": ("cli.before_after",),
    "trl_rollout": ("trl",),
}

# (old module, old name) -> the name it has in its new module
RENAMED: dict[tuple[str, str], str] = {("train_cli", "_Progress"): "ProgressCallback"}


def _forwarder(old: str, homes: list[str]):
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {PACKAGE}.{old!r} has no attribute {name!r}")
        target = RENAMED.get((old, name), name)
        for home in homes:
            module = importlib.import_module(home)
            if hasattr(module, target):
                return getattr(module, target)
        raise AttributeError(f"module {PACKAGE}.{old!r} has no attribute {name!r} (it moved to {', '.join(homes)})")

    return __getattr__


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package == PACKAGE and old in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__.rpartition(".")[2]
        homes = [f"{PACKAGE}.{home}" for home in MOVED[old]]
        module.__doc__ = f"Moved to {', '.join(homes)}; this path is removed in the next release."
        module.__getattr__ = _forwarder(old, homes)
        warnings.warn(f"{module.__name__} moved to {', '.join(homes)}; import from there (the old path is "
                      "removed in the next release)", DeprecationWarning, stacklevel=2)


def install() -> None:
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
