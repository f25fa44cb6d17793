"""A user's own environment, written as the manual's "A class of your own" shows
(docs/own-environment.md), in a folder
outside the package, through every way of naming it to the trainer.

The failure modes are checked where the user makes the mistake: ``GRPOConfig.validate()``
(and ``build_algo()``) in the driver, before Ray or any actor starts; the YAML loader for
``draco-gym train``. An error inside an env runner reaches the driver with its own message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

from draco_gym.algos.config import ConfigError, load_config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-environment.md"


def docs_env_code() -> str:
    """The first python block of the page's "A class of your own" section, verbatim."""
    section = PAGE.read_text().split("## A class of your own", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """``my_lab/shop.py`` from the page, and ``my_lab/notasks.py``: the same env without
    ``task_ids`` (as the page showed it before), importable from this folder."""
    root = tmp_path_factory.mktemp("user")
    (root / "my_lab").mkdir()
    (root / "my_lab" / "__init__.py").write_text("")
    code = docs_env_code()
    (root / "my_lab" / "shop.py").write_text(code)
    notasks = code.replace('    task_ids = ["t1"]', "").replace("Shop-v0", "NoTasks-v0").replace("my_lab.shop:",
                                                                                                  "my_lab.notasks:")
    assert "task_ids" not in notasks.split("def _start")[0]
    (root / "my_lab" / "notasks.py").write_text(notasks)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        del sys.modules[name]
    for env_id in ("my_lab/Shop-v0", "my_lab/NoTasks-v0"):
        gym.registry.pop(env_id, None)


def grpo(env, **environment):
    from draco_gym.algos.rllib.grpo import GRPOConfig

    return (GRPOConfig().environment(env, **environment).policy(model="unused-model-dir")
            .training(group_size=2, tasks_per_iteration=1, max_new_tokens=8)
            .env_runners(num_env_runners=1).learners(num_learners=0))


def test_the_docs_env_passes_gymnasiums_check(user_dir):
    from gymnasium.utils.env_checker import check_env

    import my_lab.shop  # noqa: F401 - registers my_lab/Shop-v0

    env = gym.make("my_lab/Shop-v0")
    check_env(env.unwrapped, skip_render_check=True)
    assert env.unwrapped.task_ids == ["t1"]


@pytest.mark.parametrize("name", ["my_lab.shop:my_lab/Shop-v0", "my_lab.shop:ShopEnv", "class", "registered"])
def test_every_way_of_naming_the_env_validates_in_the_driver(user_dir, name):
    import my_lab.shop

    env = {"class": my_lab.shop.ShopEnv, "registered": "my_lab/Shop-v0"}.get(name, name)
    config = grpo(env)
    config.validate()
    assert config.env_source()[1] == ["t1"]
    assert config.env_entry is not None  # what the runners build from


def test_unregistered_id_fails_in_the_driver_naming_env_modules(user_dir):
    ray = pytest.importorskip("ray")
    config = grpo("my_lab/Elsewhere-v0")
    with pytest.raises(ConfigError, match=r"not a registered Gymnasium id.*env\.modules.*'module:id'"):
        config.build_algo()
    assert not ray.is_initialized()  # failed before Ray, so before any actor
    # the module that registers it, listed, fixes it
    grpo("my_lab/Shop-v0", env_modules=["my_lab.shop"]).validate()


def test_misspelled_ids_and_modules_get_a_suggestion(user_dir):
    import my_lab.shop  # noqa: F401

    with pytest.raises(ConfigError, match="did you mean 'my_lab/Shop-v0'"):
        grpo("my_lab/Shopp-v0").validate()
    with pytest.raises(ConfigError, match="did you mean 'draco_gym/Corridor-v0'"):
        grpo("draco_gym/Coridor-v0").validate()
    with pytest.raises(ConfigError, match="did you mean 'my_lab.shop:ShopEnv'"):
        grpo("my_lab.shop:ShopEnvv").validate()
    with pytest.raises(ConfigError, match="env.modules: cannot import 'my_lab.shopp'"):
        grpo("my_lab/Shop-v0", env_modules=["my_lab.shopp"]).validate()


def test_env_that_lists_no_tasks_fails_in_the_driver(user_dir):
    ray = pytest.importorskip("ray")
    config = grpo("my_lab.notasks:my_lab/NoTasks-v0")
    with pytest.raises(ConfigError, match=r"does not list its tasks: give the env class a `task_ids`"):
        config.build_algo()
    assert not ray.is_initialized()
    # the config's own task list works, each id tried by reset
    grpo("my_lab.notasks:my_lab/NoTasks-v0", task_ids=["t1", "t2"]).validate()


def test_unknown_task_ids_fail_in_the_driver(user_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"\['t11'\] not among the 1 tasks .*did you mean 't1'"):
        grpo("my_lab.shop:ShopEnv", task_ids=["t11"]).validate()
    # an env that lists no tasks: reset(options={"task_id": ...}) is the judge
    (user_dir / "my_lab" / "picky.py").write_text(textwrap.dedent("""
        from draco_gym.envs import CodeStepEnv
        from draco_gym.types import Task

        class PickyEnv(CodeStepEnv):
            def _start(self, seed, options):
                if options["task_id"] not in ("a", "b"):
                    raise KeyError(f"no task {options['task_id']!r}")
                return Task(id=options["task_id"], instruction="x", agent_prompt="x")
    """))
    grpo("my_lab.picky:PickyEnv", task_ids=["a", "b"]).validate()
    with pytest.raises(ConfigError, match=r"reset\(options=\{'task_id': 'c'\}\) failed: KeyError"):
        grpo("my_lab.picky:PickyEnv", task_ids=["a", "c"]).validate()


def test_yaml_imports_env_modules_from_the_config_folder(user_dir, tmp_path):
    folder = tmp_path / "project"
    (folder / "lab2").mkdir(parents=True)
    (folder / "lab2" / "__init__.py").write_text("")
    (folder / "lab2" / "envs.py").write_text(docs_env_code().replace("my_lab/Shop-v0", "lab2/Shop-v0")
                                             .replace("my_lab.shop:", "lab2.envs:"))
    config = folder / "run.yaml"
    try:
        config.write_text("env: {id: lab2/Shop-v0}\npolicy: {model: x}\n")
        with pytest.raises(ConfigError, match=r"run.yaml: env.id: .*list that module in env.modules"):
            load_config(config)
        config.write_text("env: {id: lab2/Shop-v0, modules: [lab2.envs]}\npolicy: {model: x}\n")
        assert load_config(config).env.modules == ["lab2.envs"]
        assert "lab2/Shop-v0" in gym.registry
    finally:
        gym.registry.pop("lab2/Shop-v0", None)
        sys.modules.pop("lab2.envs", None)
        sys.modules.pop("lab2", None)


# -- inside the actors ----------------------------------------------------------------------


@pytest.mark.slow  # a Ray session and an actor: about a minute on a busy machine
def test_an_env_runner_error_reaches_the_driver_with_its_cause(user_dir, ray_session, tiny_model):
    """The env builds in the driver but not in an env runner (a resource only one process
    has): ``build_algo`` raises the runner's own error, not RLlib's bare IndexError."""
    (user_dir / "my_lab" / "onlyhere.py").write_text(textwrap.dedent(f"""
        import os
        from draco_gym.envs import CodeStepEnv
        from draco_gym.types import Task

        class OnlyHereEnv(CodeStepEnv):
            task_ids = ["t1"]
            def __init__(self, **kw):
                super().__init__(**kw)
                if os.getpid() != {os.getpid()}:
                    raise RuntimeError("the lab database is not reachable from this process")
            def _start(self, seed, options):
                return Task(id="t1", instruction="x", agent_prompt="x")
    """))
    import importlib

    import ray.cloudpickle

    # this Ray session started before the folder was importable: ship the module by value
    ray.cloudpickle.register_pickle_by_value(importlib.import_module("my_lab.onlyhere"))
    config = grpo("my_lab.onlyhere:OnlyHereEnv").policy(model=str(tiny_model))
    with pytest.raises(Exception, match="the lab database is not reachable from this process") as info:
        config.build_algo()
    assert not isinstance(info.value, IndexError)


# -- a new user's whole path ------------------------------------------------------------------

TRAIN_SCRIPT = """
import ray
from draco_gym.algos.rllib.grpo import GRPOConfig
import my_lab.shop  # registers my_lab/Shop-v0

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
config = (GRPOConfig()
          .environment("my_lab/Shop-v0")
          .policy(model={model!r}, lora={{"r": 4, "alpha": 8}})
          .training(group_size=2, tasks_per_iteration=1, max_new_tokens=8, max_response_tokens=64, reward="rule")
          .env_runners(num_env_runners=1).learners(num_learners=0))
algo = config.build_algo()
result = algo.train()
print("EPISODES", result["env_runners"]["num_episodes"])
ray.shutdown()
"""


@pytest.mark.slow
def test_the_docs_env_trains_from_python_and_from_yaml(user_dir, tiny_model, tmp_path):
    """A fresh process in the user's folder, nothing of the package touched: a Python script,
    then ``draco-gym train`` on a YAML file next to the env."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": ""}
    script = user_dir / "train_shop.py"
    script.write_text(TRAIN_SCRIPT.format(model=str(tiny_model)))
    run = subprocess.run([sys.executable, str(script)], cwd=user_dir, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "EPISODES 2" in run.stdout

    config = user_dir / "shop.yaml"
    config.write_text(textwrap.dedent(f"""
        env: {{id: my_lab/Shop-v0, modules: [my_lab.shop]}}
        policy: {{model: {tiny_model}, lora: {{r: 4, alpha: 8}}}}
        rollout: {{group_size: 2, tasks_per_iteration: 1, max_new_tokens: 8, max_response_tokens: 64}}
        resources: {{ray_num_cpus: 2}}
        iterations: 1
        output_dir: {tmp_path / "run"}
    """))
    cli = Path(sys.executable).parent / "draco-gym"
    run = subprocess.run([str(cli), "train", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert (tmp_path / "run" / "metrics.jsonl").read_text().strip()
