"""The reward-hacking alarm's arithmetic, against numbers worked by hand: Kendall's tau-b
between the training reward and the environment's outcome within each group
(outcome_agreement), the windowed "reward rises while the outcome falls" detector, and the
collapse alarm beside it ("the outcome falls while the KL climbs")."""

from __future__ import annotations

import math

import pytest

from draco_gym.metrics import kendall_tau_b, outcome_agreement, reward_outcome_divergence, success_kl_collapse
from reward_fixtures import COLLAPSE_KL, COLLAPSE_SUCCESS


def test_kendall_tau_b_by_hand():
    # rewards 0.5, -0.2, 0.1, 0.9; outcomes 1, 0, 0, 1. The 6 pairs:
    #   (1,2) (1,3) (2,4) (3,4) concordant; (1,4) and (2,3) tied in the outcome: neither
    #   n0 = 6, ties in x 0, ties in y 2: tau-b = (4 - 0) / sqrt(6 * 4) = 0.8165
    assert kendall_tau_b([0.5, -0.2, 0.1, 0.9], [1, 0, 0, 1]) == pytest.approx(4 / math.sqrt(24))
    # a reward that ranks the failures first: every untied pair discordant
    assert kendall_tau_b([-1.0, 1.0, 0.5], [1, 0, 0]) == pytest.approx(-2 / math.sqrt(3 * 2))
    # a tie in the reward too: rewards 1, 1, 0; outcomes 1, 0, 0 -> pairs (1,2) tied in x,
    # (1,3) concordant, (2,3) tied in y: 1 / sqrt((3 - 1) (3 - 1)) = 0.5
    assert kendall_tau_b([1.0, 1.0, 0.0], [1, 0, 0]) == pytest.approx(0.5)
    assert kendall_tau_b([1.0, 2.0], [1, 1]) is None and kendall_tau_b([0.3], [1]) is None
    with pytest.raises(ValueError, match="x has 2 values, y has 1"):
        kendall_tau_b([1, 2], [1])


def test_outcome_agreement_averages_groups_with_spread_in_both():
    groups = [
        ([0.5, -0.2, 0.1, 0.9], [True, False, False, True]),  # 0.8165
        ([-1.0, 1.0, 0.5], [1, 0, 0]),                       # -0.8165
        ([1.0, 1.0, 0.0], [1.0, 0.0, 0.0]),                  # 0.5
        ([0.2, 0.9], [1, 1]),                                # no spread in the outcome: left out
        ([0.0, 0.0, 0.0], [1, 0, 1]),                        # no spread in the reward: left out
    ]
    assert outcome_agreement(groups) == pytest.approx(0.5 / 3)
    # an outcome that is not a number leaves its rollout out: the group below keeps 2 rollouts
    assert outcome_agreement([([0.1, 0.9, 0.5], [0, 1, float("nan")])]) == pytest.approx(1.0)
    assert outcome_agreement([([0.1, 0.9], [None, None])]) is None and outcome_agreement([]) is None
    with pytest.raises(ValueError, match="group 0: 2 rewards for 3 outcomes"):
        outcome_agreement([([0.1, 0.2], [1, 0, 1])])


def test_the_alarm_fires_when_the_reward_rises_and_the_outcome_falls():
    rewards = [0.1, 0.2, 0.3, 0.4]
    # least-squares slope of 0.8, 0.7, 0.7, 0.6 against 0..3: cov -0.3 / var 5 = -0.06 per
    # iteration, -0.18 over the window; the reward's 0.1 per iteration, +0.3 over it
    rise, fall = reward_outcome_divergence(rewards, [0.8, 0.7, 0.7, 0.6], window=4)
    assert (rise, fall) == (pytest.approx(0.3), pytest.approx(-0.18))
    # both rising, or the outcome flat within the margin: no alarm
    assert reward_outcome_divergence(rewards, [0.5, 0.6, 0.6, 0.7], window=4) is None
    assert reward_outcome_divergence(rewards, [0.70, 0.71, 0.69, 0.69], window=4) is None  # fall -0.015
    # only the last window counts: an early fall followed by a recovery does not fire
    assert reward_outcome_divergence([0.0, 0.1, *rewards], [0.9, 0.5, 0.6, 0.6, 0.7, 0.8], window=4) is None
    # too few iterations with an outcome yet
    assert reward_outcome_divergence(rewards, [0.8, None, 0.7, 0.6], window=4) is None
    assert reward_outcome_divergence([0.0, *rewards], [0.9, 0.8, None, 0.7, 0.6], window=4) == (
        pytest.approx(_change([0.0, 0.1, 0.3, 0.4])), pytest.approx(_change([0.9, 0.8, 0.7, 0.6])))
    with pytest.raises(ValueError, match="window must be >= 2"):
        reward_outcome_divergence(rewards, rewards, window=1)


def _change(values):
    """slope x (n - 1) of 4 values, written out: sum((i - 1.5) (v - mean)) / 5 x 3."""
    mean = sum(values) / 4
    return sum((i - 1.5) * (v - mean) for i, v in enumerate(values)) / 5 * 3


def test_the_collapse_alarm_fires_when_success_falls_while_the_kl_climbs():
    # Iteration 5's window, success 0.83, 1.00, 0.67, 0.17: mean 0.6675, sum((i - 1.5)(v - mean))
    # = -1.155, slope -0.231, -0.693 over the window; KL 0.015 .. 0.050: sum 0.0575, slope
    # 0.0115, +0.0345 over it.
    fires = [success_kl_collapse(COLLAPSE_SUCCESS[:t], COLLAPSE_KL[:t]) for t in range(1, 9)]
    assert fires[:4] == [None] * 4
    assert fires[4] == (pytest.approx(-0.693), pytest.approx(0.0345))
    assert fires[5] is not None and fires[6] is None  # 0.50 at iteration 7: the fitted fall is 0.18
    # Success falling with the KL flat (hard draws, the policy has not moved), or success
    # rising with the KL: no alarm.
    assert success_kl_collapse([0.8, 0.6, 0.4, 0.2], [0.030, 0.030, 0.031, 0.030]) is None
    assert success_kl_collapse([0.5, 0.6, 0.7, 0.8], [0.01, 0.02, 0.03, 0.04]) is None
    # An iteration without an outcome is left out of both series.
    assert success_kl_collapse([0.83, None, 1.00, 0.67, 0.17], [0.015, 0.9, 0.020, 0.030, 0.050]) == (
        pytest.approx(-0.693), pytest.approx(0.0345))
    with pytest.raises(ValueError, match="4 success means for 3 KL means"):
        success_kl_collapse([0.1] * 4, [0.1] * 3)
