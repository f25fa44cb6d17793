"""bench/plan.py: the cost model's formulas on worked numbers, the paper's bill, and the
check against a run's metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import plan as P  # noqa: E402

M = P.Measured(sampler_tokens_per_s=100, learner_tokens_per_s=50, env_step_s=0.1, judge_call_s=0.5,
               judge_prompt_tokens=1000, judge_completion_tokens=100, judge_price_prompt=2.0,
               judge_price_completion=10.0, credit_s=1.0, sync_s=2.0)
C = P.Cluster(sampler_gpus=2, learner_gpus=1, env_nodes=2, judge_concurrency=2)
R = P.RunConfig(tasks_per_iteration=4, group_size=6, turns=5, tokens_per_turn=20, judge_mode="separate",
                group_end_spread=0.5)


def test_draco_judge_calls_and_rounds_per_group():
    # reward/dynamic.py: propose 1 + augment G + merge 1 + score G + attribute G; fused: score+attribute
    assert P.judge_calls(6, "separate") == 20 and P.judge_rounds("separate") == 5
    assert P.judge_calls(6, "fused") == 14 and P.judge_rounds("fused") == 4
    assert P.judge_calls(6, "separate", proposal_cached=True) == 19 and P.judge_rounds("separate", True) == 4
    assert P.judge_calls(6, "none") == 0


def test_judge_queue_latency_bound_throughput_bound_and_rate_limit():
    wide = P.Cluster(judge_concurrency=40)  # 80 calls/s: a group's 20 calls take 0.25 s of capacity
    assert P.judge_finish([0.0], 20, 5, M, wide) == pytest.approx(2.5)  # its 5 rounds x 0.5 s
    narrow = P.Cluster(judge_concurrency=2)  # 4 calls/s: 5 s of capacity per group
    assert P.judge_finish([0.0, 0.0], 20, 5, M, narrow) == pytest.approx(10.0)
    assert P.judge_finish([0.0, 10.0], 20, 5, M, narrow) == pytest.approx(15.0)  # the judge was idle at 10
    limited = P.Cluster(judge_concurrency=40, judge_rpm=120)  # 2 calls/s
    assert P.judge_finish([0.0], 20, 5, M, limited) == pytest.approx(10.0)


def test_group_ends_spread_over_the_end_of_the_rollout():
    assert P.group_ends(18.0, 4, 0.5) == pytest.approx([11.25, 13.5, 15.75, 18.0])
    assert P.group_ends(18.0, 3, 0.0) == pytest.approx([18.0] * 3)


def test_plan_on_worked_numbers():
    p = P.plan(M, C, R)
    # 24 episodes x 5 turns x 20 tokens = 2400 tokens; 120 env steps
    assert p.phases["generation"] == pytest.approx(2400 / 200)  # 12 s on 2 sampler GPUs
    assert p.phases["env"] == pytest.approx(120 * 0.1 / 2)  # 6 s on 2 nodes
    assert p.phases["learner"] == pytest.approx(48.0)
    # judge: 4 groups of 20 calls at 4 calls/s, all handed over at 18 s: the last served at 38 s
    assert p.phases["judge"] == pytest.approx(20.0)
    assert p.sequential_s == pytest.approx(18 + 20 + 1 + 48 + 2)
    # streaming: handed over at 11.25, 13.5, 15.75, 18 -> served at 16.25, 21.25, 26.25, 31.25
    assert p.streaming_s == pytest.approx(31.25 + 1 + 48 + 2)
    # one step: max(streamed rollout and judging 31.25, credit + learner 49) + sync 2
    assert p.one_step_s == pytest.approx(51.0)
    assert p.bottleneck == "learner"
    # 80 calls x (1000 x $2 + 100 x $10) / 1e6
    assert p.judge_calls_per_step == 80
    assert p.judge_cost_per_step == pytest.approx(0.24) and p.judge_cost_per_100_steps == pytest.approx(24.0)


def test_one_step_is_bound_by_the_streamed_sample_when_the_learner_is_fast():
    fast = P.Measured(**{**M.__dict__, "learner_tokens_per_s": 2400})  # 1 s of learning
    p = P.plan(fast, C, R)
    # the env runners sample and judge (streamed, 31.25 s) while credit + learner (2 s) run
    assert p.one_step_s == pytest.approx(31.25 + 2)
    assert p.streaming_s == pytest.approx(31.25 + 1 + 1 + 2)


def test_streaming_gains_nothing_when_every_group_ends_with_the_rollout():
    p = P.plan(M, C, P.RunConfig(**{**R.__dict__, "group_end_spread": 0.0}))
    assert p.streaming_s == pytest.approx(p.sequential_s)


def test_the_papers_setting_and_its_bill():
    m, c, r = P.PAPER
    p = P.plan(m, c, r)
    assert p.judge_calls_per_step == 16 * 20
    # $1,607 / (100 x 320 calls) = $0.0502 a call; less 1,000 x $15/M -> 14,087.5 prompt tokens at $2.50/M
    assert P.implied_prompt_tokens(1607.0, 320, m) == pytest.approx(14087.5)
    assert p.judge_cost_per_100_steps == pytest.approx(1600.0)  # 320 x 100 x (14,000 x 2.5 + 1,000 x 15) / 1e6


def _row(i: int, gen_tokens: float, steps: float, episodes: float, time_s: float, **timers) -> dict:
    return {"training_iteration": i, "time_this_iter_s": time_s, "env_runners/num_generated_tokens": gen_tokens,
            "env_runners/num_env_steps_sampled": steps, "env_runners/num_episodes": episodes,
            "learners/default_policy/policy_tokens": gen_tokens, "judge/calls": timers.pop("calls", 0.0),
            **{f"timers/phases/{k}": v for k, v in timers.items()}}


def test_measured_run_calibrates_and_predicts(tmp_path, capsys):
    # 100 tok/s sampling, 50 tok/s learning, 0.2 s per env step, 0.5 s per judge call, 1 s other
    rows = [_row(1, 100, 10, 4, 99.0, generation=50, env=40, judge=3, credit=0, learner=2, sync=0, calls=6)]
    for i, tokens in ((2, 200), (3, 200), (4, 400), (5, 400)):
        steps, calls = tokens / 10, tokens / 20
        phases = dict(generation=tokens / 100, env=steps * 0.2, judge=calls * 0.5 + 0.0, credit=0.5, learner=tokens / 50,
                      sync=0.5)
        rows.append(_row(i, tokens, steps, 4, sum(phases.values()) + 1.0, calls=calls, **phases))
    # a run killed mid-write leaves a torn last line: it is skipped, as every reader of the run does
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"training_iter')
    predicted, measured = P.check_measured(tmp_path)
    assert predicted == pytest.approx(measured)  # iteration 1 (start-up) left out, 2-3 fit, 4-5 predicted
    assert measured == pytest.approx(400 / 100 + 40 * 0.2 + 20 * 0.5 + 0.5 + 400 / 50 + 0.5 + 1.0)
    assert "iteration 5: predicted" in capsys.readouterr().out


def test_measured_run_errors_name_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        P.check_measured(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"training_iteration": 1}) + "\n")
    with pytest.raises(SystemExit, match="needs 2 or more"):
        P.check_measured(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("not json\n" + json.dumps({"training_iteration": 1}) + "\n")
    with pytest.raises(SystemExit, match="line 1 is not JSON"):
        P.check_measured(tmp_path)
