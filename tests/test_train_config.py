"""The YAML run config: every shipped config validates, and a bad one fails before anything
starts with a message that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draco_gym.cli import main
from draco_gym.algos.config import ConfigError, load_config, parse_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
MINIMAL = {"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "smollm2-135m-instruct"}}


def write(tmp_path, data, name="run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    config = load_config(path)
    assert config.iterations >= 1 and config.rollout.group_size >= 2


def test_required_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"quickstart.yaml", "quickstart_selfjudge.yaml", "appworld_draco.yaml", "appworld_no_credit.yaml",
            "appworld_no_dynamic_rubric.yaml", "appworld_neither.yaml", "appworld_outcome.yaml",
            "appworld_selfjudge.yaml"} <= names


def test_ablations_change_only_what_they_ablate():
    base = load_config(Path(CONFIGS[0]).parent / "appworld_draco.yaml")
    no_credit = load_config(Path(CONFIGS[0]).parent / "appworld_no_credit.yaml")
    outcome = load_config(Path(CONFIGS[0]).parent / "appworld_outcome.yaml")
    assert no_credit.credit.name == "uniform" and no_credit.reward == base.reward
    assert no_credit.optim == base.optim and no_credit.rollout == base.rollout
    assert outcome.reward.name == "outcome" and "judge" not in outcome.reward.options  # replaced, not merged


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"rollout": {"group_sise": 4}}, ["rollout.group_sise", "unknown key", "rollout.group_size"]),
        ({"optimizer": {}}, ["optimizer", "unknown key"]),
        ({"rollout": {"group_size": 1}}, ["rollout.group_size", "greater than or equal to 2"]),
        ({"credit": {"name": "drako"}}, ["credit.name", "drako", "draco"]),
        ({"reward": {"name": "rubric"}}, ["reward.name", "rubric"]),
        ({"optim": {"lr": "fast"}}, ["optim.lr"]),
        ({"optim": {"dual_clip": 0.5}}, ["optim.dual_clip", "> 1"]),
        ({"env": {"id": "draco_gym/PythonTool-v0"}}, ["env.id", "draco_gym/PythonTools-v0"]),
        ({"reward": {"name": "dynamic", "options": {"judge": {"name": "openai", "api_key": "sk-123"}}}},
         ["reward.options.judge.api_key", "api_key_env"]),
    ],
)
def test_bad_config_names_the_key(tmp_path, patch, words):
    data = {**MINIMAL, **patch, "env": {**MINIMAL["env"], **patch.get("env", {})}}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    for word in words:
        assert word in str(err.value)
    assert "sk-123" not in str(err.value)


def test_missing_sections_are_named():
    with pytest.raises(ConfigError, match="policy: required key is missing"):
        parse_config({"env": {"id": "draco_gym/PythonTools-v0"}})


def test_overrides_and_base(tmp_path):
    write(tmp_path, {**MINIMAL, "rollout": {"group_size": 4, "temperature": 0.7}}, "base.yaml")
    child = write(tmp_path, {"base": "base.yaml", "rollout": {"group_size": 8}}, "child.yaml")
    config = load_config(child, ["optim.lr=1e-4", "rollout.tasks_per_iteration=3"])
    assert config.rollout.group_size == 8 and config.rollout.temperature == 0.7
    assert config.optim.lr == 1e-4 and config.rollout.tasks_per_iteration == 3
    assert config.name == "child"


def test_cli_rejects_a_typo_before_starting(tmp_path, capsys):
    path = write(tmp_path, {**MINIMAL, "rollout": {"max_new_token": 5}})
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rollout.max_new_token" in err and "max_new_tokens" in err
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_cli_rejects_a_missing_model_before_ray(tmp_path, capsys):
    path = write(tmp_path, {**MINIMAL, "policy": {"model": str(tmp_path / "no-model")},
                            "output_dir": str(tmp_path / "out")})
    assert main(["train", str(path)]) == 2
    assert "no-model" in capsys.readouterr().err


def test_grpo_config_carries_every_section(tmp_path):
    from draco_gym.algos.grpo import GRPOConfig

    config = load_config(write(tmp_path, {**MINIMAL, "rollout": {"group_size": 5}, "credit": {"name": "uniform"},
                                          "optim": {"kl_coeff": 0.0, "minibatch_size": 4}}))
    algo = GRPOConfig.from_run_config(config)
    assert (algo.group_size, algo.credit, algo.kl_coeff, algo.minibatch_size) == (5, "uniform", 0.0, 4)
    assert algo.policy_model == "smollm2-135m-instruct" and algo.lora["r"] == 16
