"""Every credit rule by name: the registry, the trainer's config selecting it, and the import
promise (``import draco_gym.algos.credit`` loads no torch)."""

import subprocess
import sys

import pytest

from draco_gym.algos.credit import CREDIT_RULES, get_credit_rule, group_advantages
from draco_gym.algos.credit.prover import Segment
from draco_gym.types import GroupScore, Step, Task, Trajectory, TrajectoryScore, Verdict


def _group():
    trajs, scores = [], []
    for i, success in enumerate([True, False, False]):
        steps = [Step(index=j, text=f"```python\nx = {j}\n```", code=f"x = {j}", observation=str(j), n_tokens=4,
                      info={"exec_error": None}) for j in (1, 2, 3)]
        trajs.append(Trajectory(task=Task(id="t", instruction="?", metadata={"answer": "3"}), steps=steps,
                                metrics={"success": success}))
        scores.append(TrajectoryScore.from_verdicts([Verdict(criterion="c", score=1 if success else -1, cited_steps=[2])]))
    return trajs, GroupScore(scores=scores)


OPTIONS = {
    "uniform": {},
    "draco": {},
    "trca": {"context_key": "index", "lam": 0.8, "gamma": 0.95},
    "trace": {"scorer": lambda traj: [-2.0, -1.5, -1.0, -0.5], "K": 3, "gamma": 0.8},
    "prover": {"continue_fn": lambda task_id, prefix, k: [float(len(prefix) >= 2)] * k,
               "propose": lambda traj, max_len, failures: (Segment(2, 2), "ok"), "K": 2},
}


def test_every_rule_is_registered():
    assert CREDIT_RULES.names() == sorted(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_rule_runs_on_a_group(name):
    trajs, group = _group()
    adv = group_advantages(group.rewards)
    out = get_credit_rule(name, **OPTIONS[name])(trajs, group, adv)
    assert [len(a) for a in out] == [3, 3, 3]
    if name == "prover":  # base 1 - 1/3 (the centred outcome); Delta = 1 - 0 on step 2 of the only success
        assert out[0] == pytest.approx([2 / 3, 2 / 3 + 1.0, 2 / 3])


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_trainer_config_selects_each_rule(name):
    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")
    config = grpo.GRPOConfig().training(credit=name, credit_options=OPTIONS[name])
    assert config.run.credit.name == name
    trajs, group = _group()
    rule = get_credit_rule(config.run.credit.name, **config.run.credit.options)
    assert len(rule(trajs, group, group_advantages(group.rewards))) == 3


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_rule_is_registered_where_it_is_defined(name):
    """The decorator sits on the rule's own factory, in the rule's own module."""
    entry = CREDIT_RULES.get(name)
    assert entry.factory.__module__ == f"draco_gym.algos.credit.{name}" and entry.factory.__name__ == f"{name}_rule"
    assert entry.spec.options.__module__ == f"draco_gym.algos.credit.{name}"


def test_a_rule_registers_with_the_decorator(monkeypatch):
    """A new rule joins by decorator, gets the group check and the step boundary, and its
    factory is returned unwrapped; a second rule under a taken name is refused."""
    from draco_gym.algos.credit import Need, RuleOptions, credit_rule, option

    monkeypatch.setattr(CREDIT_RULES, "_entries", dict(CREDIT_RULES._entries))

    class LastStepOptions(RuleOptions):
        scale: float = option(1.0, "ours", "the last step's share of A_i")

    @credit_rule("last_step_only", LastStepOptions, needs={Need.REWARD_ADVANTAGE, Need.VERDICTS})
    def last_step_only(options: LastStepOptions):
        return lambda trajs, group, adv: [[0.0] * (len(t.steps) - 1) + [options.scale * a] for t, a in zip(trajs, adv)]

    trajs, group = _group()
    assert get_credit_rule("last_step_only", scale=2.0)(trajs, group, [1.0, -0.5, -0.5]) == [
        [0.0, 0.0, 2.0], [0.0, 0.0, -1.0], [0.0, 0.0, -1.0]]
    # the factory itself, unwrapped
    assert last_step_only(LastStepOptions())(trajs, group, [1.0, 0.0, 0.0])[0] == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="group sizes differ: 3 trajectories, 2 advantages, 3 scores"):
        get_credit_rule("last_step_only")(trajs, group, [1.0, -1.0])
    with pytest.raises(ValueError, match="'draco' is already registered"):
        credit_rule("draco", LastStepOptions, needs=())(last_step_only)

    class Unlabelled(RuleOptions):
        scale: float = 1.0

    with pytest.raises(TypeError, match="Unlabelled.scale: declare it with credit.spec.option"):
        credit_rule("unlabelled", Unlabelled, needs=())


def test_unknown_rule_names_the_known_ones():
    with pytest.raises(KeyError, match="known: .*'prover'.*'trace'.*'trca'"):
        get_credit_rule("tcra")


def test_import_loads_no_torch():
    probe = ("import sys, draco_gym.algos.credit as c; assert 'trca' in c.CREDIT_RULES; "
             "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; "
             "sys.exit(str(heavy) if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_trainer_supplies_what_only_it_has():
    """GRPO fills ProVer's continuations (its env runners) and TRACE's reference (the base
    model) unless the config gives them."""
    from types import SimpleNamespace

    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")

    def algo(credit, options):
        run = SimpleNamespace(credit=SimpleNamespace(name=credit, options=options))
        config = SimpleNamespace(run=run, model_path="/models/base")
        return SimpleNamespace(config=config, env_runner_group=object())

    prover = grpo.GRPO.credit_options(algo("prover", {"judge": "openai", "K": 4}))
    assert callable(prover["continue_fn"]) and prover["K"] == 4
    assert grpo.GRPO.credit_options(algo("trace", {}))["reference_model"] == "/models/base"
    assert grpo.GRPO.credit_options(algo("trace", {"reference_model": "/ref"}))["reference_model"] == "/ref"
    assert grpo.GRPO.credit_options(algo("trca", {"lam": 0.5})) == {"lam": 0.5}
    assert grpo.GRPO.credit_options(algo("draco", {})) == {}


@pytest.mark.parametrize("name", ["trca", "trace", "prover"])
def test_shipped_configs_select_each_rule(name, monkeypatch):
    """configs/pythontools_<rule>.yaml validates, reaches GRPOConfig, and builds its rule with
    what the trainer adds."""
    from pathlib import Path
    from types import SimpleNamespace

    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")
    from draco_gym.algos.config import load_config

    monkeypatch.setenv("OPENAI_API_KEY", "test-only")
    path = Path(__file__).resolve().parents[1] / "configs" / f"pythontools_{name}.yaml"
    algo_config = grpo.GRPOConfig.from_run_config(load_config(path))
    assert algo_config.run.credit.name == name and algo_config.env == "draco_gym/PythonTools-v0"
    fake_algo = SimpleNamespace(config=SimpleNamespace(run=algo_config.run, model_path="/models/base"),
                                env_runner_group=object())
    options = grpo.GRPO.credit_options(fake_algo)
    rule = get_credit_rule(name, **options)
    assert callable(rule)
    if name == "trca":  # runs as configured, judge-free
        trajs, group = _group()
        assert len(rule(trajs, group, group_advantages(group.rewards))) == 3
