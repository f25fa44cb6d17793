"""ProVer: eligibility, segment validation and repair, the bonus arithmetic, and restoring
PythonTools episodes at segment boundaries to run continuations."""

import asyncio

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draco_gym
from draco_gym.algos.credit import CREDIT_RULES, get_credit_rule
from draco_gym.algos.credit.prover import (
    EnvContinuations,
    JudgeSegmentProposer,
    ProVerOptions,
    ProVerRule,
    Segment,
    apply_segment_bonus,
    prover_delta,
    prover_eligible,
    shortest_success,
    validate_segment,
)
from draco_gym.types import GroupScore, Step, Task, Trajectory, TrajectoryScore, Verdict


def _traj(n_steps, success, task_id="t"):
    steps = [Step(index=i, text=f"```python\nx{i} = {i}\n```", code=f"x{i} = {i}", n_tokens=3) for i in range(1, n_steps + 1)]
    return Trajectory(task=Task(id=task_id, instruction="do it"), steps=steps, metrics={"success": success})


# -- arithmetic -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "successes, eligible",
    [([1, 0, 0, 0], True), ([1, 0, 0], True), ([1, 1, 0, 0], False), ([0, 0, 0], False), ([1, 1, 1], False), ([], False)],
)
def test_eligible_strictly_between_zero_and_half(successes, eligible):
    assert prover_eligible(successes) is eligible


def test_delta_and_bonus_by_hand():
    # mean(R_post) - mean(R_pre) = 3/4 - 1/4 = 0.5; lambda = 2 adds 1.0 to steps 2..3
    delta = prover_delta([0, 0, 1, 0], [1, 1, 1, 0])
    assert delta == 0.5
    assert apply_segment_bonus([0.3, 0.3, 0.3, 0.3], Segment(2, 3), delta, lam=2.0) == [0.3, 1.3, 1.3, 0.3]
    # only the positive half: a segment that did not help changes nothing
    assert apply_segment_bonus([0.3, 0.3], Segment(1, 1), -0.25) == [0.3, 0.3]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=2, max_size=10), st.data(), st.floats(-1, 1), st.floats(0, 2))
def test_bonus_only_raises_and_only_the_segment(adv, data, delta, lam):
    start = data.draw(st.integers(1, len(adv)))
    end = data.draw(st.integers(start, len(adv)))
    out = apply_segment_bonus(adv, Segment(start, end), delta, lam)
    for j, (a, b) in enumerate(zip(adv, out), start=1):
        expected = a + lam * delta if (start <= j <= end and delta > 0) else a
        assert b == pytest.approx(expected)


def test_shortest_success_picks_fewest_steps_then_first():
    group = [_traj(5, True), _traj(3, False), _traj(4, True), _traj(4, True)]
    assert shortest_success(group, [1, 0, 1, 1]) == 2
    with pytest.raises(ValueError, match="no successful"):
        shortest_success(group, [0, 0, 0, 0])


@pytest.mark.parametrize(
    "start, end, match",
    [
        (0, 2, "1 <= start <= end"),
        (3, 2, "1 <= start <= end"),
        (4, 6, "reaches the final step 6"),
        (1, 5, "has 5 steps; at most 4"),
        ("2", 3, "start must be an integer"),
        (2, 3.0, "end must be an integer"),
    ],
)
def test_segment_validation_names_the_problem(start, end, match):
    with pytest.raises(ValueError, match=match):
        validate_segment(start, end, n_steps=6, max_len=4)


def test_valid_segments():
    assert validate_segment(2, 5, n_steps=6) == Segment(2, 5) and len(Segment(2, 5)) == 4
    assert validate_segment(1, 1, n_steps=2) == Segment(1, 1)
    with pytest.raises(ValueError, match="at least 2"):
        validate_segment(1, 1, n_steps=1)


# -- the judge's proposal ------------------------------------------------------------------


class ScriptedJudge:
    """The reward layer's Judge protocol, answering from a script."""

    model = "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen = []

    async def complete(self, messages, *, schema, schema_name, temperature, max_tokens, sample):
        from draco_gym.reward import JudgeReply

        self.seen.append((messages, schema_name))
        return JudgeReply(self.answers.pop(0), prompt_tokens=100, completion_tokens=10)


def test_proposer_repairs_then_accepts():
    judge = ScriptedJudge(["no json here", '{"start": 2, "end": 6}', '{"start": 2, "end": 3, "reason": "fetches"}'])
    proposer = JudgeSegmentProposer(judge, max_repairs=2)
    segment, reason = proposer(_traj(6, True), 4)
    assert segment == Segment(2, 3) and reason == "repaired"
    # each repair quotes what was wrong
    assert "not valid JSON" in judge.seen[1][0][-1]["content"]
    assert "reaches the final step 6" in judge.seen[2][0][-1]["content"]
    assert proposer.usage["calls"] == 3 and proposer.usage["prompt_tokens"] == 300


def test_proposer_gives_up_after_bounded_repairs():
    proposer = JudgeSegmentProposer(ScriptedJudge(['{"start": 9, "end": 9}'] * 3), max_repairs=1)
    segment, reason = proposer(_traj(4, True), 4)
    assert segment is None and reason.startswith("invalid answer after 1 repairs")
    assert "reaches the final step 4" in reason


def test_proposer_survives_a_judge_outage_and_runs_inside_an_event_loop():
    def down(messages):
        raise TimeoutError("judge timed out")

    assert JudgeSegmentProposer(down, retries=0)(_traj(3, True), 4) == (
        None, "judge unavailable after 1 attempts: TimeoutError: judge timed out")

    async def inside_loop():  # the trainer may call credit from async code
        return JudgeSegmentProposer(ScriptedJudge(['{"start": 1, "end": 2}']))(_traj(3, True), 4)

    assert asyncio.run(inside_loop())[0] == Segment(1, 2)


# -- the rule with injected continuations --------------------------------------------------


class FakeContinuations:
    def __init__(self, by_prefix_len):
        self.by_prefix_len = by_prefix_len
        self.calls = []

    def __call__(self, task_id, prefix, k):
        self.calls.append((task_id, list(prefix), k))
        return self.by_prefix_len[len(prefix)][:k]


def test_rule_credits_the_segment_of_the_shortest_success():
    group = [_traj(6, False), _traj(5, True), _traj(6, True), _traj(4, False), _traj(6, False)]  # rate 0.4
    conts = FakeContinuations({1: [0, 0, 1, 0], 3: [1, 1, 1, 0]})  # pre after step 1, post after step 3
    rule = ProVerRule(conts, lambda traj, max_len, failures: (Segment(2, 3), "ok"), ProVerOptions(K=4, lam=1.0))
    out = rule(group, GroupScore(), [9.0] * 5)  # the handed (reward) advantages are not ProVer's base
    # base: the mean-centred outcome, R - 0.4 = [-0.4, 0.6, 0.6, -0.4, -0.4]; the shortest
    # success is trajectory 1 (5 steps); Delta = 0.75 - 0.25 = 0.5 on its steps 2..3
    assert out[1] == pytest.approx([0.6, 1.1, 1.1, 0.6, 0.6])
    for i, a in zip((0, 2, 3, 4), (-0.4, 0.6, -0.4, -0.4)):
        assert out[i] == pytest.approx([a] * len(group[i].steps))
    # the boundaries replay exactly the messages before step 2 and through step 3
    assert [c[1] for c in conts.calls] == [[s.text for s in group[1].steps[:1]], [s.text for s in group[1].steps[:3]]]
    assert rule.stats == {"groups": 1, "credited": 1} and rule.last["delta"] == 0.5


def test_base_advantage_is_the_mean_centred_outcome_by_hand():
    """G = 8, one success: the paper's base is R - mean = 1 - 1/8 = 0.875 for the winner and
    -0.125 for the losers; GRPO's standardised one divides by std = sqrt(1/8 * 7/8) = 0.330719:
    2.645751 and -0.377964. A bonus Delta = 0.5 on the segment is 0.57 of the centred A_i
    and 0.19 of the standardised one."""
    group = [_traj(3, i == 2) for i in range(8)]
    conts = FakeContinuations({0: [0, 0, 1, 0], 1: [1, 1, 1, 0]})  # pre before step 1, post after it
    centred = ProVerRule(conts, lambda traj, max_len, failures: (Segment(1, 1), "ok"), ProVerOptions(K=4))(group, GroupScore(), [0.0] * 8)
    assert centred[2] == pytest.approx([1.375, 0.875, 0.875])
    assert centred[0] == pytest.approx([-0.125] * 3)
    standardised = get_credit_rule("prover", continue_fn=conts, propose=lambda t, m, f: (Segment(1, 1), "ok"), K=4,
                                   base_scale="standardised")(group, GroupScore(), [0.0] * 8)
    assert standardised[2] == pytest.approx([3.145751, 2.645751, 2.645751], abs=1e-5)
    assert standardised[0] == pytest.approx([-0.377964] * 3, abs=1e-5)
    # on the run's reward instead (base_advantage="reward"): centred R of the group's rewards,
    # or, standardised, the advantages as handed in
    rewards = GroupScore(scores=[TrajectoryScore.from_verdicts([Verdict(criterion="c", score=1 if i == 2 else -1)])
                                 for i in range(8)])
    on_reward = ProVerRule(FakeContinuations({0: [0] * 8, 1: [0] * 8}), lambda t, m, f: (Segment(1, 1), "ok"),
                           ProVerOptions(base_advantage="reward"))(group, rewards, [0.0] * 8)
    assert on_reward[2] == pytest.approx([1.75] * 3) and on_reward[0] == pytest.approx([-0.25] * 3)  # R = +1 / -1
    with pytest.raises(ValueError, match="base_scale: Input should be 'centred' or 'standardised'"):
        get_credit_rule("prover", continue_fn=conts, propose=lambda t, m, f: (None, ""), base_scale="zscore")


def test_a_custom_proposers_segment_is_validated_too():
    conts = FakeContinuations({})
    rule = ProVerRule(conts, lambda traj, max_len, failures: (Segment(2, 3), "ok"))  # 3 is the final step
    group = [_traj(3, True), _traj(3, False), _traj(3, False)]
    assert rule(group, GroupScore(), [1.0, -0.5, -0.5])[0] == pytest.approx([2 / 3] * 3)  # 1 - 1/3, no bonus
    assert rule.stats["no_segment"] == 1 and "final step 3" in rule.last["proposal"] and conts.calls == []


def test_ineligible_groups_cost_nothing():
    def never(*args):
        raise AssertionError("no continuations for an ineligible group")

    rule = ProVerRule(never, lambda t, m, f: (Segment(1, 1), "ok"))
    for successes, base in (([True, True, False, False], [0.5, 0.5, -0.5, -0.5]), ([False] * 4, [0.0] * 4),
                            ([True] * 4, [0.0] * 4)):
        group = [_traj(3, s) for s in successes]
        assert rule(group, GroupScore(), [0.1] * 4) == [[a] * 3 for a in base]
    assert rule.stats["ineligible"] == 3


def test_rule_input_errors_name_the_field():
    rule = ProVerRule(FakeContinuations({}), lambda t, m, f: (None, "x"))
    bad = _traj(3, True).model_copy(update={"metrics": {}})
    with pytest.raises(ValueError, match=r"trajectories\[0\].metrics\['success'\]"):
        rule([bad], GroupScore(), [0.0])
    # an episode the trainer cut short (token budget, crash) was never evaluated: a failure
    cut = bad.model_copy(update={"termination": "length"})
    assert rule([cut, _traj(3, False)], GroupScore(), [0.0, 0.0]) == [[0.0] * 3, [0.0] * 3]
    with pytest.raises(ValueError, match="K: Input should be greater than or equal to 1"):
        get_credit_rule("prover", continue_fn=FakeContinuations({}), propose=lambda t, m, f: (None, "x"), K=0)
    assert "prover" in CREDIT_RULES
    with pytest.raises(ValueError, match="continue_fn"):
        get_credit_rule("prover")
    with pytest.raises(ValueError, match="judge"):
        get_credit_rule("prover", continue_fn=FakeContinuations({}))


# -- restoring PythonTools at the boundaries --------------------------------------------------


def code(src):
    return f"```python\n{src}\n```"


# Task "order-count-1" asks how many orders a customer placed. The successful run counts them
# into a variable at step 2 and submits it at step 3; a continuation that only says submit(n)
# therefore succeeds exactly when the restored state holds the variable n.
COUNT_SCRIPT = [
    code("import re\nname = re.search(r'has (.+?) placed', TASK).group(1)\nc = find_customer(name)\nprint(c['id'])"),
    code("first = list_orders(c['id'])\nn = sum(len(list_orders(c['id'], p)['items']) for p in range(1, first['pages'] + 1))\nprint(n)"),
    code("submit(n)"),
    "Done.",
]


def submit_n_policy(task, history):
    """Submit the variable n, then close; sees the history as the agent would."""
    return "Done." if any("submit(" in m for m in history[1::2]) else code("submit(n)")


@pytest.fixture(scope="module")
def tools_env():
    gym.register_envs(draco_gym)
    env = gym.make("draco_gym/PythonTools-v0", max_turns=8)
    yield env
    env.close()


def _run(env, task_id, messages):
    env.reset(options={"task_id": task_id})
    for m in messages:
        _, _, terminated, truncated, info = env.step(m)
        if terminated or truncated:
            return info["trajectory"]
    raise AssertionError("the script did not end the episode")


def _script(env, task_id):
    instruction = env.unwrapped._tasks[task_id].instruction
    return [COUNT_SCRIPT[0].replace("TASK", repr(instruction))] + COUNT_SCRIPT[1:]


def test_restore_rebuilds_the_state_at_each_boundary(tools_env):
    task_id = "order-count-1"
    script = _script(tools_env, task_id)
    winner = _run(tools_env, task_id, script)
    assert winner.metrics["success"] is True and len(winner.steps) == 4
    conts = EnvContinuations(tools_env, submit_n_policy)
    # after step 2 the variable n exists: the continuation submits the right count
    assert conts(task_id, [s.text for s in winner.steps[:2]], 2) == [1.0, 1.0]
    # after step 1 it does not: NameError, nothing submitted, failure
    assert conts(task_id, [s.text for s in winner.steps[:1]], 1) == [0.0]


def test_prover_on_python_tools(tools_env):
    task_id = "order-count-1"
    script = _script(tools_env, task_id)
    winner = _run(tools_env, task_id, script)
    losers = [_run(tools_env, task_id, [code("submit(-1)"), "Done."]) for _ in range(3)]
    group = losers[:2] + [winner] + losers[2:]
    assert [t.metrics["success"] for t in group] == [False, False, True, False]
    judge = ScriptedJudge(['{"start": 2, "end": 4}', '{"start": 2, "end": 2, "reason": "counts the orders"}'])
    rule = get_credit_rule("prover", continue_fn=EnvContinuations(tools_env, submit_n_policy), judge=judge, K=2)
    out = rule(group, GroupScore(), [-0.58, -0.58, 1.73, -0.58])
    # base R - 1/4: 0.75 for the winner, -0.25 for the losers. The judge's first answer ends on
    # the final step: repaired; segment 2..2; R_pre (after step 1) = [0, 0], R_post (after
    # step 2) = [1, 1]: Delta = 1 on step 2
    assert out[2] == pytest.approx([0.75, 1.75, 0.75, 0.75])
    assert out[0] == [-0.25, -0.25]
    assert rule.last["proposal"] == "repaired" and rule.last["pre"] == [0.0, 0.0] and rule.last["post"] == [1.0, 1.0]


def test_continuations_need_a_restorable_env():
    class Plain:
        can_restore = False

    with pytest.raises(ValueError, match="can_restore"):
        EnvContinuations(Plain(), submit_n_policy)


def test_env_runner_continuations_plumbing():
    from draco_gym.algos.credit.prover import env_runner_continuations

    class Runner:
        def continue_from(self, task_id, messages, k, seed=0):
            return [_traj(len(messages) + 1, i % 2 == 0, task_id) for i in range(k)]

    class Group:  # the two EnvRunnerGroup methods the helper uses
        def healthy_env_runner_ids(self):
            return [1, 2]

        def foreach_env_runner(self, func, local_env_runner, remote_worker_ids):
            assert local_env_runner is False and remote_worker_ids == [1]
            return [func(Runner())]

    assert env_runner_continuations(Group())("t", ["a", "b"], 3) == [1.0, 0.0, 1.0]


def test_failed_restarts_and_one_step_successes_cost_the_bonus_not_the_run():
    def broken(task_id, prefix, k):
        raise RuntimeError("sandbox died")

    rule = ProVerRule(broken, lambda t, m, f: (Segment(1, 1), "ok"))
    group = [_traj(3, True), _traj(3, False), _traj(3, False)]
    out = rule(group, GroupScore(), [1.0, -0.5, -0.5])
    assert [a for per_step in out for a in per_step] == pytest.approx([2 / 3] * 3 + [-1 / 3] * 6)  # the base, no bonus
    assert rule.stats["continuation_error"] == 1 and "sandbox died" in rule.last["error"]

    def never(*args):
        raise AssertionError("no judge call for a one-step success")

    rule = ProVerRule(never, never)
    assert rule([_traj(1, True), _traj(2, False), _traj(2, False)], GroupScore(), [1.0, 0.0, 0.0])[0] == pytest.approx([2 / 3])
    assert rule.stats["too_short"] == 1
