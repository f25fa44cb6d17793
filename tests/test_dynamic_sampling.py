"""DAPO's dynamic sampling (``rollout.dynamic_sampling_rounds``): a group whose episodes all
succeeded, or all failed, cannot teach the task; extra rounds draw other tasks in its place.

Worked example for the replacement rule: a batch of three groups [teaches, all-fail,
all-pass], up to three rounds. Round 1 draws two tasks (one per idle slot) from those not yet
drawn: the first teaches and takes slot 1 (the first idle one), the second does not. Round 2
draws one task for slot 2: it teaches and takes it, and no third round is drawn. Drawn: 3 + 2
+ 1 = 6 groups; the batch is the first group and the two that teach, in that order.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draco_gym.algos.config import ConfigError, RunConfig
from draco_gym.algos.policy.iteration import teaches
from draco_gym.algos.rllib.grpo import GRPO
from draco_gym.types import GroupScore, RolloutGroup, Step, Task, Trajectory, TrajectoryScore, Verdict


def episode(task_id: str, success: bool | None, termination: str = "submitted") -> Trajectory:
    steps = [Step(index=1, text="```python\nsubmit(1)\n```", code="submit(1)", n_tokens=2)]
    metrics = {} if success is None else {"success": success}
    return Trajectory(task=Task(id=task_id, instruction="Submit."), steps=steps, termination=termination,
                      metrics=metrics, token_ids=[5, 6], token_step=[1, 1], token_logprobs=[-1.0, -1.0])


def group(task_id: str, outcomes, rewards=None, terminations=None) -> RolloutGroup:
    rewards = rewards or [1 if o else -1 for o in outcomes]
    terminations = terminations or ["submitted"] * len(outcomes)
    scores = [TrajectoryScore.from_verdicts([Verdict(criterion="c", score=r, cited_steps=[1])] if r else [])
              for r in rewards]
    return RolloutGroup(task_id=task_id, score=GroupScore(scores=scores),
                        trajectories=[episode(task_id, o, t) for o, t in zip(outcomes, terminations)])


def test_a_group_teaches_when_its_outcomes_differ_or_without_an_outcome_its_rewards():
    assert teaches(group("t", [True, False, True]))
    assert not teaches(group("t", [True, True, True]))
    # the rubric spreads the rewards, but every episode succeeded: the outcome has nothing to push on
    assert not teaches(group("t", [True, True], rewards=[1, -1]))
    # an environment that reports no outcome: the reward decides
    assert teaches(group("t", [None, None], rewards=[1, -1]))
    assert not teaches(group("t", [None, None], rewards=[1, 1]))
    # env_error episodes do not count: the two left both failed
    assert not teaches(group("t", [True, False, False], terminations=["env_error", "submitted", "max_turns"]))


class Rounds:
    """What ``GRPO._dynamic_sampling`` reads of the trainer, with a scripted ``sample``: call
    k's groups teach as ``script[k]`` says (whatever tasks were drawn)."""

    def __init__(self, task_ids, rounds: int, script=()) -> None:
        self._task_ids, self.script = task_ids, list(script)
        self.iteration, self.calls = 4, []
        self.config = SimpleNamespace(seed=0, run=SimpleNamespace(rollout=SimpleNamespace(
            dynamic_sampling_rounds=rounds, scoring="streaming")))

    def sample(self, tasks, *, seed, stream_scoring):
        wanted = self.script[len(self.calls)] if len(self.calls) < len(self.script) else [False] * len(tasks)
        self.calls.append((list(tasks), seed))
        groups = [group(t, [True, not teach]) for t, teach in zip(tasks, wanted)]
        return groups, {"timers": {"generation": 2.0, "env": 1.0}, "generated_tokens": 10 * len(tasks)}

    _iteration_seed = GRPO._iteration_seed

    def score(self, groups):
        return groups, {"judge": 0.5}

    def _stop_on_dead_judge(self, groups):
        pass


FIRST = [group("a", [True, False]), group("b", [False, False]), group("c", [True, True])]


def test_groups_that_teach_take_the_idle_slots_in_order_and_the_rounds_stop_when_none_is_left():
    trainer = Rounds(list("abcdefgh"), rounds=3, script=[[True, False], [True]])
    sampled = {"timers": {"generation": 5.0, "env": 1.0}, "generated_tokens": 30}
    batch, drawn, totals, judge_s = GRPO._dynamic_sampling(trainer, FIRST, sampled, 1.0)

    assert [len(tasks) for tasks, _ in trainer.calls] == [2, 1], "one task per idle slot; no third round"
    drawn_tasks = [t for tasks, _ in trainer.calls for t in tasks]
    assert len(set(drawn_tasks)) == 3 and not set(drawn_tasks) & {"a", "b", "c"}, "tasks not drawn before"
    assert len({seed for _, seed in trainer.calls}) == 2, "each round has its own seed"
    round_1, round_2 = trainer.calls
    assert [g.task_id for g in batch] == ["a", round_1[0][0], round_2[0][0]]
    assert batch[0] is FIRST[0] and all(map(teaches, batch))
    assert [g.task_id for g in drawn] == ["a", "b", "c", *drawn_tasks]
    assert totals == {"timers": {"generation": 9.0, "env": 3.0}, "generated_tokens": 60}
    assert judge_s == pytest.approx(2.0)


def test_what_no_round_could_replace_stays_and_every_round_is_spent():
    trainer = Rounds(list("abc"), rounds=2)
    batch, drawn, _, _ = GRPO._dynamic_sampling(trainer, FIRST, {"timers": {}, "generated_tokens": 0}, 0.0)
    assert batch == FIRST
    # two idle slots and no task left undrawn: each round draws from every task
    assert [len(tasks) for tasks, _ in trainer.calls] == [2, 2]
    assert len(drawn) == 7


def test_a_batch_that_teaches_draws_nothing_more_and_a_seed_draws_the_same_rounds_again():
    trainer = Rounds(list("abc"), rounds=2)
    assert GRPO._dynamic_sampling(trainer, FIRST[:1], {"timers": {}, "generated_tokens": 0}, 0.0)[1] == FIRST[:1]
    assert trainer.calls == []
    runs = []
    for _ in range(2):
        trainer = Rounds(list("abcdefgh"), rounds=2)
        GRPO._dynamic_sampling(trainer, FIRST, {"timers": {}, "generated_tokens": 0}, 0.0)
        runs.append(trainer.calls)
    assert runs[0] == runs[1]


def test_dynamic_sampling_is_refused_beside_the_one_step_pipeline():
    with pytest.raises((ConfigError, ValueError), match="dynamic_sampling_rounds"):
        RunConfig.model_validate({"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "x"},
                                  "rollout": {"pipeline": "one_step", "dynamic_sampling_rounds": 1}})


def test_the_trainer_draws_the_rounds_counts_them_and_learns_from_the_batch(ray_session, tiny_model, tmp_path):
    """The real trainer (Ray, the tiny random policy on PythonTools): the random policy never
    submits, so no group teaches and the one extra round draws a group for each of the two;
    the sampling figures count all four groups, the loss and ``rollouts.jsonl`` the batch."""
    pytest.importorskip("ray")
    import json

    from grpo_fixtures import make_config

    from draco_gym.algos.rllib.reporting import compact, progress_line

    algo = make_config(tiny_model, tmp_path / "run").training(dynamic_sampling_rounds=1).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["env_runners"]["groups_drawn"] == 4
    assert result["env_runners"]["num_episodes"] == 12
    assert result["credit"]["groups_teaching"] == 0
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 6
    assert "teaching=0/drawn=4" in progress_line(compact(result), 1)
