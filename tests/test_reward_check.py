"""``draco-gym train --check`` warns when nothing a run learns from can see whether the task
was done (``algos/cli/reward_check.py``): the reward ranks two rollouts that differ only in
their outcome alike, and the credit rule does not read the outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from draco_gym.algos.cli.reward_check import outcome_blind, outcome_blind_warning
from draco_gym.algos.config import ConfigError, load_config
from draco_gym.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BLIND_ON_PURPOSE = {
    "appworld_random.yaml": "the random-reward control: blind by design",
}
WEIGHTED = {"parts": [{"name": "outcome", "weight": 1.0, "options": {"metric": "success"}},
                      {"name": "rule", "weight": 0.25}]}


def test_the_probe_tells_an_outcome_reward_from_a_blind_one():
    assert outcome_blind("outcome", {"metric": "success"}) is False
    assert outcome_blind("outcome", {"ratio": ["tests_passed", "tests_total"]}) is False
    assert outcome_blind("weighted", WEIGHTED) is False
    assert outcome_blind("random", {"seed": 3}) is True  # random by position: never the outcome's order both ways
    assert outcome_blind("weighted", {"parts": [{"name": "random", "weight": 1.0}]}) is True
    # what no offline probe can answer: a judge reads the text; the corridor's rubric needs its own rollouts
    assert outcome_blind("dynamic", {"judge": {"name": "openai", "model": "m"}}) is None
    assert outcome_blind("corridor", {}) is None
    with pytest.raises(ConfigError, match="'random' cannot be built.*parts"):
        outcome_blind("random", WEIGHTED)


def test_the_probe_sees_an_outcome_reward_that_stopped_reading_the_outcome(monkeypatch):
    from draco_gym.reward.outcome import OutcomeReward

    monkeypatch.setattr(OutcomeReward, "_value", lambda self, metrics: (1.0, None))
    assert outcome_blind("outcome", {"metric": "success"}) is True
    assert outcome_blind("weighted", WEIGHTED) in (True, False)  # the rule part decides now: no crash


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_no_shipped_config_trains_on_a_reward_blind_to_the_outcome(path):
    warning = outcome_blind_warning(load_config(path))
    if path.name in BLIND_ON_PURPOSE:
        assert warning, f"{path.name} is listed as blind on purpose ({BLIND_ON_PURPOSE[path.name]}) but is not"
    else:
        assert warning is None, f"{path.name}: {warning}"


def test_a_credit_rule_that_reads_the_outcome_sees_it_for_a_blind_reward():
    config = load_config(CONFIGS / "pythontools_trca.yaml", ["reward.options={}"])
    config = config.model_copy(update={"reward": config.reward.model_copy(update={"name": "random"})})
    assert outcome_blind_warning(config) is None  # TRCA's episode advantage is the outcome's
    blind = load_config(CONFIGS / "pythontools_trca.yaml", ["credit.options.episode_advantage=reward",
                                                            "credit.options.env_reward=none"])
    blind = blind.model_copy(update={"reward": blind.reward.model_copy(update={"name": "random"})})
    assert "credit 'trca' does not read it" in outcome_blind_warning(blind)


def test_train_check_prints_the_warning(capsys):
    quickstart = str(CONFIGS / "quickstart.yaml")
    assert main(["train", quickstart, "--check"]) == 0
    assert "blind to the outcome" not in capsys.readouterr().out
    assert main(["train", quickstart, "--check", "--set", "reward={name: random}"]) == 0
    assert "warning: reward 'random' is blind to the outcome" in capsys.readouterr().out
    assert main(["train", quickstart, "--check", "--set", "reward.name=random"]) == 2  # weighted's parts kept
    assert "'random' cannot be built" in capsys.readouterr().err
