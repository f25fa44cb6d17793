"""The rollout group every layer hands on, and the rollouts.jsonl record the report reads."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from draco_gym import report
from draco_gym.algos.credit import apply_credit, get_credit_rule
from draco_gym.algos.rllib.reporting import RolloutLog
from draco_gym.types import (Criterion, GroupScore, RolloutGroup, RolloutRecord, Step, Task, Trajectory,
                             TrajectoryScore, Verdict)

TASK = Task(id="t1", instruction="Find the total.")


def trajectory(n_steps: int) -> Trajectory:
    steps = [Step(index=j + 1, text=f"step {j + 1}", code="print(1)", n_tokens=2) for j in range(n_steps)]
    token_step = [-1] + [j + 1 for j in range(n_steps) for _ in range(2)]
    return Trajectory(task=TASK, steps=steps, termination="submitted", metrics={"success": n_steps == 1},
                      token_ids=list(range(len(token_step))), token_step=token_step,
                      token_logprobs=[0.0] + [-0.5] * (len(token_step) - 1))


def score() -> GroupScore:
    return GroupScore(criteria=[Criterion(title="Submits", origin="trajectory")], dropped=["Reads the docs"],
                      fallbacks=["augment[1]: no JSON"],
                      scores=[TrajectoryScore.from_verdicts([Verdict(criterion="Submits", score=1, cited_steps=[1])]),
                              TrajectoryScore.from_verdicts([Verdict(criterion="Submits", score=-1, cited_steps=[2])])])


def test_a_score_must_hold_one_trajectory_score_per_rollout():
    group = RolloutGroup(task_id="t1", trajectories=[trajectory(1), trajectory(2)])
    assert group.task is TASK and group.score is None
    short = GroupScore(scores=[TrajectoryScore()])
    with pytest.raises(ValidationError, match="score has 1 trajectory scores for 2 trajectories of task 't1'"):
        group.with_score(short)
    with pytest.raises(ValidationError, match="score has 1 trajectory scores"):
        RolloutGroup(task_id="t1", trajectories=[trajectory(1), trajectory(2)], score=short)
    with pytest.raises(ValidationError, match="trajectories"):
        RolloutGroup(task_id="t1", trajectories=[])


def test_scoring_returns_a_new_group_and_credit_refuses_an_unscored_one():
    group = RolloutGroup(task_id="t1", trajectories=[trajectory(1), trajectory(2)])
    scored = group.with_score(score())
    assert group.score is None and scored.score.rewards == [1.0, -1.0]
    assert scored.trajectories == group.trajectories
    with pytest.raises(ValueError, match="group of task 't1' is not scored"):
        apply_credit([group], get_credit_rule("draco"))
    batch = apply_credit([scored], get_credit_rule("draco"))
    assert [len(a) for a in batch.step_advantages] == [1, 2]


def test_rollout_log_writes_records_the_report_reads_back(tmp_path):
    """One RolloutRecord per rollout, the group's rubric on each line; a non-finite step
    advantage survives the round trip (written as NaN, read back as NaN)."""
    path = tmp_path / "rollouts.jsonl"
    scored = RolloutGroup(task_id="t1", trajectories=[trajectory(1), trajectory(2)]).with_score(score())
    RolloutLog(path).write([scored], iteration=3, step_advantages=[[1.0], [float("nan"), -0.5]])
    RolloutLog(path).write([RolloutGroup(task_id="t1", trajectories=[trajectory(1)])])  # evaluation: unscored
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and "NaN" in lines[1]
    [group_a, group_b] = report.read_groups(path)
    assert [n for n, _ in group_a.rows] == [1, 2] and [n for n, _ in group_b.rows] == [3]
    first, second, unscored = [record for group in (group_a, group_b) for _, record in group.rows]
    assert (first.iteration, first.task_id, first.index, second.index) == (3, "t1", 0, 1)
    assert first.score == scored.score.scores[0] and second.criteria == scored.score.criteria
    assert second.dropped == ["Reads the docs"] and second.fallbacks == ["augment[1]: no JSON"]
    assert second.step_advantages[1] == -0.5 and math.isnan(second.step_advantages[0])
    assert second.trajectory.steps == scored.trajectories[1].steps
    assert second.trajectory.token_ids == []  # the report skips the token arrays
    assert RolloutRecord.model_validate_json(lines[1]).trajectory == scored.trajectories[1]  # all of it is there
    assert (unscored.iteration, unscored.score, unscored.criteria, unscored.step_advantages) == (None, None, [], None)


@pytest.mark.parametrize("change, words", [
    (lambda r: r["trajectory"]["steps"][0].update(index=0), ["line 2", "trajectory.steps.0.index", "greater than"]),
    (lambda r: r["score"].update(p="many"), ["line 2", "score.p", "integer"]),
    (lambda r: r.update(criteria=[{"origin": "instruction"}]), ["line 2", "criteria.0", "title"]),
    (lambda r: r.update(verdict="pass"), ["line 2", "verdict", "Extra inputs"]),
    (lambda r: r.pop("task_id"), ["line 2", "task_id", "required"]),
])
def test_a_record_off_the_schema_names_file_line_and_field(tmp_path, change, words):
    path = tmp_path / "rollouts.jsonl"
    RolloutLog(path).write([RolloutGroup(task_id="t1", trajectories=[trajectory(1), trajectory(2)]).with_score(score())])
    good, bad = path.read_text().splitlines()
    record = json.loads(bad)
    change(record)
    path.write_text(good + "\n" + json.dumps(record) + "\n")
    with pytest.raises(report.ReportError) as err:
        list(report.read_groups(path))
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message
