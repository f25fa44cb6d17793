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
        ({"credit": {"name": "trca", "options": {"gama": 0.9}}}, ["credit", "'trca'", "'gama'", "did you mean 'gamma'"]),
        ({"credit": {"name": "trca", "options": {"lam": 1.5}}}, ["credit", "lam", "less than or equal to 1"]),
        ({"credit": {"name": "draco", "options": {"lam": 0.5}}}, ["credit", "'draco'", "'lam'", "takes none"]),
        ({"reward": {"name": "outcome"}, "credit": {"name": "trace", "options": {"K": 0}}}, ["credit", "'trace'", "K"]),
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
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = load_config(write(tmp_path, {**MINIMAL, "rollout": {"group_size": 5}, "credit": {"name": "uniform"},
                                          "optim": {"kl_coeff": 0.0, "minibatch_size": 4}}))
    algo = GRPOConfig.from_run_config(config)
    assert algo.run is config and algo.minibatch_size == 4  # RLlib reads its own attribute
    assert (algo.run.rollout.group_size, algo.run.credit.name, algo.run.optim.kl_coeff) == (5, "uniform", 0.0)
    assert algo.run.policy.model == "smollm2-135m-instruct" and algo.run.policy.lora.r == 16


# -- one declaration per knob, one place to read it -------------------------------------------


def test_every_knob_is_declared_once_with_a_meaning():
    """GRPOConfig starts from the schema's own defaults, and every builder keyword names a
    described field of it."""
    from draco_gym.algos.config import EpisodeLimits, LossConfig, RunConfig
    from draco_gym.algos.rllib.grpo import KEYWORDS, RLLIB_KNOBS, GRPOConfig

    config = GRPOConfig()
    assert config.run.rollout == RunConfig.model_fields["rollout"].default_factory()
    assert config.run.optim == RunConfig.model_fields["optim"].default_factory()
    # the token budgets and the loss read the same declarations (256 vs 1024 once disagreed)
    assert isinstance(config.run.rollout, EpisodeLimits) and isinstance(config.run.optim, LossConfig)
    assert EpisodeLimits().max_new_tokens == config.run.rollout.max_new_tokens and LossConfig().kl_coeff == config.run.optim.kl_coeff
    for attr in RLLIB_KNOBS[1:]:  # (RLlib's env stays None until .environment(...))
        *section, key = KEYWORDS[attr]
        field = (RunConfig.model_fields[section[0]].annotation if section else RunConfig).model_fields[key]
        default = field.get_default(call_default_factory=True)
        assert getattr(config, attr) == default, attr
    for keyword, (*section, key) in KEYWORDS.items():
        model = RunConfig.model_fields[section[0]].annotation if section else RunConfig
        assert model.model_fields[key].description, f"{keyword} has no description"


def test_a_knob_from_either_door_is_read_from_the_run_schema():
    """The builder's keywords and RLlib's own builder methods land in the one RunConfig the
    trainer reads; the loss and the episode budgets are its sections as they are."""
    from draco_gym.algos.config import OptimSection, RolloutSection
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = (GRPOConfig().environment("draco_gym/PythonTools-v0", task_ids=["a"]).policy(model="/models/x", lora={"r": 4})
              .training(group_size=5, kl_coeff=0.0, credit="uniform", lr=1e-3, max_new_tokens=32)
              .env_runners(num_env_runners=2).debugging(seed=3))
    run = config._checked_run()
    assert (run.rollout.group_size, run.optim.kl_coeff, run.credit.name, run.optim.lr) == (5, 0.0, "uniform", 1e-3)
    assert (run.resources.num_env_runners, run.seed, run.env.id, run.env.task_ids) == (2, 3, "draco_gym/PythonTools-v0", ["a"])
    assert run.policy.lora.r == 4 and run.policy.lora.alpha == 32
    assert type(run.optim) is OptimSection and type(run.rollout) is RolloutSection and run.rollout.max_new_tokens == 32
    # Tune and RLlib copy a config through to_dict/from_dict: the run survives, as plain dicts on the way
    back = GRPOConfig.from_dict(config.to_dict())
    assert back._checked_run() == run and config.to_dict()["run"]["rollout"]["group_size"] == 5


def test_a_knob_lives_in_run_only():
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = GRPOConfig().training(group_size=5)
    assert config.run.rollout.group_size == 5
    with pytest.raises(AttributeError, match="group_size"):
        config.group_size
    with pytest.raises(AttributeError, match=r"GRPOConfig.kl_coeff is not an attribute: the knob is "
                                             r"run.optim.kl_coeff \(set it with \.training\(kl_coeff="):
        config.kl_coeff = 0.5  # read by nothing: refused, not silently kept
    with pytest.raises(AttributeError, match=r"\.policy\(lora="):
        config.lora = {"r": 4}
    config.lr = 1e-4  # RLlib's own knobs stay its attributes
    assert config.lr == 1e-4


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda c: c.training(group_size=1), ["GRPOConfig", "group_size", "greater than or equal to 2"]),
        (lambda c: c.training(credit="drako"), ["credit", "'drako'", "did you mean 'draco'"]),
        (lambda c: c.training(dual_clip=0.5), ["dual_clip", "> 1"]),
        (lambda c: c.training(credit="trca", credit_options={"step_weigth": 2.0}),
         ["credit_options", "did you mean 'step_weight'"]),
        (lambda c: c.training(reward_options={"judge": {"api_key": "sk-123"}}), ["reward_options", "api_key_env"]),
        (lambda c: c.policy(model=None), ["model is not set", ".policy(model=...)"]),
        (lambda c: c.training(lr=-1.0), ["GRPOConfig", "lr", "greater than 0"]),
        (lambda c: c.env_runners(num_env_runners=-1), ["num_env_runners", "greater than or equal to 0"]),
        (lambda c: c.env_runners(num_env_runners=0).training(pipeline="one_step"),
         ["pipeline: one_step", "num_env_runners: 0"]),
        (lambda c: c.environment(None), ["env is not set", ".environment(env=...)"]),
    ],
)
def test_grpo_config_validate_names_the_attribute(build, words):
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = build(GRPOConfig().environment("draco_gym/PythonTools-v0").policy(model="/models/x"))
    with pytest.raises(ConfigError) as err:
        config.validate()
    for word in words:
        assert word.lower() in str(err.value).lower()
    assert "sk-123" not in str(err.value)


def test_grpo_config_rejects_an_unknown_keyword_with_a_hint():
    from draco_gym.algos.rllib.grpo import GRPOConfig

    with pytest.raises(TypeError, match="unknown keyword 'group_sise'; did you mean 'group_size'"):
        GRPOConfig().training(group_sise=4)
    with pytest.raises(TypeError, match="unknown keyword 'modle'; did you mean 'model'"):
        GRPOConfig().policy(modle="x")
    assert GRPOConfig().training(gamma=0.5, group_size=3).gamma == 0.5  # RLlib's own keywords pass through


def test_importing_the_trainer_registers_nothing_with_tune():
    """Tune registration happens where Ray starts (the CLI, or register_with_tune())."""
    import subprocess
    import sys

    probe = ("import draco_gym.algos.rllib.grpo; from ray.rllib.algorithms.registry import ALGORITHMS; "
             "import sys; sys.exit('registered on import' if 'GRPO' in ALGORITHMS else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_core_package_imports_no_layer():
    """draco_gym/ (the core) imports neither algos nor reward; the CLI names its commands'
    modules as strings and imports one only when it runs."""
    import re

    core = Path(__file__).resolve().parents[1] / "draco_gym"
    for path in core.glob("*.py"):
        for line in path.read_text().splitlines():
            assert not re.match(r"\s*(from|import)\s+draco_gym\.(algos|reward)\b", line), f"{path.name}: {line}"


def test_every_path_a_user_gives_is_taken_from_the_folder_the_command_runs_in(tmp_path, monkeypatch):
    """YAML, ``--set`` and ``GRPOConfig`` paths are made absolute in the driver, against the
    folder the command runs in (not the config file's): a Tune trial validates the config
    again in a folder of its own, where a relative path would name nothing. The alias stays."""
    from draco_gym.algos.rllib.grpo import GRPOConfig

    (tmp_path / "configs").mkdir()
    (tmp_path / "work").mkdir()
    path = write(tmp_path / "configs", {**MINIMAL, "policy": {"model": "models/m"}, "output_dir": "runs/a"})
    monkeypatch.chdir(tmp_path / "work")
    here = tmp_path / "work"
    config = load_config("../configs/run.yaml")
    assert (config.policy.model, config.output_dir) == (str(here / "models" / "m"), str(here / "runs" / "a"))
    config = load_config(path, ["policy.model=runs/x/warm_start", "output_dir=~/runs/b"])
    assert config.policy.model == str(here / "runs" / "x" / "warm_start")
    assert config.output_dir == str(Path("~/runs/b").expanduser())
    assert load_config(path, ["policy.model=smollm2-135m-instruct"]).policy.model == "smollm2-135m-instruct"
    assert load_config(write(tmp_path, {k: v for k, v in MINIMAL.items()}, "named.yaml")).output_dir == \
        str(here / "runs" / "named")

    algo = GRPOConfig().policy(model="runs/x/warm_start").training(output_dir="out", restore_from="runs/a/checkpoint")
    assert algo.run.policy.model == str(here / "runs" / "x" / "warm_start")
    assert (algo.output_dir, algo.restore_from) == (str(here / "out"), str(here / "runs" / "a" / "checkpoint"))
    monkeypatch.chdir(tmp_path)  # the trial's own folder: validating again changes nothing
    assert parse_config(config.model_dump()).policy.model == str(here / "runs" / "x" / "warm_start")
