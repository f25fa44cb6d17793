"""TRCA: hand-computed rewards, returns and keyed normalisation; the paper's rule (outcome advantage,
environment reward, state-keyed groups) through the registry; operator libraries."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draco_gym.algos.credit import get_credit_rule
from draco_gym.algos.credit.trca import (
    RuleFamily,
    TRCAOptions,
    discounted_returns,
    families_from_reward,
    hits_from_step_info,
    normalise_by_key,
    outcome_advantages,
    trca_credit,
    trca_step_rewards,
)
from draco_gym.types import STATE_KEY, TOOL_CALLS, GroupScore, Step, Task, Trajectory

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


# -- the paper's TRCA through the registry: outcome, env reward, state-keyed groups ----------


def _rollout(states, items, success, task=Task(id="t", instruction="find it")):
    """A rollout whose steps carry their state key and the rule items they hit."""
    steps = [Step(index=i, text=f"step {i}", code=f"x = {i}", observation=str(i), n_tokens=4,
                  info={STATE_KEY: state, "rule_items": hit})
             for i, (state, hit) in enumerate(zip(states, items), start=1)]
    return Trajectory(task=task, steps=steps, termination="no_code", metrics={"success": success})


def test_worked_example_env_reward_and_state_keyed_groups():
    """Three rollouts of one task, the first one succeeds. Families FAMS (item scores
    ev 0.5, ex 2, inv 0.5), lambda = 0.8 and gamma = 0.95 (the paper's).

    Episode advantage from the outcome o = [1, 0, 0]: mean 1/3, std sqrt(2/9) = 0.471405,
        A = [2/3, -1/3, -1/3] / 0.471405 = [1.414214, -0.707107, -0.707107]

    Rewards (r = 0.2 r^F + 0.8 r^B) and r_env (the outcome at the last step):
        A: step 1 at "start" ev{e1}: r = 0.5;   step 2 at "s1" ex{x1}: r = 2,  r_env = 1
        B: step 1 at "start" ev{e1}: r = 0.5;   step 2 at "s1" inv{i1}: r^F = -0.5, r^B = 0,
                                                 r = -0.1, r_env = 0
        C: step 1 at "start" nothing: r = 0;    step 2 at "s2" ev{e1}: r = 0.5, r_env = 0
    Returns R_t = r_env_t + r_t + 0.95 R_{t+1}:
        A: R2 = 1 + 2 = 3,   R1 = 0.5 + 0.95 * 3 = 3.35
        B: R2 = -0.1,        R1 = 0.5 - 0.095 = 0.405
        C: R2 = 0.5,         R1 = 0 + 0.475 = 0.475
    Groups by state:
        "start" {3.35, 0.405, 0.475}: mean 1.41, std sqrt(5.64785 / 3) = 1.372085
                -> [1.413907, -0.732462, -0.681445]
        "s1"    {3, -0.1}: mean 1.45, std 1.55 -> A +1, B -1
        "s2"    {0.5}: alone -> 0
    a = A_i + step term:
        A: [1.414214 + 1.413907, 1.414214 + 1] = [2.828121, 2.414214]
        B: [-0.707107 - 0.732462, -0.707107 - 1] = [-1.439569, -1.707107]
        C: [-0.707107 - 0.681445, -0.707107 + 0] = [-1.388552, -0.707107]
    """
    group = [_rollout(["start", "s1"], [{"ev": ["e1"]}, {"ex": ["x1"]}], True),
             _rollout(["start", "s1"], [{"ev": ["e1"]}, {"inv": ["i1"]}], False),
             _rollout(["start", "s2"], [{}, {"ev": ["e1"]}], False)]
    rule = get_credit_rule("trca", families=FAMS, hits=hits_from_step_info)
    out = rule(group, GroupScore(), [0.0, 0.0, 0.0])  # the rubric's advantages are not TRCA's
    assert out[0] == pytest.approx([2.828121, 2.414214], abs=1e-5)
    assert out[1] == pytest.approx([-1.439569, -1.707107], abs=1e-5)
    assert out[2] == pytest.approx([-1.388552, -0.707107], abs=1e-5)
    # the A_i it builds on, for the tokens of turns it does not credit: the outcome's
    assert rule.episode_advantages(group, GroupScore(), [0.0, 0.0, 0.0]) == pytest.approx([1.414214, -0.707107, -0.707107], abs=1e-5)
    # grouped by turn instead, C's step 2 (a different state) would be compared with A's and B's
    by_turn = get_credit_rule("trca", families=FAMS, hits=hits_from_step_info, context_key="index")(
        group, GroupScore(), [0.0, 0.0, 0.0])
    assert by_turn[2][1] != pytest.approx(-0.707107, abs=1e-3)


def test_no_success_in_the_group_gives_zero_episode_advantage():
    assert outcome_advantages([0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]
    assert outcome_advantages([1.0, 1.0]) == [0.0, 0.0]  # all succeeded: no spread
    assert outcome_advantages([1.0, 0.0]) == pytest.approx([1.0, -1.0], abs=1e-5)
    # partial outcomes (a share of tests passed) with no success: still no episode advantage
    assert outcome_advantages([0.5, 0.25, 0.0]) == [0.0, 0.0, 0.0]
    assert outcome_advantages([0.5, 0.0], success_threshold=0.5) == pytest.approx([1.0, -1.0], abs=1e-5)
    # two failing rollouts that did the same thing: whatever the rubric said, every a_t = 0
    same = [_rollout(["start", "s1"], [{"ev": ["e1"]}, {}], False) for _ in range(2)]
    rule = get_credit_rule("trca", families=FAMS, hits=hits_from_step_info)
    assert rule(same, GroupScore(), [1.0, -1.0]) == [[0.0, 0.0], [0.0, 0.0]]
    # the outcome-blind variant takes the rubric's advantage instead
    blind = get_credit_rule("trca", families=FAMS, hits=hits_from_step_info, episode_advantage="reward",
                            env_reward="none")
    assert blind(same, GroupScore(), [1.0, -1.0]) == [[1.0, 1.0], [-1.0, -1.0]]


def test_missing_outcome_is_a_clear_error():
    traj = _rollout(["start"], [{}], True).model_copy(update={"metrics": {}})
    with pytest.raises(ValueError, match=r"metrics\['success'\] is missing.*episode_advantage='reward'"):
        get_credit_rule("trca", families=FAMS, hits=hits_from_step_info)([traj, traj], GroupScore(), [0.0, 0.0])


def test_repetition_is_scored_under_breakthrough():
    """Running the same lookup twice: the second run still gets a tool result (foundational)
    but covers nothing new (breakthrough 0), and no Invalidity item penalises it."""
    from draco_gym.reward.rules import transition_items

    task = Task(id="shop", instruction="price of P1?")
    steps = [Step(index=i, text="t", code="print(get_product('P1'))", observation="{'price': 3}",
                  info={"exec_error": None, TOOL_CALLS: [{"name": "get_product", "ok": True}]}) for i in (1, 2)]
    traj = Trajectory(task=task, steps=steps, termination="max_turns")
    hits = transition_items(traj)
    assert hits[1] == {"evidence": ["gets_tool_result"], "execution": ["runs_cleanly"], "invalidity": []}
    r_f, r_b, r = trca_step_rewards(hits, families_from_reward(task))
    # step 1: tool result (1) + runs (1/3) = 4/3, all new; step 2: the same, nothing new
    assert r_f == pytest.approx([4 / 3, 4 / 3])
    assert r_b == pytest.approx([4 / 3, 0.0])
    assert r == pytest.approx([4 / 3, 0.2 * 4 / 3])


def test_api_doc_item_only_in_families_of_a_documented_task():
    calc = Task(id="calc", instruction="6 * 7?")
    assert all("reads_documentation" not in f.items for f in families_from_reward(calc))
    documented = calc.model_copy(update={"metadata": {"api_docs": True}})
    assert "reads_documentation" in families_from_reward(documented)[0].items


def test_operator_library_items_drive_credit():
    """A shop task's library (the lookups it needs, then submit): the rollout that looks the
    order up and submits hits its operators; the one that only lists products hits none."""
    from draco_gym.envs.shop import tasks

    spec = next(t for t in tasks() if t["id"] == "order-total-1")
    task = Task(id=spec["id"], instruction=spec["instruction"], metadata=spec["metadata"])
    fams = {f.name: f.items for f in families_from_reward(task)}
    assert fams == {"evidence": ("calls:get_order", "calls:get_product"), "execution": ("calls:submit",),
                    "invalidity": ("malformed_block", "execution_error", "tool_error", "missing_block")}

    def rollout(codes, calls, success, states):
        # ``calls``: the tool call the env recorded for each block
        steps = [Step(index=i, text="t", code=c, observation="out",
                      info={"exec_error": None, STATE_KEY: k, TOOL_CALLS: [{"name": n, "ok": True}]})
                 for i, (c, n, k) in enumerate(zip(codes, calls, states), start=1)]
        return Trajectory(task=task, steps=steps, termination="max_turns", metrics={"success": success})

    good = rollout(["o = get_order('O1')", "p = [get_product(i['product_id']) for i in o['items']]", "submit(3.5)"],
                   ["get_order", "get_product", "submit"], True, ["start", "get_order('O1')", "get_product(i['product_id'])"])
    bad = rollout(["print(list_products())", "print(list_products(page=2))", "submit(1)"],
                  ["list_products", "list_products", "submit"], False, ["start", "list_products()", "list_products(page=2)"])
    from draco_gym.reward.rules import rule_library

    hits = rule_library(task).transition_items(good)
    assert [h["evidence"] + h["execution"] for h in hits] == [["calls:get_order"], ["calls:get_product"], ["calls:submit"]]
    assert all(not h["evidence"] for h in rule_library(task).transition_items(bad))
    out = get_credit_rule("trca")([good, bad], GroupScore(), [0.0, 0.0])
    # step 1 shares the state "start": the lookup of the order beats the product listing
    assert out[0][0] > out[1][0]
    assert out[0][0] - 1.0 == pytest.approx(1.0, abs=1e-4) and out[1][0] + 1.0 == pytest.approx(-1.0, abs=1e-4)
    # later steps are in states no other rollout reached: only the episode advantage
    assert out[0][1:] == pytest.approx([1.0, 1.0], abs=1e-4) and out[1][1:] == pytest.approx([-1.0, -1.0], abs=1e-4)


def test_options_are_declared_with_whose_number_they_are():
    from draco_gym.algos.config import schema_text

    text = schema_text(TRCAOptions)
    assert "context_key: state  # paper: which steps are compared: state (the env" in text
    assert "index (the turn number)" in text and "gamma: 0.95  # paper" in text
    with pytest.raises(ValueError, match=r"credit 'trca' options: episode_advantage: Input should be 'outcome' or 'reward' \(got 'rubric'\)"):
        get_credit_rule("trca", episode_advantage="rubric")
