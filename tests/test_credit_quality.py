"""The credit-quality benchmark's pieces (judge, precision, training) and its command line."""

import json

import numpy as np
import pytest

from draco_gym.bench.credit_quality import (
    RULES,
    SimConfig,
    SyntheticTask,
    attribution_precision,
    group_credit,
    judge_group,
    main,
    match_uniform_push,
    reference_logprobs,
    softmax,
    train,
)
from draco_gym.cli import main as cli_main


@pytest.fixture
def task():
    cfg = SimConfig(n_steps=6, n_pivots=1, n_hazards=1)
    t = SyntheticTask(cfg, np.random.default_rng(0))
    # pin the layout for hand computation: pivot at step index 1 (right action 0),
    # hazard at step index 3 (harmful action 2)
    t.pos, t.is_pivot, t.key_action = np.array([1, 3]), np.array([True, False]), np.array([0, 2])
    t.p_init = np.array([1 / 3, 2 / 3])
    return cfg, t


def test_judge_without_noise_cites_the_decisions(task):
    cfg, t = task
    cfg = SimConfig(n_steps=6, n_pivots=1, n_hazards=1, p=0.0, q=0.0)
    actions = np.array([[0, 0, 0, 0, 0, 0],    # pivot right, hazard avoided: 2 PASS
                        [0, 1, 0, 2, 0, 0]])   # pivot wrong, hazard hit: 2 FAIL
    rewards, passes, fails = judge_group(t, t.good(actions), cfg, np.random.default_rng(1))
    assert rewards.tolist() == [1.0, -1.0]
    assert passes[0].tolist() == [0, 1, 0, 1, 0, 0] and fails[1].tolist() == [0, 1, 0, 1, 0, 0]
    # a criterion nobody failed is dropped (discriminative dropout): both pass the hazard here
    actions[1, 3] = 0
    rewards, passes, fails = judge_group(t, t.good(actions), cfg, np.random.default_rng(1))
    assert rewards.tolist() == [1.0, -1.0] and passes[0].tolist() == [0, 1, 0, 0, 0, 0]


def test_precision_by_hand(task):
    _, t = task
    actions = np.array([[0, 0, 0, 0, 0, 0], [0, 1, 0, 2, 0, 0]])
    tokens = np.array([[10, 20, 10, 30, 10, 20], [10, 20, 10, 30, 10, 20]])  # N = 100
    # uniform credit, winner A = +1: right-way push on its good decisions = (20 + 30) / 100
    # loser A = -1: pushed down on its two bad decisions, same share 0.5
    assert attribution_precision(t, actions, tokens, np.array([[1.0] * 6, [-1.0] * 6])) == [0.5, 0.5]
    # a winner pushed up only on a filler step earns 0; a push of the wrong sign earns 0
    adv = np.array([[0, 0, 1.0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0]])
    assert attribution_precision(t, actions, tokens, adv) == [0.0, 0.0]


def test_reference_knows_a_dead_end(task):
    cfg, t = task
    cfg = SimConfig(n_steps=6, n_pivots=1, n_hazards=1, ref_noise=0.0)
    actions = np.array([[0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]])
    l = reference_logprobs(t, t.good(actions), cfg, np.random.default_rng(0))
    # before any decision: log(1/3 * 2/3); after the pivot, right: log(2/3), wrong: log(floor)
    assert l[0, 0] == pytest.approx(np.log(2 / 9)) and l[0, 2] == pytest.approx(np.log(2 / 3))
    assert l[1, 2] == pytest.approx(np.log(cfg.ref_floor)) and l[0, 6] == 0.0


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_gives_finite_step_advantages(rule):
    cfg = SimConfig()
    t = SyntheticTask(cfg, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    probs = softmax(np.random.default_rng(5).normal(size=(cfg.n_steps, cfg.n_actions)))
    for _ in range(5):
        actions = np.stack([np.array([rng.choice(cfg.n_actions, p=pr) for pr in probs]) for _ in range(cfg.group_size)])
        tokens = rng.integers(20, 81, size=actions.shape)
        out, extra, adv = group_credit(rule, t, probs, actions, tokens, cfg, rng)
        assert out.shape == actions.shape and np.isfinite(out).all()
        assert extra in ((0, 2 * cfg.prover_k) if rule == "prover" else (0,))
        # rescaled to uniform's push: sum n|a| equals sum_i |A_i| N_i; DRACO already conserves it.
        # A rule on the outcome's advantage pushes nothing in a group without a success: no scale helps.
        matched = match_uniform_push(out, tokens, adv)
        uniform_push = (np.abs(adv) * tokens.sum(axis=1)).sum()
        if uniform_push > 0 and np.abs(out).any():
            assert (tokens * np.abs(matched)).sum() == pytest.approx(uniform_push)
        if rule == "draco":
            np.testing.assert_allclose(matched, out)


def test_match_push_by_hand():
    # A = [1, -1], N = [10, 10]: uniform push 20; the rule pushes 2*10 + 4*10 = 60 -> scale 1/3
    out = match_uniform_push(np.array([[2.0, 0.0], [-4.0, 0.0]]), np.array([[10, 0], [10, 0]]), np.array([1.0, -1.0]))
    np.testing.assert_allclose(out, [[2 / 3, 0.0], [-4 / 3, 0.0]])


def test_training_learns_and_is_reproducible():
    cfg = SimConfig(max_episodes=3000, lr=8.0)
    a, b = train("draco", cfg, seed=0), train("draco", cfg, seed=0)
    assert a == b
    assert a.reached and a.final_success >= 0.9 and 0.0 < a.precision < 1.0


def test_command_line_writes_table_png_and_json(tmp_path, capsys):
    assert cli_main(["bench", "credit", "--seeds", "1", "--p", "0,0.4", "--budget", "300", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "episodes to 90%" in out and "speed-up" in out
    for rule in RULES:
        assert f" {rule} " in out
    data = json.loads((tmp_path / "credit_quality.json").read_text())
    assert len(data["rows"]) == 2 * len(RULES) and (tmp_path / "credit_quality.png").stat().st_size > 10_000
    assert main(["--rules", "uniform,nope", "--out", str(tmp_path)]) == 2
