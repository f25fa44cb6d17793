"""An episode that ended in ``env_error`` failed for the infrastructure (a sandbox that
crashed, a world that timed out, a protocol breach), not for the policy (issue 36): it is
left out of its group's mean and std and out of the loss, and counted
(``env_runners/env_errors``); a group it leaves with fewer than two episodes is skipped and
counted (``credit/groups_skipped``). Worked numbers: rewards [1, 0] beside an ``env_error``
episode that scored 1 give A = +-0.5 / (0.5 + 1e-6), not the [0.71, -1.41, 0.71] of the
three together."""

from __future__ import annotations

import pytest

from draco_gym.algos.credit import apply_credit, get_credit_rule
from draco_gym.types import GroupScore, RolloutGroup, Step, Task, Trajectory, TrajectoryScore, Verdict

TASK = Task(id="t", instruction="Submit the total.")
EPS = 1e-6


def episode(termination: str = "no_code") -> Trajectory:
    """Two steps of 3 tokens each, a gap token between them."""
    steps = [Step(index=1, text="```python\nx = 1\n```", code="x = 1", n_tokens=3),
             Step(index=2, text="```python\nsubmit(x)\n```", code="submit(x)", n_tokens=3)]
    token_step = [1, 1, 1, -1, 2, 2, 2]
    return Trajectory(task=TASK, steps=steps, termination=termination, token_ids=list(range(7)),
                      token_step=token_step, token_logprobs=[-1.0] * 7)


def group(*ended: tuple[str, float]) -> RolloutGroup:
    """A scored group: one episode per ``(termination, reward)``; each reward is one
    criterion's verdict on step 2 (1: PASS, -1: FAIL; 0: none)."""
    trajs, scores = [], []
    for termination, reward in ended:
        trajs.append(episode(termination))
        verdicts = [Verdict(criterion="submits", score=int(reward), cited_steps=[2])] if reward else []
        scores.append(TrajectoryScore.from_verdicts(verdicts))
    return RolloutGroup(task_id=TASK.id, trajectories=trajs, score=GroupScore(scores=scores))


MIXED = group(("no_code", 1), ("no_code", -1), ("env_error", 1))  # one env_error among three
LONE = group(("env_error", 1), ("no_code", -1))  # one episode left: no baseline
WHOLE = group(("no_code", 1), ("max_turns", -1))  # nothing failed


@pytest.mark.parametrize("rule", ["uniform", "draco"])
def test_env_error_episodes_are_left_out_of_the_group_statistics_and_the_loss(rule):
    batch = apply_credit([MIXED, LONE, WHOLE], get_credit_rule(rule))
    a = 1.0 / (1.0 + EPS)  # rewards [1, -1]: mean 0, population std 1
    assert batch.group_advantages[0] == pytest.approx([a, -a, 0.0], abs=1e-12)
    assert batch.group_advantages[1] == [0.0, 0.0]  # skipped: one episode left
    assert batch.group_advantages[2] == pytest.approx([a, -a], abs=1e-12)
    assert batch.left_out == [False, False, True, True, True, False, False]
    assert (batch.env_errors, batch.skipped_groups) == (2, 1)
    # what is left out carries no advantage on any token, and the loss never sees it
    for i in (2, 3, 4):
        assert batch.step_advantages[i] == [0.0, 0.0] and set(batch.token_advantages[i]) == {0.0}
    learned, advantages = batch.learned()
    assert [next(i for i, t in enumerate(batch.trajectories) if t is kept) for kept in learned] == [0, 1, 5, 6]
    assert advantages == [batch.token_advantages[i] for i in (0, 1, 5, 6)]
    # the rule spreads A_i over the kept episodes' steps as it would in a group without the error
    alone = apply_credit([group(("no_code", 1), ("no_code", -1))], get_credit_rule(rule))
    assert batch.step_advantages[:2] == alone.step_advantages


def test_a_group_of_one_is_kept_and_one_env_error_alone_is_skipped():
    single = apply_credit([group(("no_code", 1))], get_credit_rule("uniform"))
    assert (single.left_out, single.skipped_groups, single.group_advantages) == ([False], 0, [[0.0]])
    failed = apply_credit([group(("env_error", 1))], get_credit_rule("uniform"))
    assert (failed.left_out, failed.env_errors, failed.skipped_groups) == ([True], 1, 1)
    assert failed.learned() == ([], [])


def test_the_iteration_counts_env_errors_and_skipped_groups():
    from draco_gym.algos.rllib.reporting import PHASES, iteration_metrics

    groups = [MIXED, LONE, WHOLE]
    stats = iteration_metrics(groups, apply_credit(groups, get_credit_rule("uniform")), dict.fromkeys(PHASES, 0.0),
                              1.0, 0)
    assert stats["env_runners/env_errors"] == 2
    assert stats["credit/groups_skipped"] == 1
    assert stats["credit/groups_with_spread"] == 2  # the skipped group's spread teaches nothing


def test_the_learner_steps_only_on_the_episodes_in_the_loss(monkeypatch):
    """``GRPO.update`` builds its token batch from ``CreditedBatch.learned``; with every
    group skipped it takes no step at all."""
    from types import SimpleNamespace

    from draco_gym.algos.policy import iteration
    from draco_gym.algos.rllib import grpo

    class Built(Exception):
        """Raised by the fake token_batch: the batch it was built from is all this test reads."""

    def token_batch(trajectories, advantages, pad_id):
        raise Built(trajectories, advantages)

    monkeypatch.setattr(iteration, "token_batch", token_batch)
    algo = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(optim=None)))
    assert grpo.GRPO.update(algo, apply_credit([LONE], get_credit_rule("uniform"))) is None  # no step
    batch = apply_credit([MIXED], get_credit_rule("uniform"))
    with pytest.raises(Built) as built:
        grpo.GRPO.update(algo, batch)
    assert built.value.args == (batch.trajectories[:2], batch.token_advantages[:2])


@pytest.mark.parametrize("scored", [MIXED, LONE, WHOLE])
def test_the_report_shows_the_advantages_training_used(scored, tmp_path):
    """``draco-gym report`` recomputes A_i from the rollout log: the same ones credit used
    (env_error episodes 0, a skipped group all 0)."""
    from draco_gym.algos.rllib.reporting import RolloutLog
    from draco_gym.records import read_records
    from draco_gym.report import Limits, _Group, as_record, summarise_group

    batch = apply_credit([scored], get_credit_rule("uniform"))
    path = tmp_path / "rollouts.jsonl"
    RolloutLog(path).write([scored], iteration=0, step_advantages=batch.step_advantages)
    records, _ = read_records(path)
    group = _Group(0, TASK.id, [(n, as_record(raw, path, n)) for n, raw in enumerate(records, start=1)])
    summary, _, _ = summarise_group(group, 0, path.name, Limits())
    assert [row["A"] for row in summary["roll"]] == pytest.approx(batch.group_advantages[0], abs=1e-12)


def test_trls_advantages_leave_out_an_env_error_episode():
    """Where TRL normalised over the whole group, the env_error episode included (another
    reward function scored it), the credit trainer takes GRPO's A_i over the episodes that
    count instead (rewards 1, 0 and a failed 0: +1 and -1, not +1.41 and -0.71), and keeps
    TRL's own where nothing failed."""
    from draco_gym.algos.trl import without_env_errors
    from draco_gym.types import Task, Trajectory

    task = Task(id="t", instruction="")
    members = [Trajectory(task=task, termination=t) for t in ("submitted", "submitted", "env_error")]
    trl_own = [1.41, -0.71, -0.71]
    assert without_env_errors(trl_own, members, [1.0, 0.0, 0.0]) == pytest.approx([1.0, -1.0, 0.0], abs=1e-5)
    fine = [Trajectory(task=task, termination="submitted") for _ in range(3)]
    assert without_env_errors(trl_own, fine, [1.0, 0.0, 0.0]) == trl_own


def test_trls_reward_function_calls_an_env_error_episode_unscorable():
    """TRLReward returns None for an ``env_error`` row: TRL's own GRPOTrainer (>= 1.16) then
    leaves it out of its group's mean and std and gives it advantage 0, so plain TRL, not only
    the credit trainer, learns from the episodes that count."""
    from draco_gym.reward import TRLReward, build_reward

    members = [Trajectory(task=TASK, steps=[Step(index=1, text="", code="submit(3)")], termination=t,
                          metrics={"success": ok}) for t, ok in (("submitted", True), ("submitted", False),
                                                                 ("env_error", True))]
    reward = TRLReward(build_reward("outcome"), num_generations=3)
    values = reward(["t"] * 3, [""] * 3, trajectory=members)
    assert values[2] is None
    assert values[0] > values[1]
    assert len(reward.last_groups[0][1].rewards) == 3  # the verdicts behind the row are kept
