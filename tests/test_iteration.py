"""The iteration is written once (``algos/policy/iteration.py``): after sampling, every trainer
runs its steps by calling them. Each caller is run here with one step replaced, and must reach
the replacement: the example (every step), the RLlib trainer (its env runners ``score``, its
``training_step`` ``credit``, its ``update`` ``to_batch``, its learner
``accumulate_gradients``) and TRL's credit trainer (``credit``). A caller that builds its own
copy of a step again misses the replacement and fails here. No Ray is started: the trainers'
methods are called on stand-ins of their objects."""

from __future__ import annotations

import runpy
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from draco_gym.algos.config import OptimSection  # noqa: E402
from draco_gym.algos.policy import iteration  # noqa: E402
from draco_gym.types import GroupScore, RolloutGroup, Step, Task, Trajectory, TrajectoryScore, Verdict  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "one_iteration.py"
TASK = Task(id="t", instruction="Submit the total.")


class Reached(Exception):
    """Raised by a replaced step: the caller called it."""


def replace(monkeypatch, step: str) -> None:
    def reached(*args, **kwargs):
        raise Reached(step)

    monkeypatch.setattr(iteration, step, reached)


def episode(reward: int) -> Trajectory:
    return Trajectory(task=TASK, steps=[Step(index=1, text="```python\nsubmit(1)\n```", code="submit(1)", n_tokens=2)],
                      termination="no_code", token_ids=[5, 6, 7], token_step=[-1, 1, 1], token_logprobs=[0.0] * 3)


def scored_group() -> RolloutGroup:
    scores = [TrajectoryScore.from_verdicts([Verdict(criterion="c", score=s, cited_steps=[1])]) for s in (1, -1)]
    return RolloutGroup(task_id=TASK.id, trajectories=[episode(1), episode(-1)], score=GroupScore(scores=scores))


def test_the_example_calls_each_step_once(monkeypatch):
    calls: dict[str, int] = defaultdict(int)
    for step in ("score", "credit", "to_batch", "update", "accumulate_gradients"):
        original = getattr(iteration, step)

        def counted(*args, _step=step, _original=original, **kwargs):
            calls[_step] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(iteration, step, counted)
    out = runpy.run_path(str(EXAMPLE))["main"](["--tasks", "1", "--group-size", "2"])
    assert dict(calls) == {"score": 1, "credit": 1, "to_batch": 1, "update": 1, "accumulate_gradients": 1}
    assert out["adapter_moved"] > 0


def test_the_rllib_env_runner_scores_with_the_step(monkeypatch):
    from draco_gym.algos.rllib.env_runner import LLMEnvRunner

    replace(monkeypatch, "score")
    with pytest.raises(Reached, match="score"):
        LLMEnvRunner.score(SimpleNamespace(_streamed=None, reward=None), groups=[scored_group()])


def test_the_rllib_training_step_credits_with_the_step(monkeypatch):
    from draco_gym.algos.rllib.grpo import GRPO

    replace(monkeypatch, "credit")
    algo = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(rollout=SimpleNamespace(pipeline="off",
                                                                                              scoring="batched",
                                                                                              dynamic_sampling_rounds=0))),
                           iteration=0, sample_tasks=lambda i: ["t"], _iteration_seed=lambda i: 0,
                           sample=lambda tasks, **kw: ([scored_group()], {}),
                           score=lambda groups: (groups, {"judge": 0.0}),
                           _stop_on_dead_judge=lambda groups: None, credit_rule=lambda: None)
    with pytest.raises(Reached, match="credit"):
        GRPO.training_step(algo)


def test_the_rllib_update_batches_with_the_step(monkeypatch):
    from draco_gym.algos.credit import get_credit_rule
    from draco_gym.algos.rllib.grpo import GRPO

    replace(monkeypatch, "to_batch")
    algo = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(optim=OptimSection())))
    with pytest.raises(Reached, match="to_batch"):
        GRPO.update(algo, iteration.credit([scored_group()], get_credit_rule("uniform")))


def test_the_rllib_learner_takes_the_gradient_step(monkeypatch):
    from draco_gym.algos.rllib.learner import GRPOTorchLearner

    replace(monkeypatch, "accumulate_gradients")
    config = SimpleNamespace(run=SimpleNamespace(optim=OptimSection()))
    learner = SimpleNamespace(_optimizer_parameters={}, module={"policy": None},
                              config=SimpleNamespace(get_config_for_module=lambda module_id: config))
    with pytest.raises(Reached, match="accumulate_gradients"):
        GRPOTorchLearner._update(learner, {"policy": {"policy_mask": torch.ones((1, 3))}})


def test_the_trl_trainer_credits_with_the_step(monkeypatch):
    pytest.importorskip("trl")
    import trl

    from draco_gym.algos.credit import get_credit_rule
    from draco_gym.algos.trl import DracoCreditGRPOTrainer

    group = scored_group()
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions",
                        lambda self, inputs: {"advantages": torch.tensor([1.0, -1.0]),
                                              "completion_ids": torch.zeros((2, 2), dtype=torch.long)})
    replace(monkeypatch, "credit")
    trainer = object.__new__(DracoCreditGRPOTrainer)  # TRL's own setup is not what this test reads
    trainer.rubric_reward = SimpleNamespace(last_groups=[(group.trajectories, group.score)])
    trainer.credit_rule = get_credit_rule("draco")
    with pytest.raises(Reached, match="credit"):
        trainer._generate_and_score_completions([{"trajectory": t} for t in group.trajectories])
