"""A run from Python as the training page's "From Python" snippet writes it, verbatim but for the model
(the tiny random Llama): relative paths for the output folder, ``algo.save`` and
``GRPO.from_checkpoint``; the same ``metrics.jsonl`` rows as a run through Tune (which
``draco-gym train`` is); no token-authentication notice from Ray; and a checkpoint refused by
an algorithm built on another base model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def docs_python_run() -> str:
    section = PAGE.read_text().split("From Python, the trainer is an ordinary RLlib algorithm:", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_docs_python_run(tmp_path, tiny_model):
    code = docs_python_run()
    assert '"smollm2-135m-instruct"' in code
    (tmp_path / "run.py").write_text(code.replace('"smollm2-135m-instruct"', repr(str(tiny_model))))
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # as a user's shell has it
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1700)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Token authentication" not in output and "auth_token" not in output

    out = tmp_path / "runs" / "python"
    assert (out / "checkpoint" / "adapter" / "adapter_config.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # two algo.train() calls (the second after from_checkpoint continues), then Tune's trial
    assert [r["training_iteration"] for r in rows] == [1, 2, 1]
    assert set(rows[0]) == set(rows[2]), set(rows[0]) ^ set(rows[2])
    assert {"env_runners/episode_return_mean", "judge/rubric_pass_rate", "timers/phases/learner",
            "learners/default_policy/kl", "env_runners/env/success"} <= set(rows[0])
    assert (out / "plots" / "rubric_pass_rate.png").is_file()
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 3 * 8


@pytest.mark.slow
def test_a_checkpoint_is_refused_by_an_algorithm_on_another_base(ray_session, tiny_model, tmp_path, monkeypatch):
    from grpo_fixtures import make_config

    from draco_gym.algos.policy.models import BaseModelMismatch, build_tiny_llama

    monkeypatch.chdir(tmp_path)
    algo = make_config(tiny_model, "run").build_algo()
    try:
        assert Path(algo.save("ckpt").checkpoint.path) == tmp_path / "ckpt"
    finally:
        algo.stop()
    other = build_tiny_llama(tmp_path / "other", seed=1)
    algo = make_config(other, "run").build_algo()
    try:
        with pytest.raises(BaseModelMismatch, match=f"trained on the base model {tiny_model}, but this policy is "
                                                    f"built on {other}"):
            algo.restore_from_path("ckpt")
    finally:
        algo.stop()
