"""TRCA: hand-computed rewards, returns and keyed normalisation, and the registry rule."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draco_gym.algos.credit import CREDIT_RULES, get_credit_rule
from draco_gym.algos.credit.trca import (
    RuleFamily,
    discounted_returns,
    families_from_reward,
    normalise_by_key,
    trca_credit,
    trca_step_rewards,
)
from draco_gym.types import GroupScore, Step, Task, Trajectory

# Families of the hand example: item scores s_c = B_c / M_c
#   ev  (+, B=1, 2 items) -> 0.5      ex (+, B=2, 1 item) -> 2      inv (-, B=1, 2 items) -> 0.5
FAMS = (
    RuleFamily("ev", +1, 1.0, ("e1", "e2")),
    RuleFamily("ex", +1, 2.0, ("x1",)),
    RuleFamily("inv", -1, 1.0, ("i1", "i2")),
)
# Trajectory A, three steps:
#   1: ev{e1}             r^F = 0.5             covered ev{e1}         Phi = 0.5   r^B = 0.5
#   2: ev{e1}, inv{i1}    r^F = 0.5 - 0.5 = 0   nothing new            Phi = 0.5   r^B = 0
#   3: ev{e1,e2}, ex{x1}  r^F = 1 + 2 = 3       + ev{e2}, ex{x1}       Phi = 3     r^B = 2.5
# r = 0.2 r^F + 0.8 r^B = [0.5, 0, 0.6 + 2.0 = 2.6]
HITS_A = [{"ev": ["e1"]}, {"ev": ["e1"], "inv": ["i1"]}, {"ev": ["e1", "e2"], "ex": ["x1"]}]
# Trajectory B, two steps: 1: nothing; 2: ex{x1} -> r^F = [0, 2], r^B = [0, 2], r = [0, 2]
HITS_B = [{}, {"ex": ["x1"]}]


def test_rewards_by_hand():
    r_f, r_b, r = trca_step_rewards(HITS_A, FAMS, lam=0.8)
    assert r_f == pytest.approx([0.5, 0.0, 3.0])
    assert r_b == pytest.approx([0.5, 0.0, 2.5])
    assert r == pytest.approx([0.5, 0.0, 2.6])


def test_repetition_earns_no_breakthrough():
    # the same item three times: foundational each time, breakthrough only the first
    r_f, r_b, _ = trca_step_rewards([{"ev": ["e1"]}] * 3, FAMS)
    assert r_f == [0.5, 0.5, 0.5]
    assert r_b == [0.5, 0.0, 0.0]


def test_returns_by_hand():
    # gamma = 0.5: G3 = 2.6, G2 = 0 + 0.5 * 2.6 = 1.3, G1 = 0.5 + 0.5 * 1.3 = 1.15
    assert discounted_returns([0.5, 0.0, 2.6], gamma=0.5) == pytest.approx([1.15, 1.3, 2.6])
    assert discounted_returns([], gamma=0.95) == []


def test_group_credit_by_hand():
    # Returns (gamma = 0.5): A = [1.15, 1.3, 2.6], B = [1, 2]
    # key 1: {1.15, 1}: mean 1.075, std 0.075 -> A +1, B -1
    # key 2: {1.3, 2}:  mean 1.65,  std 0.35  -> A -1, B +1
    # key 3: only A -> 0
    # a = A_i + step advantage with A = [0.5, -0.5]
    out = trca_credit([HITS_A, HITS_B], [0.5, -0.5], families=FAMS, gamma=0.5)
    assert out[0] == pytest.approx([1.5, -0.5, 0.5], abs=1e-4)
    assert out[1] == pytest.approx([-1.5, 0.5], abs=1e-4)


def test_keys_without_spread_or_partner_give_zero():
    assert normalise_by_key([[1.0, 2.0], [1.0]], [[1, 2], [1]]) == [[0.0, 0.0], [0.0]]


def test_custom_keys_pool_across_steps():
    # one pool keyed "x" across both trajectories: values 0, 2 -> mean 1, std 1
    out = normalise_by_key([[0.0], [2.0]], [["x"], ["x"]])
    assert out[0][0] == pytest.approx(-1.0, abs=1e-5) and out[1][0] == pytest.approx(1.0, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8), st.lists(st.floats(-3, 3), min_size=2, max_size=8))
def test_normalised_pool_has_zero_mean(values, advs):
    out = normalise_by_key([[v] for v in values], [[0] for _ in values])
    assert abs(sum(x[0] for x in out)) < 1e-6 * len(values) + 1e-9
    # the step term only adds to A_i: with no rule hits at all, a_t = A_i
    flat = trca_credit([[{}, {}] for _ in advs], advs, families=FAMS)
    assert flat == [[pytest.approx(a), pytest.approx(a)] for a in advs]


@pytest.mark.parametrize(
    "hits, match",
    [
        ([{"nope": ["e1"]}], "unknown family 'nope'"),
        ([{"ev": ["zzz"]}], r"hits\[0\]\['ev'\]: unknown items \['zzz'\]"),
    ],
)
def test_bad_hits_name_the_field(hits, match):
    with pytest.raises(ValueError, match=match):
        trca_step_rewards(hits, FAMS)


def test_bad_options():
    with pytest.raises(ValueError, match="lam"):
        trca_step_rewards([], FAMS, lam=1.5)
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], gamma=-0.1)
    with pytest.raises(ValueError, match="sign"):
        RuleFamily("x", 0, 1.0, ("a",))
    with pytest.raises(ValueError, match="budget"):
        RuleFamily("x", 1, math.nan, ("a",))
    with pytest.raises(ValueError, match="advantages"):
        trca_credit([HITS_A], [0.1, 0.2], families=FAMS)
    with pytest.raises(ValueError, match="context_key"):
        get_credit_rule("trca", context_key="nope")


# -- against the reward layer's rules, and through the registry -----------------------------


def _traj(codes_and_outputs, task_id="t"):
    steps = []
    for i, (code, obs, extra) in enumerate(codes_and_outputs, start=1):
        text = f"```python\n{code}\n```" if code else "Done."
        steps.append(Step(index=i, text=text, code=code, observation=obs, n_tokens=10, info=extra))
    return Trajectory(task=Task(id=task_id, instruction="find it"), steps=steps, termination="no_code")


def _group():
    good = _traj([("print(find('a'))", "found a", {"exec_error": None}),
                  ("print(get(1))", "item 1", {"exec_error": None}),
                  ("submit(1)", "submitted", {"exec_error": None, "submitted": True}),
                  (None, "", {})])
    bad = _traj([("print(find('a'))", "found a", {"exec_error": None}),
                 ("print(find('a'))", "found a", {"exec_error": None}),
                 ("x = 1/0", "ZeroDivisionError: division by zero", {"exec_error": "ZeroDivisionError"}),
                 (None, "", {})])
    return [good, bad]


def test_foundational_matches_reward_layer():
    from draco_gym.reward.rules import foundational_rewards, transition_items

    fams = families_from_reward()
    for traj in _group():
        r_f, _, _ = trca_step_rewards(transition_items(traj), fams)
        assert r_f == pytest.approx(foundational_rewards(traj))


def test_registry_rule_on_trajectories():
    from draco_gym.reward.rules import transition_items

    assert "trca" in CREDIT_RULES
    trajs = _group()
    rule = get_credit_rule("trca")
    out = rule(trajs, GroupScore(), [1.0, -1.0])
    expected = trca_credit([transition_items(t) for t in trajs], [1.0, -1.0], families=families_from_reward())
    assert [pytest.approx(row) for row in expected] == out
    # the successful rollout's steps beat the failing one's at the same turn, where they differ
    assert out[0][1] > out[1][1] and out[0][2] > out[1][2]
    # keyed by context, the identical first steps (same prompt) share one pool
    by_context = get_credit_rule("trca", context_key="context")(trajs, GroupScore(), [0.0, 0.0])
    assert by_context[0][0] == pytest.approx(-by_context[1][0])
