"""A credit step is one code block: a closing message without code is shown to the judge but
takes no share of DRACO's redistribution; its tokens get the trajectory's A_i (or, as an
option, join the preceding code step). Hand-computed numbers throughout."""

from __future__ import annotations

import pytest

from draco_gym.algos.credit import apply_credit, get_credit_rule
from draco_gym.algos.credit.trca import RuleFamily
from draco_gym.types import GroupScore, RolloutGroup, Step, Task, Trajectory, TrajectoryScore, Verdict

TASK = Task(id="t", instruction="What is the order total?")
FAMILIES = [RuleFamily("evidence", 1, 1.0, ("e",))]


def closing_trajectory() -> Trajectory:
    """Two code steps of 40 tokens, then "Done: 395." (4 tokens, no code). Token layout:
    2 prompt tokens, step 1, 1 observation token, step 2, 1 observation token, step 3."""
    steps = [
        Step(index=1, text="```python\norder = get_order('A1')\n```", code="order = get_order('A1')", n_tokens=40),
        Step(index=2, text="```python\nsubmit(395)\n```", code="submit(395)", n_tokens=40),
        Step(index=3, text="Done: 395.", code=None, n_tokens=4),
    ]
    token_step = [-1, -1] + [1] * 40 + [-1] + [2] * 40 + [-1] + [3] * 4
    return Trajectory(task=TASK, steps=steps, termination="no_code", token_ids=list(range(len(token_step))),
                      token_step=token_step)


# PASS cites step 1; PASS cites 1 and 2; FAIL cites 2; PASS cites only the closing message.
VERDICTS = [
    Verdict(criterion="fetches the order", score=1, cited_steps=[1]),
    Verdict(criterion="computes from live data", score=1, cited_steps=[1, 2]),
    Verdict(criterion="checks the discount", score=-1, cited_steps=[2]),
    Verdict(criterion="reports the total", score=1, cited_steps=[3]),
]


def group_of(*trajs: Trajectory) -> GroupScore:
    return GroupScore(scores=[TrajectoryScore.from_verdicts(VERDICTS) for _ in trajs])


def test_closing_message_is_no_credit_step_and_keeps_a_i():
    # Code steps only: Q_1 = 2/2 = 1, Q_2 = 1/2; the citation of step 3 is dropped.
    # N = 80, w = [1, 1/2], sum w = 3/2: a_1 = 80 * 1 / (40 * 1.5) = 4/3, a_2 = 80 * .5 / 60 = 2/3.
    # The closing message gets A_i = 1. Totals: 53.33 + 26.67 + 4 = 84 = A_i * (40 + 40 + 4).
    traj = closing_trajectory()
    [a] = get_credit_rule("draco")([traj], group_of(traj), [1.0])
    assert a == pytest.approx([4 / 3, 2 / 3, 1.0])
    assert sum(n * x for n, x in zip(traj.step_tokens, a)) == pytest.approx(84.0)


def test_closing_message_of_a_loser_keeps_a_i():
    # Loser (A = -1): w = 1 - Q = [0, 1/2], sum 1/2: a_1 = 0, a_2 = -80 * .5 / (40 * .5) = -2; step 3: -1.
    traj = closing_trajectory()
    [a] = get_credit_rule("draco")([traj], group_of(traj), [-1.0])
    assert a == pytest.approx([0.0, -2.0, -1.0])


def test_attach_mode_joins_the_closing_turn_to_the_preceding_code_step():
    # Step 3's 4 tokens and its PASS join step 2: n = [40, 44], Q_2 = 2/3, N = 84,
    # w = [1, 2/3], sum 5/3: a_1 = 84 / (40 * 5/3) = 1.26, a_2 = 84 * (2/3) / (44 * 5/3) = 168/220;
    # the closing turn's tokens get a_2.
    traj = closing_trajectory()
    [a] = get_credit_rule("draco", turns_without_code="attach")([traj], group_of(traj), [1.0])
    assert a == pytest.approx([1.26, 168 / 220, 168 / 220])
    assert sum(n * x for n, x in zip(traj.step_tokens, a)) == pytest.approx(84.0)


def test_gap_mode_gives_the_closing_turn_no_advantage():
    # The paper's letter: a token in no step is a gap token. Code steps as in the default
    # (a = [4/3, 2/3], the citation of step 3 reaches no step), the closing turn gets 0:
    # total push 53.33 + 26.67 = 80 = A_i * N over the code steps' tokens only.
    traj = closing_trajectory()
    rule = get_credit_rule("draco", turns_without_code="gap")
    [a] = rule([traj], group_of(traj), [1.0])
    assert a == pytest.approx([4 / 3, 2 / 3, 0.0])
    assert sum(n * x for n, x in zip(traj.step_tokens, a)) == pytest.approx(80.0)
    [lose] = rule([traj], group_of(traj), [-1.0])  # loser: w = [0, 1/2] -> a = [0, -2], closing turn 0
    assert lose == pytest.approx([0.0, -2.0, 0.0])
    # a trajectory with no code step at all is not trained on
    only_text = Trajectory(task=TASK, steps=[Step(index=1, text="I cannot do this.", n_tokens=5)])
    score = TrajectoryScore.from_verdicts([Verdict(criterion="answers", score=-1, cited_steps=[1])])
    assert rule([only_text], GroupScore(scores=[score]), [-0.5]) == [[0.0]]
    # through apply_credit, the closing turn's 4 tokens carry 0 like the prompt's
    winner, loser = closing_trajectory(), closing_trajectory()
    group = group_of(winner, loser).model_copy(update={"scores": [
        TrajectoryScore.from_verdicts(VERDICTS), TrajectoryScore(reward=-1.0)]})
    batch = apply_credit([RolloutGroup(task_id=TASK.id, trajectories=[winner, loser], score=group)], rule)
    assert batch.token_advantages[0][-4:] == [0.0] * 4 and batch.token_advantages[1][-4:] == [0.0] * 4


def test_citations_of_turns_without_code_are_counted():
    # VERDICTS cite the closing turn once; two trajectories carry them: 2 citations reach no
    # step under "trajectory" and "gap", none under "attach" (they join step 2).
    winner, other = closing_trajectory(), closing_trajectory()
    groups = [RolloutGroup(task_id=TASK.id, trajectories=[winner, other], score=group_of(winner, other))]
    assert apply_credit(groups, get_credit_rule("draco")).uncredited_citations == 2
    assert apply_credit(groups, get_credit_rule("draco", turns_without_code="gap")).uncredited_citations == 2
    assert apply_credit(groups, get_credit_rule("draco", turns_without_code="attach")).uncredited_citations == 0
    assert apply_credit(groups, get_credit_rule("uniform")).uncredited_citations == 2  # every rule is counted
    # the trainer's metrics carry all three measures
    from draco_gym.algos.rllib.reporting import PHASES, iteration_metrics

    batch = apply_credit(groups, get_credit_rule("draco"))
    metrics = iteration_metrics(groups, batch, dict.fromkeys(PHASES, 0.0), 1.0, 0)
    assert metrics["credit/uncredited_citations"] == 2 and metrics["credit/paper_inert_share"] == 0.0
    assert metrics["credit/inert_share"] == batch.inert_credit_share


def test_the_papers_inert_share_counts_unanimous_rollouts():
    # Four rollouts of two code steps: mixed verdicts (3 PASS, 1 FAIL), all PASS, all FAIL,
    # none surviving. The paper's inert share counts the rollouts whose verdicts agree: 3/4.
    # Ours counts rollouts with A_i != 0 whose steps all got exactly A_i: the all-PASS one has
    # steps of 10 and 30 tokens, so DRACO's equal weights still give a = A_i * 40 / (n_j * 2) =
    # [2 A_i, 2/3 A_i] (the paper's P2), not A_i; the all-FAIL (10 + 10 tokens) and the uncited
    # one keep A_i: 2/4.
    def traj(lengths):
        steps = [Step(index=j, text="x", code="x", n_tokens=n) for j, n in enumerate(lengths, start=1)]
        token_step = [j for j, n in enumerate(lengths, start=1) for _ in range(n)]
        return Trajectory(task=TASK, steps=steps, token_ids=[0] * len(token_step), token_step=token_step)

    v = lambda score, step: Verdict(criterion=f"c{step}{score}", score=score, cited_steps=[step])
    scores = [TrajectoryScore.from_verdicts([v(1, 1), v(1, 1), v(1, 2), v(-1, 2)]),
              TrajectoryScore.from_verdicts([v(1, 1), v(1, 2)]),
              TrajectoryScore.from_verdicts([v(-1, 1)]),
              TrajectoryScore.from_verdicts([])]
    trajs = [traj([10, 10]), traj([10, 30]), traj([10, 10]), traj([10, 10])]
    batch = apply_credit([RolloutGroup(task_id=TASK.id, trajectories=trajs, score=GroupScore(scores=scores))], get_credit_rule("draco"))
    assert [s.reward for s in scores] == [0.5, 1.0, -1.0, 0.0]
    a_2 = batch.group_advantages[0][1]
    assert batch.step_advantages[1] == pytest.approx([2 * a_2, 2 / 3 * a_2])
    assert batch.paper_inert_share == 0.75
    assert batch.inert_credit_share == 0.5
    # the outcome reward has no verdicts: every rollout is unanimous in the paper's sense
    outcome = GroupScore(scores=[TrajectoryScore(reward=1.0), TrajectoryScore(reward=0.0)])
    plain = apply_credit([RolloutGroup(task_id=TASK.id, trajectories=trajs[:2], score=outcome)], get_credit_rule("uniform"))
    assert plain.paper_inert_share == 1.0


def test_our_inert_share_compares_against_the_rules_own_base():
    """TRCA builds on the outcome's A_i, not the reward's. Successes 1, 0, 0 give TRCA's base
    (1 - 1/3, -1/3, -1/3) / sqrt(2/9) = [sqrt(2), -sqrt(2)/2, -sqrt(2)/2]; the rubric rewards
    1, 0, -1 give the reward's A_i [sqrt(3/2), 0, -sqrt(3/2)]. Every step alone in its state
    makes every step term 0: TRCA moved nothing, so all of it is inert against its own base,
    though none of it equals the reward's A_i."""
    trajs = [Trajectory(task=TASK, steps=[Step(index=1, text="```python\nx\n```", code="x", n_tokens=2,
                                               info={"state_key": f"s{i}"})],
                        metrics={"success": s}, token_ids=[0, 0], token_step=[1, 1])
             for i, s in enumerate((1, 0, 0))]
    v = lambda score: Verdict(criterion=f"c{score}", score=score, cited_steps=[1])
    score = GroupScore(scores=[TrajectoryScore.from_verdicts(vs) for vs in ([v(1)], [v(1), v(-1)], [v(-1)])])
    batch = apply_credit([RolloutGroup(task_id=TASK.id, trajectories=trajs, score=score)],
                         get_credit_rule("trca", hits=lambda t: [{}], families=FAMILIES, env_reward="none"))
    r2 = 2 ** 0.5
    assert [a for [a] in batch.step_advantages] == pytest.approx([r2, -r2 / 2, -r2 / 2], abs=1e-5)
    assert batch.group_advantages == [pytest.approx([1.5 ** 0.5, 0.0, -(1.5 ** 0.5)], abs=1e-5)]
    assert batch.inert_credit_share == 1.0


def test_the_measures_of_what_credit_changed_by_hand():
    """Two episodes, A = 1 and -1 handed in (as TRL's trainer does): steps of 2 and 3 tokens
    credited 1.0 and 2.0 (3 of 5 tokens changed, spread 0.5); one step of 4 tokens credited -1
    (unchanged). Changed 3/9, spread 0.5 (one trajectory of two steps), mean |a_j| 4/3; inert:
    the second only, 1/2; no verdicts, so both unanimous in the paper's sense."""
    first = Trajectory(task=TASK, steps=[Step(index=1, text="a", code="a", n_tokens=2),
                                         Step(index=2, text="b", code="b", n_tokens=3)])
    second = Trajectory(task=TASK, steps=[Step(index=1, text="c", code="c", n_tokens=4)])
    group = RolloutGroup(task_id=TASK.id, trajectories=[first, second],
                         score=GroupScore(scores=[TrajectoryScore(reward=0.0), TrajectoryScore(reward=0.0)]))
    batch = apply_credit([group], lambda trajs, score, adv: [[1.0, 2.0], [-1.0]], [[1.0, -1.0]])
    assert batch.metrics() == pytest.approx({
        "credit/changed_token_share": 3 / 9, "credit/step_advantage_spread": 0.5,
        "credit/step_advantage_abs_mean": 4 / 3, "credit/inert_share": 0.5, "credit/paper_inert_share": 1.0,
        "credit/uncredited_citations": 0})
    assert batch.group_advantages == [[1.0, -1.0]] and batch.base_advantages == [1.0, -1.0]


def test_the_closing_message_no_longer_gets_the_biggest_per_token_push():
    # With every turn a step (the old reading), the closing message took Q = 1 over 4 tokens:
    # w = [1, 1/2, 1], a_3 = 84 / (4 * 2.5) = 8.4, six times a_1 = 0.84. Now it gets A_i.
    traj = closing_trajectory()
    [a] = get_credit_rule("draco")([traj], group_of(traj), [1.0])
    assert a[2] < a[0]


def test_tokens_of_the_closing_message_get_a_i_through_apply_credit():
    winner, loser = closing_trajectory(), closing_trajectory()
    group = group_of(winner, loser).model_copy(update={"scores": [
        TrajectoryScore.from_verdicts(VERDICTS), TrajectoryScore(reward=-1.0)]})
    batch = apply_credit([RolloutGroup(task_id=winner.task.id, trajectories=[winner, loser], score=group)],
                         get_credit_rule("draco"))
    a_win, a_lose = batch.group_advantages[0]
    tokens = batch.token_advantages[0]
    assert tokens[:2] == [0.0, 0.0] and tokens[42] == 0.0  # prompt and observation: gap tokens
    assert tokens[2] == pytest.approx(a_win * 4 / 3) and tokens[43] == pytest.approx(a_win * 2 / 3)
    assert tokens[-4:] == pytest.approx([a_win] * 4)  # "Done: 395." gets A_i
    assert batch.token_advantages[1] == pytest.approx([0.0] * 2 + [a_lose] * 40 + [0.0] + [a_lose] * 40 + [0.0]
                                                      + [a_lose] * 4)  # nothing cited: uniform


def test_a_trajectory_without_any_code_step_gets_a_i_everywhere():
    traj = Trajectory(task=TASK, steps=[Step(index=1, text="I cannot do this.", n_tokens=5)])
    score = TrajectoryScore.from_verdicts([Verdict(criterion="answers", score=-1, cited_steps=[1])])
    [a] = get_credit_rule("draco")([traj], GroupScore(scores=[score]), [-0.5])
    assert a == [-0.5]


def test_trace_runs_over_code_steps_only():
    # l_0..l_3 = [-2, -1, -0.5, -0.1]; code steps 1, 2 read l_0, l_1, l_2: d = [2.1, 1.1, 0.6],
    # V = [0, log(2.1/1.1), log(2.1/0.6)] = [0, 0.646627, 1.252763], delta = [0.646627, 0.606136].
    # T = 2, K = 3, gamma = 0.8, A_out = 1, fill 2 * 0.8^(T-k+1): r_1 = (0.646627 + 0.8 * 0.606136) / 1.8
    # + 2 * 0.64 = 1.908631, r_2 = 0.606136 + 2 * 0.8 = 2.206136; a = 1 + 0.2 r = [1.381726, 1.441227];
    # the closing turn: A_out = 1.
    traj = closing_trajectory()
    rule = get_credit_rule("trace", scorer=lambda t: [-2.0, -1.0, -0.5, -0.1])
    [a] = rule([traj], GroupScore(), [1.0])
    assert a == pytest.approx([1.381726, 1.441227, 1.0], abs=1e-6)


def test_unknown_mode_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="turns_without_code must be one of .*'trajectory', 'attach'"):
        get_credit_rule("draco", turns_without_code="previous")


def test_the_judge_still_sees_the_closing_message():
    from draco_gym.reward.render import render_trajectory

    text = render_trajectory(closing_trajectory())
    assert '<step n="3">' in text and "Done: 395." in text


# -- the run config: where the step boundary and the base advantage are chosen ------------------

def _config(tmp_path, **sections):
    import yaml

    from draco_gym.algos.config import load_config

    raw = {"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "smollm2-135m-instruct"}, **sections}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_turns_without_code_is_a_credit_knob(tmp_path):
    from draco_gym.algos.config import ConfigError

    assert _config(tmp_path).credit.turns_without_code == "trajectory"
    assert _config(tmp_path, credit={"name": "draco", "turns_without_code": "attach"}).credit.turns_without_code == "attach"
    with pytest.raises(ConfigError, match="credit.turns_without_code"):
        _config(tmp_path, credit={"name": "draco", "turns_without_code": "previous"})


@pytest.mark.parametrize("rule", ["trace", "prover"])
def test_outcome_based_rule_with_the_rule_reward_is_refused_naming_the_fix(tmp_path, rule):
    from draco_gym.algos.config import ConfigError

    with pytest.raises(ConfigError) as info:
        _config(tmp_path, reward={"name": "rule"}, credit={"name": rule})
    message = str(info.value)
    assert f"credit {rule!r}" in message and "reward.name is 'rule'" in message
    assert "reward: {name: outcome, options: {metric: success}}" in message
    assert "credit.options.base_advantage: reward" in message


@pytest.mark.parametrize("rule", ["trace", "prover"])
def test_outcome_reward_or_an_explicit_choice_is_accepted(tmp_path, rule):
    assert _config(tmp_path, reward={"name": "outcome"}, credit={"name": rule}).credit.name == rule
    chosen = _config(tmp_path, reward={"name": "rule"}, credit={"name": rule, "options": {"base_advantage": "reward"}})
    assert chosen.credit.options["base_advantage"] == "reward"


def test_prover_and_the_outcome_reward_read_the_same_metric(tmp_path):
    from draco_gym.algos.config import ConfigError

    with pytest.raises(ConfigError, match=r"metrics\['solved'\].*'success'"):
        _config(tmp_path, reward={"name": "outcome"}, credit={"name": "prover", "options": {"outcome_key": "solved"}})


def test_grpo_config_refuses_trace_on_the_rule_reward_too():
    ray = pytest.importorskip("ray")  # noqa: F841 - GRPOConfig is an RLlib AlgorithmConfig
    from draco_gym.algos.config import ConfigError
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = (GRPOConfig().environment("draco_gym/PythonTools-v0").policy(model="smollm2-135m-instruct")
              .training(reward="rule", credit="trace"))
    with pytest.raises(ConfigError, match="base_advantage"):
        config.validate()


def test_shipped_trace_and_prover_configs_use_the_outcome():
    from pathlib import Path

    from draco_gym.algos.config import load_config

    configs = Path(__file__).resolve().parents[1] / "configs"
    for name in ("pythontools_trace.yaml", "pythontools_prover.yaml"):
        config = load_config(configs / name)
        assert config.reward.name == "outcome", name
        assert config.credit.options.get("base_advantage", "outcome") == "outcome", name


@pytest.mark.parametrize("path", sorted((__import__("pathlib").Path(__file__).resolve().parents[1] / "configs")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_passes_train_check(path, capsys):
    """Valid, and ready to run where its model and judge are: ``--check`` also resolves the
    model, builds the environment and probes each judge server, so a config whose model is a
    directory this machine lacks (a GPU machine's ``models/policy``, a policy the config's
    header says how to build) fails here on that key alone, and one whose judge server is not
    running here on the judge's key, naming the server."""
    import re

    from draco_gym.algos.config import load_config
    from draco_gym.cli import main

    code = main(["train", str(path), "--check"])
    printed = capsys.readouterr()
    probe = re.match(r"error: (reward|credit)\.options[^:]*\.judge: judge at (\S+) did not answer a probe", printed.err)
    if code and probe:
        assert code == 2 and probe.group(2) in path.read_text(), printed.err
    elif code:
        model = load_config(path).policy.model
        assert code == 2 and printed.err.startswith("error: policy.model: ") and model in printed.err, printed.err
        assert not __import__("pathlib").Path(model).exists(), printed.err
    else:
        assert printed.out.strip().endswith(": ok")


def test_demo_gives_each_closing_message_the_trajectory_advantage(capsys):
    from draco_gym.cli import main

    assert main(["demo"]) == 0
    agent, closing = None, {}
    for line in capsys.readouterr().out.splitlines():
        if " A=" in line:
            agent, a = line.split(":")[0], float(line.split("A=")[1])
        elif "not a credit step" in line:
            closing[agent] = (a, float(line.split("a_j=")[1].split()[0]))
    assert set(closing) == {"careful", "recovers", "guesses"}
    for agent, (a, a_j) in closing.items():
        assert a_j == pytest.approx(a, abs=1e-3), agent


# -- the random-reward baseline ------------------------------------------------------------------

def _rollout(text: str) -> Trajectory:
    return Trajectory(task=TASK, steps=[Step(index=1, text=text, code="x = 1")])


def test_random_reward_is_seeded_by_task_and_rollouts_and_spans_its_range():
    import hashlib
    import random

    from draco_gym.reward import build_reward

    reward = build_reward("random", seed=7)
    group = [_rollout("a"), _rollout("b"), _rollout("a")]
    rewards = reward.score_group(TASK, group).rewards
    # Hand check of the draw for rollout 0: sha256("7\0t\00" + "\0a") seeds random.Random.
    seed = hashlib.sha256(b"7\x00t\x000\x00a").hexdigest()
    assert rewards[0] == random.Random(seed).uniform(-1.0, 1.0)
    assert rewards == build_reward("random", seed=7).score_group(TASK, group).rewards  # re-scored: the same
    assert rewards != build_reward("random", seed=8).score_group(TASK, group).rewards
    assert len(set(rewards)) == 3  # the same text at another position draws anew
    many = build_reward("random").score_group(TASK, [_rollout(str(i)) for i in range(400)]).rewards
    assert min(many) >= -1 and max(many) <= 1 and abs(sum(many) / len(many)) < 0.1
    assert min(many) < -0.9 and max(many) > 0.9


def test_random_reward_refuses_an_empty_range():
    from draco_gym.reward import build_reward

    with pytest.raises(ValueError, match="low < high"):
        build_reward("random", low=1.0, high=1.0)


def test_random_baseline_config_uses_the_random_reward():
    from pathlib import Path

    from draco_gym.algos.config import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "appworld_random.yaml")
    assert config.reward.name == "random" and "judge" not in config.reward.options
    assert config.credit.name == "uniform"


# -- ProVer's segment proposal sees the failed rollouts ------------------------------------------

def _prover_traj(n_steps: int, success: bool, tag: str) -> Trajectory:
    steps = [Step(index=i, text=f"```python\n{tag}_{i} = {i}\n```", code=f"{tag}_{i} = {i}", n_tokens=3)
             for i in range(1, n_steps + 1)]
    return Trajectory(task=TASK, steps=steps, metrics={"success": success})


def test_prover_shows_the_judge_the_failed_rollouts_beside_the_shortest_success():
    from draco_gym.algos.credit.prover import JudgeSegmentProposer, ProVerOptions, ProVerRule

    seen = []

    def judge(messages):
        seen.append(messages)
        return '{"start": 1, "end": 2, "reason": "reads the order"}'

    group = [_prover_traj(5, False, "lost"), _prover_traj(4, True, "won"), _prover_traj(3, False, "gave_up"),
             _prover_traj(6, False, "looped"), _prover_traj(2, False, "guessed")]  # rate 0.2: eligible
    rule = ProVerRule(lambda task_id, prefix, k: [0.0] * k, JudgeSegmentProposer(judge), ProVerOptions(K=2))
    rule(group, GroupScore(), [0.0] * 5)
    system, user = seen[0][0]["content"], seen[0][1]["content"]
    assert "Failed attempts at the same task" in system
    assert '<trajectory id="success"' in user and "won_1 = 1" in user
    for i, tag in enumerate(["lost", "gave_up", "looped", "guessed"], start=1):  # the 4 failures, in group order
        assert f'<trajectory id="failed-{i}"' in user and f"{tag}_1 = 1" in user
    assert user.index('id="success"') < user.index('id="failed-1"')


def test_a_two_argument_proposer_still_works():
    from draco_gym.algos.credit.prover import ProVerOptions, ProVerRule
    from draco_gym.reward.stages import Segment

    group = [_prover_traj(4, True, "won"), _prover_traj(4, False, "a"), _prover_traj(4, False, "b")]
    rule = ProVerRule(lambda task_id, prefix, k: [len(prefix) / 4] * k, lambda traj, max_len, failures: (Segment(2, 3), "ok"),
                      ProVerOptions(K=2))
    # base 1 - 1/3 = 2/3 (the centred outcome); Delta = mean(post after step 3) - mean(pre after
    # step 1) = 3/4 - 1/4 = 0.5 on steps 2..3
    assert rule(group, GroupScore(), [1.0, -0.5, -0.5])[0] == pytest.approx([2 / 3, 2 / 3 + 0.5, 2 / 3 + 0.5, 2 / 3])


def test_the_trainer_builds_its_rule_with_the_configured_step_boundary():
    from types import SimpleNamespace

    grpo = pytest.importorskip("draco_gym.algos.rllib.grpo")
    config = grpo.GRPOConfig().training(turns_without_code="attach")
    assert config.run.credit.turns_without_code == "attach"
    assert grpo.GRPOConfig().run.credit.turns_without_code == "trajectory"
    fake = SimpleNamespace(config=config, credit_options=dict)
    rule = grpo.GRPO.credit_rule(fake)
    traj = closing_trajectory()
    assert rule([traj], group_of(traj), [1.0])[0] == pytest.approx([1.26, 168 / 220, 168 / 220])


def test_trca_closing_message_gets_trcas_own_outcome_advantage():
    # TRCA builds on the outcome's A_i, not on the advantages handed in: with outcomes [1, 0] its
    # A_i are (1 - 0.5) / (0.5 + 1e-6) ~ +1 and -1, so the winner's closing turn gets ~ +1, not 0.3.
    winner, loser = closing_trajectory(), closing_trajectory()
    winner.metrics, loser.metrics = {"success": True}, {"success": False}
    out = get_credit_rule("trca")([winner, loser], GroupScore(), [0.3, -0.3])
    assert out[0][2] == pytest.approx(1.0, abs=1e-5) and out[1][2] == pytest.approx(-1.0, abs=1e-5)
