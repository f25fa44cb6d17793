"""DRACO's closed-form step credit, uniform credit, group advantages and token mapping:
the paper's worked example, hand-computed cases, and the properties the paper claims."""

import math
import subprocess
import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from draco_gym.algos.credit import (
    CREDIT_RULES,
    draco_credit,
    get_credit_rule,
    group_advantages,
    step_quality,
    token_advantages,
    uniform_credit,
)
from draco_gym.types import GroupScore, Step, Task, Trajectory, TrajectoryScore, Verdict

# -- the paper's worked example ------------------------------------------------------------

N_TOKENS = [40, 40, 30, 50, 30, 60, 60]
# Q = [1, 1, 1/2, 1/3, 1/2, 1/3, uncited] written as (passes, fails) per step
PASSES = [2, 1, 1, 1, 1, 1, 0]
FAILS = [0, 0, 1, 2, 1, 2, 0]


def test_paper_worked_example():
    a = draco_credit(1.0, N_TOKENS, PASSES, FAILS)
    totals = [n * aj for n, aj in zip(N_TOKENS, a)]
    q_bar = (1 + 1 + 0.5 + 1 / 3 + 0.5 + 1 / 3) / 6
    assert q_bar == pytest.approx(0.611, abs=1e-3)
    assert totals[0] == pytest.approx(72.5, abs=0.05) and totals[1] == pytest.approx(72.5, abs=0.05)
    assert totals[3] == pytest.approx(24.2, abs=0.05) and totals[5] == pytest.approx(24.2, abs=0.05)
    assert totals[6] == pytest.approx(310 * q_bar / (11 / 3 + q_bar))  # the uncited step takes Q-bar
    assert sum(totals) == pytest.approx(310)


def test_worked_example_by_hand_for_a_loser():
    # A = -1: weights are 1 - Q = [0, 0, 1/2, 2/3, 1/2, 2/3, 1 - Q-bar]
    a = draco_credit(-1.0, N_TOKENS, PASSES, FAILS)
    q_bar = (11 / 3) / 6
    w = [0, 0, 0.5, 2 / 3, 0.5, 2 / 3, 1 - q_bar]
    expected = [-310 * wj / (n * sum(w)) for wj, n in zip(w, N_TOKENS)]
    assert a == pytest.approx(expected)
    assert a[0] == 0.0 and a[1] == 0.0  # a loser's fully passing steps are left alone


def test_step_quality():
    assert step_quality([2, 0, 1], [0, 0, 3]) == [1.0, None, 0.25]


# -- fallbacks and edge cases --------------------------------------------------------------


def test_nothing_cited_falls_back_to_uniform():
    assert draco_credit(0.7, [10, 20, 30], [0, 0, 0], [0, 0, 0]) == [0.7, 0.7, 0.7]


def test_zero_weight_sum_falls_back_to_uniform():
    # A winner whose every cited step only failed has all weights 0.
    assert draco_credit(1.5, [10, 20], [0, 0], [1, 2]) == [1.5, 1.5]
    # A loser whose every cited step only passed, likewise.
    assert draco_credit(-1.5, [10, 20], [3, 1], [0, 0]) == [-1.5, -1.5]


def test_one_step_gets_the_trajectory_advantage():
    assert draco_credit(0.8, [25], [1], [3]) == pytest.approx([0.8])


def test_unanimous_citations():
    # Every step passed unanimously (Q = 1): a winner's weights are equal, so every step's
    # total is A N / M = 0.4 * 21 / 3 = 2.8 ...
    credit = draco_credit(0.4, [5, 7, 9], [2, 1, 4], [0, 0, 0])
    assert credit == pytest.approx([2.8 / 5, 2.8 / 7, 2.8 / 9])
    # ... and a loser's are all 0, so it falls back to uniform.
    assert draco_credit(-0.4, [5, 7, 9], [2, 1, 4], [0, 0, 0]) == [-0.4] * 3


def test_zero_advantage_gives_zero():
    assert draco_credit(0.0, [5, 7], [1, 0], [0, 1]) == [0.0, 0.0]


def test_zero_token_step_takes_no_share():
    a = draco_credit(1.0, [10, 0, 10], [1, 1, 0], [0, 0, 1])
    assert a[1] == 0.0
    assert 10 * a[0] + 10 * a[2] == pytest.approx(20.0)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: draco_credit(float("nan"), [1], [1], [0]), "advantage"),
        (lambda: draco_credit(1.0, [1, -2], [1, 0], [0, 0]), "step_tokens[1]"),
        (lambda: draco_credit(1.0, [1, 2], [1], [0, 0]), "step_passes"),
        (lambda: draco_credit(1.0, [1, 2], [1, 0], [0, -1]), "step_fails[1]"),
        (lambda: draco_credit(1.0, [0, 0], [1, 0], [0, 0]), "step_tokens are all 0"),
        (lambda: group_advantages([1.0, float("nan")]), "rewards[1]"),
        (lambda: token_advantages([0.5, 0.2], [-1, 1, 3]), "token_step_index[2]"),
        (lambda: token_advantages([0.5], [0]), "token_step_index[0]"),
        (lambda: uniform_credit(float("inf"), [1]), "advantage"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        call()


# -- group advantages and tokens -----------------------------------------------------------


def test_group_advantages_by_hand():
    # rewards 1, 0, -1: mean 0, population std sqrt(2/3)
    a = group_advantages([1.0, 0.0, -1.0], eps=0.0)
    s = math.sqrt(2 / 3)
    assert a == pytest.approx([1 / s, 0.0, -1 / s])


def test_group_without_spread_gives_zeros():
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


def test_token_advantages_gap_tokens_get_zero():
    assert token_advantages([0.5, -0.25], [-1, -1, 1, 1, -1, 2, -1]) == [0, 0, 0.5, 0.5, 0, -0.25, 0]


# -- properties (hypothesis) ---------------------------------------------------------------

counts = st.integers(min_value=0, max_value=6)


@st.composite
def trajectories(draw, min_steps=1):
    m = draw(st.integers(min_value=min_steps, max_value=12))
    n = draw(st.lists(st.integers(min_value=1, max_value=500), min_size=m, max_size=m))
    p = draw(st.lists(counts, min_size=m, max_size=m))
    f = draw(st.lists(counts, min_size=m, max_size=m))
    return n, p, f


def redistributes(a, p, f):
    """DRACO redistributes (no uniform fallback): something is cited and the weights sum > 0."""
    q = [qj for qj in step_quality(p, f) if qj is not None]
    if not q:
        return False
    q_bar = sum(q) / len(q)
    weights = [q_bar if qj is None else qj for qj in step_quality(p, f)]
    return sum(w if a >= 0 else 1 - w for w in weights) > 1e-12


advantages = st.floats(min_value=-5, max_value=5, allow_nan=False).filter(lambda a: abs(a) > 1e-6)


@settings(max_examples=300, deadline=None)
@given(trajectories(), advantages)
def test_conservation(traj, a):
    n, p, f = traj
    credit = draco_credit(a, n, p, f)
    assert sum(nj * aj for nj, aj in zip(n, credit)) == pytest.approx(a * sum(n), rel=1e-9, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(trajectories(), advantages)
def test_no_step_opposes_the_trajectory(traj, a):
    n, p, f = traj
    assert all(aj * a >= 0 for aj in draco_credit(a, n, p, f))


@settings(max_examples=200, deadline=None)
@given(trajectories(), advantages, st.floats(min_value=0.05, max_value=20))
def test_linear_in_the_advantage(traj, a, c):
    n, p, f = traj
    assert draco_credit(c * a, n, p, f) == pytest.approx([c * x for x in draco_credit(a, n, p, f)], rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(trajectories(), st.floats(min_value=0.01, max_value=5))
def test_winner_loser_symmetry(traj, a):
    # A loser whose step j has quality Q is credited like a winner whose step j has 1 - Q:
    # swapping passes and fails maps Q to 1 - Q (and keeps uncited steps uncited).
    n, p, f = traj
    loser = draco_credit(-a, n, p, f)
    winner = draco_credit(a, n, f, p)
    assert loser == pytest.approx([-x for x in winner], rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(trajectories(min_steps=2), advantages, st.randoms(use_true_random=False))
def test_step_totals_do_not_depend_on_step_length(traj, a, rnd):
    # Moving tokens between steps (same N) leaves every step's total n_j a_j unchanged.
    n, p, f = traj
    assume(redistributes(a, p, f))  # the uniform fallback gives every token A instead
    shuffled = n[:]
    rnd.shuffle(shuffled)
    before = [nj * aj for nj, aj in zip(n, draco_credit(a, n, p, f))]
    after = [nj * aj for nj, aj in zip(shuffled, draco_credit(a, shuffled, p, f))]
    assert after == pytest.approx(before, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(trajectories(), advantages, st.integers(min_value=1, max_value=5), st.integers(min_value=0, max_value=5))
def test_equal_weights_give_equal_step_totals(traj, a, passes, fails):
    # Every step cited with the same pass/fail mix: equal Q, so equal totals A N / M.
    n, _, _ = traj
    m = len(n)
    assume(redistributes(a, [passes] * m, [fails] * m))
    credit = draco_credit(a, n, [passes] * m, [fails] * m)
    totals = [nj * aj for nj, aj in zip(n, credit)]
    assert totals == pytest.approx([a * sum(n) / m] * m, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(trajectories(min_steps=2), st.floats(min_value=0.01, max_value=5))
def test_winners_push_high_quality_steps_harder_losers_suppress_low_quality_harder(traj, a):
    n, p, f = traj
    q = step_quality(p, f)
    cited = [qj for qj in q if qj is not None]
    assume(cited)
    q_bar = sum(cited) / len(cited)
    q = [q_bar if qj is None else qj for qj in q]
    win = [nj * x for nj, x in zip(n, draco_credit(a, n, p, f))]
    lose = [nj * x for nj, x in zip(n, draco_credit(-a, n, p, f))]
    for i in range(len(n)):
        for j in range(len(n)):
            if q[i] > q[j] + 1e-12:
                assert win[i] >= win[j] - 1e-9
                assert lose[i] >= lose[j] - 1e-9  # less negative: low-Q steps suppressed harder


# -- the registry ---------------------------------------------------------------------------


def _trajectory(n_tokens):
    steps = [Step(index=i + 1, text=f"step {i + 1}", code="x = 1", n_tokens=n) for i, n in enumerate(n_tokens)]
    return Trajectory(task=Task(id="t", instruction="do it"), steps=steps)


def test_registry_rules_match_the_functions():
    assert {"uniform", "draco"} <= set(CREDIT_RULES.names())
    trajs = [_trajectory(N_TOKENS), _trajectory([10, 10])]
    verdicts = [
        Verdict(criterion="a", score=1, cited_steps=[1, 2, 3, 4, 5, 6]),
        Verdict(criterion="b", score=1, cited_steps=[1]),
        Verdict(criterion="c", score=-1, cited_steps=[3, 4, 5, 6]),
        Verdict(criterion="d", score=-1, cited_steps=[4, 6]),
    ]
    group = GroupScore(scores=[TrajectoryScore.from_verdicts(verdicts), TrajectoryScore.from_verdicts([])])
    draco = get_credit_rule("draco")(trajs, group, [1.0, -1.0])
    assert draco[0] == pytest.approx(draco_credit(1.0, N_TOKENS, PASSES, FAILS))
    assert draco[1] == [-1.0, -1.0]
    assert get_credit_rule("uniform")(trajs, group, [1.0, -1.0]) == [[1.0] * 7, [-1.0, -1.0]]


def test_registry_unknown_name_and_group_mismatch():
    with pytest.raises(KeyError, match="unknown credit rule 'drako'.*Did you mean 'draco'"):
        get_credit_rule("drako")
    one = TrajectoryScore.from_verdicts([])
    with pytest.raises(ValueError, match="group sizes differ: 1 trajectories, 1 advantages, 2 scores"):
        get_credit_rule("uniform")([_trajectory([1])], GroupScore(scores=[one, one]), [0.0])
    with pytest.raises(ValueError, match="group sizes differ: 1 trajectories, 2 advantages"):
        get_credit_rule("trace", scorer=lambda t: [0.0])([_trajectory([1])], GroupScore(), [0.0, 1.0])
    with pytest.raises(ValueError, match="group sizes differ: 1 trajectories, 1 advantages, 0 scores"):
        get_credit_rule("draco")([_trajectory([1])], GroupScore(), [0.0])


def test_credit_module_does_not_import_torch():
    code = "import sys, draco_gym.algos.credit; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
