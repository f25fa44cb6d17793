"""Before/after evaluation figures with intervals, and the run's plain statements."""

from __future__ import annotations

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401
from draco_gym.algos.evaluation import comparison_notes, episode_summary, no_update_note
from draco_gym.metrics import difference, share, wilson
from draco_gym.reward import build_reward
from draco_gym.types import RolloutGroup, Task, Trajectory


def corridor_groups(door_plays, task="corridor-1", score=True):
    env = gym.make("draco_gym/Corridor-v0")
    trajs = []
    for messages in door_plays:
        env.reset(seed=0, options={"task_id": task})
        for m in messages:
            *_, done, cut, _ = env.step(m)
            if done or cut:
                break
        trajs.append(env.unwrapped.trajectory())
    group = RolloutGroup(task_id=task, trajectories=trajs,
                         score=build_reward("corridor").score_group(trajs[0].task, trajs) if score else None)
    return [group]


def act(d):
    return f"```python\nopen_door({d})\n```"


def test_summary_counts_episodes_turns_and_blocks():
    plays = [[act(3), act(0), act(1), act(0)],                       # success, 4 clean turns
             ["hello", act(2), act(2), act(0), act(1)],              # a turn without code, then a miss
             ["```python\nopen_door(7)\n```", act(3), act(2), act(0), act(0)]]  # a raising block
    s = episode_summary(corridor_groups(plays))
    assert s["episodes"] == 3
    assert s["success_rate"]["k"] == 2 and s["success_rate"]["n"] == 3
    assert (s["well_formed_turns"]["k"], s["well_formed_turns"]["n"]) == (13, 14)
    # executed blocks that raised: the door that does not exist and two hallway traps
    assert (s["raised_blocks"]["k"], s["raised_blocks"]["n"]) == (3, 13)
    assert 0 <= s["rubric_pass_rate"]["mean"] <= 1 and s["rubric_pass_rate"]["n"] > 0
    lo, hi = s["success_rate"]["ci95"]
    assert lo < 2 / 3 < hi


def test_wilson_interval_and_difference():
    assert wilson(0, 0) == [0.0, 1.0]
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    d = difference({"mean": 0.25, "n": 128}, {"mean": 0.9, "n": 128})
    assert d["delta"] == pytest.approx(0.65) and d["ci95"][0] > 0.5


def test_paired_difference_worked_numbers():
    """Newcombe's method 10 on 21 pairs: 1 passed both times, 1 only before, 7 only after, 12
    neither (the before/after table of Bentur et al. 2009, used as the worked example of
    Fagerland, Lydersen & Laake's chapter on the paired 2x2 table). By hand:
    p1 = 2/21 = 0.0952, Wilson [0.0265, 0.2891]; p2 = 8/21 = 0.3810, Wilson [0.2052, 0.5914];
    ad - bc = 1*12 - 1*7 = 5 <= n/2 = 10.5, so the corrected phi is 0;
    lower = 0.2857 - sqrt((0.3810 - 0.2052)^2 + (0.2891 - 0.0952)^2) = 0.2857 - 0.2617 = 0.0240...
    """
    from draco_gym.metrics import paired_difference

    before = [True, True] + [False] * 7 + [False] * 12
    after = [True, False] + [True] * 7 + [False] * 12
    d = paired_difference(before, after)
    assert d["delta"] == pytest.approx(6 / 21)
    assert d["ci95"] == pytest.approx([0.0256, 0.5069], abs=5e-4)
    assert d["changed"] == {"gained": 7, "lost": 1} and d["paired"] == 21
    # a strong positive association (ad - bc = 36*23 - 3*18 = 774 > 40) narrows the interval
    # well below the independent samples' [+0.037, +0.338] for the same 39/80 -> 54/80
    before = [True] * 39 + [False] * 41
    after = [True] * 36 + [False] * 3 + [True] * 18 + [False] * 23
    d = paired_difference(before, after)
    assert d["ci95"] == pytest.approx([0.0783, 0.2887], abs=5e-4)
    unpaired = difference({"mean": 39 / 80, "n": 80}, {"mean": 54 / 80, "n": 80})
    assert unpaired["ci95"] == pytest.approx([0.0374, 0.3376], abs=5e-4)
    # difference() pairs exactly when both sides name the same episodes
    outcomes = lambda xs: {f"t/{i}": x for i, x in enumerate(xs)}  # noqa: E731
    b = {"mean": 39 / 80, "n": 80, "outcomes": outcomes(before)}
    a = {"mean": 54 / 80, "n": 80, "outcomes": outcomes(after)}
    assert difference(b, a)["ci95"] == pytest.approx(d["ci95"])
    assert difference(b, {**a, "outcomes": {**outcomes(after[:-1]), "u/0": False}})["ci95"] == unpaired["ci95"]
    with pytest.raises(ValueError, match="pairs need both sides"):
        paired_difference([True], [True, False])


def test_notes_pair_the_episodes_of_one_seed():
    """Two evaluations with one seed: the note's interval is the paired one and says how many
    episodes changed outcome each way."""
    task = Task(id="t", instruction="")
    groups = lambda wins: [RolloutGroup(task_id="t", trajectories=[  # noqa: E731
        Trajectory(task=task, metrics={"success": w}) for w in wins])]
    before = episode_summary(groups([True] * 39 + [False] * 41))
    after = episode_summary(groups([True] * 36 + [False] * 3 + [True] * 18 + [False] * 23))
    note = comparison_notes(before, after)[0]
    assert note == ("success_rate: 0.487 -> 0.675; the 95% CI of the difference [+0.078, +0.289] (paired over the "
                    "same 80 episodes: 18 passed only after, 3 only before) excludes zero: better after training "
                    "(80 and 80 episodes)")


def rate(k, n):
    return share(k, n)


def test_notes_say_when_an_evaluation_cannot_tell():
    few = {"episodes": 4, "success_rate": {"mean": 0.25, "k": 1, "n": 4, "ci95": wilson(1, 4)}}
    more = {"episodes": 4, "success_rate": {"mean": 0.5, "k": 2, "n": 4, "ci95": wilson(2, 4)}}
    notes = comparison_notes(few, more)
    assert len(notes) == 1 and "does not exclude zero" in notes[0] and "(4 and 4 episodes)" in notes[0]
    big_b = {"episodes": 128, "success_rate": rate(32, 128)}
    big_a = {"episodes": 128, "success_rate": rate(115, 128)}
    [note] = comparison_notes(big_b, big_a)
    assert note.startswith("success_rate: 0.250 -> 0.898; the 95% CI of the difference [+0.557, +0.740] excludes "
                           "zero: better after training (128 and 128 episodes)"), note


def test_notes_count_episodes_as_episodes_and_name_a_worsening():
    """A rate over verdicts or blocks names its own count beside the episodes, never as
    episodes; a change for the worse beyond noise is named (for raised blocks: a rise)."""
    before = {"episodes": 8, "rubric_pass_rate": rate(20, 40), "raised_blocks": rate(2, 30),
              "success_rate": rate(7, 8)}
    after = {"episodes": 8, "rubric_pass_rate": rate(22, 38), "raised_blocks": rate(15, 30),
             "success_rate": rate(1, 8)}
    notes = {n.split(":")[0]: n for n in comparison_notes(before, after)}
    assert "too few episodes (8 and 8 episodes; 40 and 38 verdicts) to tell" in notes["rubric_pass_rate"]
    # 2/30 -> 15/30: +0.433, half-width 1.96 * sqrt(.0667*.9333/30 + .25/30) = 0.200
    assert notes["raised_blocks"] == ("raised_blocks: 0.067 -> 0.500; the 95% CI of the difference [+0.233, +0.633] "
                                      "excludes zero: WORSE after training (8 and 8 episodes; 30 and 30 executed "
                                      "blocks)")
    assert "excludes zero: WORSE after training (8 and 8 episodes)" in notes["success_rate"]
    fewer_raised = comparison_notes({"episodes": 8, "raised_blocks": rate(15, 30)},
                                    {"episodes": 8, "raised_blocks": rate(2, 30)})
    assert "excludes zero: better after training" in fewer_raised[0]


def test_a_rate_at_zero_on_both_sides_is_not_called_too_few_episodes():
    """0 of 50 and 0 of 40 raised blocks: the normal approximation's interval of the
    difference is [0, 0], which says nothing; the note says no change was seen and how far
    each side's own (Wilson) interval reaches: 0 of 40 -> [0, 3.84/40 / (1 + 3.84/40)] = [0, 0.09]."""
    before = {"episodes": 10, "raised_blocks": rate(0, 50), "success_rate": rate(10, 10)}
    after = {"episodes": 10, "raised_blocks": rate(0, 40), "success_rate": rate(10, 10)}
    notes = comparison_notes(before, after)
    assert notes == ["success_rate: 1.000 before and after (10 of 10 and 10 of 10 episodes): no change seen; each "
                     "side's 95% interval lies within [0.72, 1.00]",
                     "raised_blocks: 0.000 before and after (0 of 50 and 0 of 40 executed blocks): no change seen; "
                     "each side's 95% interval lies within [0.00, 0.09]"]
    assert not any("too few" in n for n in notes)


def test_the_table_shows_each_rate_with_its_interval():
    from draco_gym.algos.evaluation import rates_table

    before = {"episodes": 4, "success_rate": rate(1, 4), "raised_blocks": rate(0, 6)}
    after = {"episodes": 4, "success_rate": rate(3, 4), "raised_blocks": rate(1, 5)}
    text = rates_table({"before": before, "after": after}, "held-out evaluation", [("pass@2", ["0.500", "1.000"])])
    assert text.splitlines() == [
        "held-out evaluation                    before                  after",
        "success_rate               0.250 [0.05, 0.70]     0.750 [0.30, 0.95]",
        "raised_blocks              0.000 [0.00, 0.39]     0.200 [0.04, 0.62]",
        "pass@2                                  0.500                  1.000",
        "episodes                                    4                      4"]


def test_no_update_note_counts_flat_iterations():
    rows = [{"credit/groups_with_spread": 0}, {"credit/groups_with_spread": 2}, {"credit/groups_with_spread": 0}]
    assert no_update_note(rows) == "no update in 2 of 3 iterations: every group had equal rewards"
    assert no_update_note([{"credit/groups_with_spread": 1}]) is None
    assert no_update_note([{}]) is None  # older metrics without the count: no claim


def test_credit_note_says_what_the_credit_did_over_the_run():
    from draco_gym.algos.evaluation import credit_note

    rows = [{"credit/inert_share": 0.0, "credit/paper_inert_share": 0.5, "judge/mixed_groups": 3.0,
             "judge/mixed_groups_with_criteria": 1.0},
            {"credit/inert_share": 0.5, "credit/paper_inert_share": 1.0, "judge/mixed_groups": 2,
             "judge/mixed_groups_with_criteria": 0.5},
            {"credit/inert_share": 1.0, "credit/paper_inert_share": 1.0, "judge/mixed_groups": 0}]
    assert credit_note(rows) == ("credit over 3 iterations: mean inert share 0.50 (the paper's 0.83); 4 of 5 groups "
                                 "with mixed outcomes kept a criterion after dropout")
    assert credit_note([{}]) is None
    # an iteration without mixed groups reports no share: Tune's row holds None there
    rows.append({"credit/inert_share": 0.0, "credit/paper_inert_share": None, "judge/mixed_groups": 0.0,
                 "judge/mixed_groups_with_criteria": None})
    assert credit_note(rows) == ("credit over 4 iterations: mean inert share 0.38 (the paper's 0.83); 4 of 5 groups "
                                 "with mixed outcomes kept a criterion after dropout")


def test_rubric_pass_rate_counts_the_criteria_dropout_removed():
    """Two episodes, three criteria: "Solves" passed by both (dropout removes it: it tells
    them apart in nothing), "Is brief" failed by one, "Cites data" N/A for both. The rubric
    pass rate is over the whole rubric: 3 PASS of 4 PASS + FAIL, not 1 of 2 (the kept one)."""
    from draco_gym.reward import finalize_group
    from draco_gym.types import Criterion, Task, Trajectory, Verdict

    criteria = [Criterion(title=t) for t in ("Solves", "Is brief", "Cites data")]
    rows = [[Verdict(criterion="Solves", score=1), Verdict(criterion="Is brief", score=1), Verdict(criterion="Cites data", score=0)],
            [Verdict(criterion="Solves", score=1), Verdict(criterion="Is brief", score=-1), Verdict(criterion="Cites data", score=0)]]
    score = finalize_group(criteria, rows)
    assert [c.title for c in score.criteria] == ["Is brief"] and set(score.dropped) == {"Solves", "Cites data"}
    assert [s.dropped_passes for s in score.scores] == [1, 1] and score.rewards == [1.0, -1.0]
    task = Task(id="t", instruction="do it")
    groups = [RolloutGroup(task_id="t", trajectories=[Trajectory(task=task), Trajectory(task=task)], score=score)]
    rate = episode_summary(groups)["rubric_pass_rate"]
    assert (rate["k"], rate["n"]) == (3, 4)
