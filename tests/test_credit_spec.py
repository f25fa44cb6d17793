"""Each credit rule's declaration (``algos/credit/spec.py``): every option it accepts is
reachable from a YAML file and from ``GRPOConfig`` and arrives in the built rule; what it
needs is what the trainer supplies; ``turns_without_code: gap`` is reachable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from draco_gym.algos.config import load_config
from draco_gym.algos.credit import CREDIT_RULES, Need, credit_spec, get_credit_rule
from draco_gym.algos.credit.core import TURNS_WITHOUT_CODE
from draco_gym.types import GroupScore, Step, Task, Trajectory, TrajectoryScore, Verdict

# For every option of every rule, a value other than its default, as a YAML file writes it.
JUDGE_OPTIONS = {"model": "judge-model", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "OPENAI_API_KEY"}
NOT_DEFAULT = {
    "uniform": {},
    "draco": {},
    "trca": {"lam": 0.5, "gamma": 0.9, "step_weight": 2.0, "context_key": "index", "episode_advantage": "reward",
             "env_reward": "none", "outcome_key": "solved", "success_threshold": 0.5},
    "trace": {"eps": 0.2, "K": 2, "gamma": 0.7, "lambda_term": 1.0, "alpha_out": 0.5, "alpha_turn": 0.3,
              "base_advantage": "reward", "reference_model": "/models/reference", "answer_key": "gold",
              "batch_size": 4, "max_length": 1024},
    "prover": {"K": 4, "lam": 0.5, "max_segment_len": 2, "base_advantage": "reward", "base_scale": "standardised",
               "outcome_key": "solved", "judge": "openai", "judge_options": JUDGE_OPTIONS, "max_repairs": 1},
}


def test_the_table_names_every_option_of_every_rule():
    assert sorted(NOT_DEFAULT) == CREDIT_RULES.names()
    for name, values in NOT_DEFAULT.items():
        spec = credit_spec(name)
        assert sorted(values) == sorted(spec.option_names()), name
        for key, value in values.items():
            assert value != spec.defaults()[key][0], f"{name}.{key}: pick a value other than the default"


def _built(name: str, run) -> object:
    """The rule as the RLlib trainer builds it from ``run`` (its env runners and base model faked)."""
    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")
    algo = SimpleNamespace(config=SimpleNamespace(run=run, model_path="/models/base"), env_runner_group=object())
    return get_credit_rule(name, turns_without_code=run.credit.turns_without_code,
                           **grpo.GRPO.credit_options(algo))


@pytest.mark.parametrize("name", sorted(NOT_DEFAULT))
def test_every_option_is_set_from_yaml(name, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-only")
    values = NOT_DEFAULT[name]
    data = {"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "smollm2-135m-instruct"},
            "credit": {"name": name, "options": values, "turns_without_code": "gap"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    run = load_config(path)
    rule = _built(name, run)
    assert rule.turns_without_code == "gap"
    assert rule.options.model_dump() == {**credit_spec(name).options().model_dump(), **values}


@pytest.mark.parametrize("name", sorted(NOT_DEFAULT))
def test_every_option_is_set_from_grpo_config(name, monkeypatch):
    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")
    monkeypatch.setenv("OPENAI_API_KEY", "test-only")
    config = (grpo.GRPOConfig().environment("draco_gym/PythonTools-v0").policy(model="smollm2-135m-instruct")
              .training(credit=name, credit_options=NOT_DEFAULT[name], turns_without_code="gap"))
    run = config._checked_run()
    rule = _built(name, run)
    assert rule.turns_without_code == "gap"
    assert rule.options.model_dump() == {**credit_spec(name).options().model_dump(), **NOT_DEFAULT[name]}


def test_every_way_of_crediting_a_turn_without_code_is_reachable(tmp_path):
    for choice in TURNS_WITHOUT_CODE:
        path = tmp_path / f"{choice}.yaml"
        path.write_text(yaml.safe_dump({"env": {"id": "draco_gym/PythonTools-v0"},
                                        "policy": {"model": "smollm2-135m-instruct"},
                                        "credit": {"name": "draco", "turns_without_code": choice}}))
        assert load_config(path).credit.turns_without_code == choice


def _closing_group():
    steps = [Step(index=1, text="```python\nx = 1\n```", code="x = 1", observation="", n_tokens=4),
             Step(index=2, text="Done.", code=None, observation="", n_tokens=2)]
    trajs = [Trajectory(task=Task(id="t", instruction="?"), steps=steps, metrics={"success": s}) for s in (1, 0)]
    scores = [TrajectoryScore.from_verdicts([Verdict(criterion="c", score=v, cited_steps=[1])]) for v in (1, -1)]
    return trajs, GroupScore(scores=scores)


def test_gap_gives_the_closing_turn_nothing():
    """The paper's letter: a turn in no step gets 0; the default gives it A_i."""
    trajs, group = _closing_group()
    assert get_credit_rule("draco", turns_without_code="gap")(trajs, group, [1.0, -1.0]) == [[1.0, 0.0], [-1.0, 0.0]]
    assert get_credit_rule("draco")(trajs, group, [1.0, -1.0]) == [[1.0, 1.0], [-1.0, -1.0]]


@pytest.mark.parametrize("name, options, needs", [
    ("uniform", {}, {Need.REWARD_ADVANTAGE}),
    ("draco", {}, {Need.REWARD_ADVANTAGE, Need.VERDICTS}),
    ("trace", {}, {Need.BASE_POLICY, Need.GOLD_ANSWER, Need.OUTCOME_REWARD}),
    ("trace", {"base_advantage": "reward"}, {Need.BASE_POLICY, Need.GOLD_ANSWER, Need.REWARD_ADVANTAGE}),
    ("prover", {}, {Need.CONTINUATIONS, Need.OUTCOME, Need.OUTCOME_REWARD}),
    ("trca", {}, {Need.OUTCOME}),
    ("trca", {"episode_advantage": "reward", "env_reward": "none"}, {Need.REWARD_ADVANTAGE}),
])
def test_needs_follow_the_options(name, options, needs):
    spec = credit_spec(name)
    assert spec.needs(spec.parse(options)[0]) == needs


def test_trl_supplies_the_base_policy_and_refuses_continuations():
    from draco_gym.algos.trl import trl_credit_options

    model = SimpleNamespace(config=SimpleNamespace(_name_or_path="/models/base"))
    assert trl_credit_options("trace", {}, model)["reference_model"] == "/models/base"
    assert trl_credit_options("trace", {"reference_model": "/ref"}, model)["reference_model"] == "/ref"
    assert trl_credit_options("draco", {}, model) == {}
    with pytest.raises(ValueError, match="'prover' needs continuations \\(continue_fn\\)"):
        trl_credit_options("prover", {"judge": "openai"}, model)


def test_an_unknown_option_names_the_closest_and_the_inputs():
    with pytest.raises(ValueError, match="credit 'trace' takes no option 'scorrer'; did you mean 'scorer'"):
        credit_spec("trace").parse({"scorrer": None})


def test_the_credit_pages_rule_of_your_own_runs_as_written():
    """docs/credit.md's custom-rule snippet registers, takes its option and credits the last step."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "credit.md").read_text()
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "last_step" in b]
    namespace: dict = {}
    try:
        exec(compile(snippet, "docs/credit.md", "exec"), namespace)
        trajs = [Trajectory(task=Task(id="t", instruction="i"), steps=[Step(index=j, text="x", code="x", n_tokens=3) for j in (1, 2)])
                 for _ in range(2)]
        group = GroupScore(scores=[TrajectoryScore.from_verdicts([]), TrajectoryScore.from_verdicts([])])
        assert namespace["rule"](trajs, group, [1.0, -1.0]) == [[0.0, 2.0], [0.0, -2.0]]
    finally:
        CREDIT_RULES._entries.pop("last_step", None)
