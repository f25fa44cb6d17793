"""The data model: JSON round trips and the validation every layer relies on."""

import json

import pytest
from pydantic import ValidationError

from draco_gym.types import (
    GAP,
    Criterion,
    GroupScore,
    StageUsage,
    Step,
    Task,
    Termination,
    Trajectory,
    TrajectoryScore,
    Verdict,
    rubric_reward,
)


def make_trajectory() -> Trajectory:
    task = Task(id="shop-1", instruction="Total of order O1", agent_prompt="You are an agent.", metadata={"split": "train"})
    steps = [
        Step(index=1, text="```python\nprint(get_order('O1'))\n```", code="print(get_order('O1'))",
             observation="{'id': 'O1'}", n_tokens=3, info={"parse": {"n_blocks": 1}}),
        Step(index=2, text="Done.", code=None, observation="", n_tokens=2),
    ]
    return Trajectory(
        task=task, steps=steps, termination=Termination.NO_CODE, metrics={"success": True},
        token_ids=[5, 6, 7, 8, 9, 10, 11], token_step=[GAP, 1, 1, 1, GAP, 2, 2],
        token_logprobs=[0.0, -0.1, -0.2, -0.3, 0.0, -0.4, -0.5],
    )


def test_trajectory_json_round_trip():
    traj = make_trajectory()
    again = Trajectory.model_validate_json(traj.model_dump_json())
    assert again == traj
    assert json.loads(traj.model_dump_json())["steps"][0]["index"] == 1
    assert traj.step_tokens == [3, 2]
    assert traj.executed_code == ["print(get_order('O1'))"]


def test_group_score_json_round_trip():
    verdicts = [
        Verdict(criterion="fetches all orders", score=1, cited_steps=[2, 1, 2], evidence="page loop", justification="ok"),
        Verdict(criterion="answers correctly", score=-1, cited_steps=[3]),
        Verdict(criterion="handles errors", score=0),
    ]
    group = GroupScore(
        criteria=[Criterion(title="fetches all orders", description="d", origin="trajectory", trajectory_evidence="step 2")],
        scores=[TrajectoryScore.from_verdicts(verdicts)],
        dropped=["stops after completion"],
        usage={"propose": StageUsage(calls=1, prompt_tokens=100, completion_tokens=20, cost=0.01, latency_s=0.5)},
        fallbacks=["attribute: invalid JSON after 2 repairs; used stage-4 verdicts"],
    )
    again = GroupScore.model_validate_json(group.model_dump_json())
    assert again == group
    assert again.scores[0].verdicts[0].cited_steps == [1, 2]  # sorted, de-duplicated
    assert group.total_usage.calls == 1 and group.rewards == [0.0]


def test_reward_is_p_minus_f_over_p_plus_f():
    assert rubric_reward(3, 1) == 0.5
    assert rubric_reward(0, 0) == 0.0
    score = TrajectoryScore.from_verdicts([Verdict(criterion=c, score=s) for c, s in
                                           [("a", 1), ("b", 1), ("c", -1), ("d", 0), ("e", 1)]])
    assert (score.p, score.f, score.reward) == (3, 1, 0.5)
    with pytest.raises(ValueError, match="p=-1"):
        rubric_reward(-1, 0)


def test_step_counts_feed_step_quality():
    verdicts = [Verdict(criterion="a", score=1, cited_steps=[1, 2]), Verdict(criterion="b", score=-1, cited_steps=[2]),
                Verdict(criterion="c", score=0, cited_steps=[1])]
    assert TrajectoryScore.from_verdicts(verdicts).step_counts(3) == ([1, 1, 0], [0, 1, 0])
    with pytest.raises(ValueError, match="cites step 4, but the trajectory has 3 steps"):
        TrajectoryScore.from_verdicts([Verdict(criterion="a", score=1, cited_steps=[4])]).step_counts(3)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["steps"][1].update(index=3), r"steps\[1\].index is 3"),
        (lambda d: d["token_step"].append(1), "token_step has 8 entries but token_ids has 7"),
        (lambda d: d["token_step"].__setitem__(1, 5), r"token_step\[1\] is 5"),
        (lambda d: d["token_logprobs"].pop(), "token_logprobs has 6 entries"),
        (lambda d: d["steps"][0].update(n_tokens=-1), "n_tokens"),
        (lambda d: d.update(surprise=1), "surprise"),
    ],
)
def test_invalid_trajectories_name_the_field(change, message):
    data = make_trajectory().model_dump()
    change(data)
    with pytest.raises(ValidationError, match=message):
        Trajectory.model_validate(data)


def test_invalid_verdicts():
    with pytest.raises(ValidationError, match="score"):
        Verdict(criterion="a", score=2)
    with pytest.raises(ValidationError, match="1-based"):
        Verdict(criterion="a", score=1, cited_steps=[0])
    with pytest.raises(ValidationError, match="reward must be finite"):
        TrajectoryScore(reward=float("nan"))


def test_pass_at_k_and_pass_hat_k_by_hand():
    from draco_gym.metrics import pass_at_k, pass_hat_k

    # 4 episodes, 3 successes, k = 2: pass^2 = C(3,2)/C(4,2) = 1/2; pass@2 = 1 - C(1,2)/C(4,2) = 1
    assert pass_hat_k(4, 3, 2) == pytest.approx(0.5) and pass_at_k(4, 3, 2) == 1.0
    assert pass_hat_k(4, 1, 1) == pass_at_k(4, 1, 1) == 0.25
    with pytest.raises(ValueError, match="k must be within 1..4"):
        pass_hat_k(4, 1, 5)
    with pytest.raises(ValueError, match="successes must be within 0..4"):
        pass_at_k(4, 5, 1)
