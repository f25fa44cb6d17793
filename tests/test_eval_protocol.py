"""The paper's evaluation protocol in ``draco-gym eval``: pass^k over n = 3 runs per task,
splits apart where the data has them, the mean over the run's last checkpoints. Hand-computed."""

from __future__ import annotations

import json
import os

import pytest

from draco_gym.algos.checkpoints import seal
import yaml

from draco_gym.algos.cli.eval import last_checkpoints, resolve_checkpoints
from draco_gym.algos.evaluation import eval_summary, mean_summary
from draco_gym.cli import main
from draco_gym.types import RolloutGroup, Task, Trajectory


def _group(task_id: str, wins: list[bool]) -> RolloutGroup:
    task = Task(id=task_id, instruction="x")
    return RolloutGroup(task_id=task_id,
                        trajectories=[Trajectory(task=task, termination="no_code", metrics={"success": w}) for w in wins])


def test_pass_hat_k_over_three_runs_and_sgc_by_hand():
    # Scenario s1 (two tasks, all 6 runs pass), s2_1 passes 2 of 3, s3_1 none.
    groups = [_group("s1_1", [True] * 3), _group("s1_2", [True] * 3), _group("s2_1", [True, False, True]),
              _group("s3_1", [False] * 3)]
    out = eval_summary(groups, "success", scenarios=True)
    assert out["success_rate"] == pytest.approx(8 / 12)
    assert out["pass^1"] == pytest.approx(8 / 12)
    # pass^2 per task: 1, 1, C(2,2)/C(3,2) = 1/3, 0
    assert out["pass^2"] == pytest.approx((1 + 1 + 1 / 3 + 0) / 4)
    assert out["pass^3"] == pytest.approx(2 / 4)
    # pass@2 of s2_1: 1 - C(1,2)/C(3,2) = 1
    assert out["pass@2"] == pytest.approx(3 / 4)
    assert out["sgc"] == pytest.approx(1 / 3)  # s1 only: s2 had a failed run
    assert "pass^4" not in out
    assert "sgc" not in eval_summary(groups, "success")  # only where tasks have scenarios (AppWorld)


def test_mean_over_checkpoints_by_hand():
    runs = [{"tasks": 4, "success_rate": 0.5, "pass^3": 0.25, "termination": {"no_code": 1.0}},
            {"tasks": 4, "success_rate": 0.75, "pass^3": 0.5, "termination": {"no_code": 0.5, "max_turns": 0.5}},
            {"tasks": 4, "success_rate": 1.0, "pass^3": 0.75, "termination": {"no_code": 1.0}}]
    mean = mean_summary(runs)
    assert mean["success_rate"] == pytest.approx(0.75) and mean["pass^3"] == pytest.approx(0.5)
    assert mean["termination"] == pytest.approx({"max_turns": 0.5 / 3, "no_code": 2.5 / 3})
    assert mean["runs"] == 3 and mean["tasks"] == 4


def _checkpoints(tmp_path, n: int) -> list:
    paths = []
    for i in range(n):
        path = tmp_path / "tune" / "GRPO_trial" / f"checkpoint_{i:06d}"
        path.mkdir(parents=True)
        (path / "rllib_checkpoint.json").write_text("{}")
        seal(path, iteration=i + 1)  # complete, as GRPO's save leaves it
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(path)
    return paths


def test_last_checkpoints_are_the_newest_n_oldest_first(tmp_path, capsys):
    paths = _checkpoints(tmp_path, 5)
    assert last_checkpoints(tmp_path, 3) == paths[2:]
    assert last_checkpoints(tmp_path, 9) == paths  # fewer kept than asked: all, with a note
    assert "keeps 5" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no complete checkpoints under"):
        last_checkpoints(tmp_path / "elsewhere", 3)


def test_resolve_checkpoints_expands_last_and_puts_base_first(tmp_path):
    paths = _checkpoints(tmp_path, 4)
    got = resolve_checkpoints(["last", "base", str(paths[3])], tmp_path, 2)
    assert got == ["base", str(paths[2].resolve()), str(paths[3].resolve())]
    with pytest.raises(ValueError, match="--checkpoint nowhere: no such directory"):
        resolve_checkpoints(["nowhere"], tmp_path, 1)


def test_splits_the_data_lacks_are_refused_by_name(tmp_path, capsys):
    # PythonTools has no splits at all: each listed split is skipped with its reason, and with
    # none left the command fails before starting Ray.
    config = {"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "smollm2-135m-instruct"},
              "output_dir": str(tmp_path / "run"), "eval": {"splits": ["test_normal", "test_challenge"]}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["eval", str(path), "--checkpoint", "base"]) == 2
    err = capsys.readouterr().err
    assert "split 'test_normal' skipped" in err and "split 'test_challenge' skipped" in err
    assert "none of eval.splits ['test_normal', 'test_challenge'] could be evaluated" in err


@pytest.mark.slow
def test_eval_last_checkpoints_reports_each_and_their_mean(tmp_path, capsys):
    from draco_gym.algos.policy.models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "run"
    config = {
        "name": "protocol", "output_dir": str(out), "iterations": 2,
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(model), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 8, "max_response_tokens": 64},
        "reward": {"name": "rule"}, "credit": {"name": "draco"}, "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        "checkpoint": {"every": 1, "keep": 3},
        "eval": {"max_tasks": 2, "episodes_per_task": 3, "temperature": 1.0, "last_checkpoints": 2},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0
    capsys.readouterr()
    assert main(["eval", str(path), "--checkpoint", "last"]) == 0
    summary = json.loads((out / "eval" / "summary.json").read_text())
    runs = summary["splits"]["default"]["checkpoints"]
    assert len(runs) == 2 and summary["protocol"]["episodes_per_task"] == 3
    for run in runs.values():
        assert run["tasks"] == 2 and run["episodes"] == 6 and {"pass^1", "pass^2", "pass^3"} <= set(run)
    mean = summary["splits"]["default"]["mean"]
    for key in ("success_rate", "pass^3", "turns_mean"):
        assert mean[key] == pytest.approx(sum(r[key] for r in runs.values()) / 2)
    assert len(list((out / "eval").glob("rollouts-default-*.jsonl"))) == 2


def test_eval_prints_the_before_after_rates_with_their_intervals():
    """``draco-gym eval`` prints the rates ``--before-after`` prints (each with its 95%
    interval), a column per checkpoint, then pass@k / pass^k and the mean over checkpoints."""
    from draco_gym.algos.cli.eval import evaluation_table
    from draco_gym.metrics import share

    def run(wins):
        return {"tasks": 2, "episodes": 4, "success_rate": wins / 4, "pass@1": wins / 4, "pass^2": wins / 8,
                "turns_mean": 2.0, "termination": {"submitted": 1.0},
                "rates": {"episodes": 4, "success_rate": share(wins, 4), "well_formed_turns": share(8, 8),
                          "raised_blocks": share(0, 8)}}

    runs = {"t/checkpoint_000001": run(1), "t/checkpoint_000002": run(3)}
    text = evaluation_table("default", {"checkpoints": runs, "mean": mean_summary(list(runs.values()))})
    lines = text.splitlines()
    assert lines[0].split() == ["default", "evaluation", "t/checkpoint_000001", "t/checkpoint_000002"]
    assert lines[1].split() == ["success_rate", "0.250", "[0.05,", "0.70]", "0.750", "[0.30,", "0.95]"]
    assert [line.split()[0] for line in lines[2:]] == ["well_formed_turns", "raised_blocks", "pass@1", "pass^2",
                                                       "turns_mean", "episodes", "mean", "success_rate"]
    assert lines[-2] == "mean over the 2 checkpoints: success_rate 0.500, pass@1 0.500, pass^2 0.250, turns_mean 2.000"
    # without episode outcomes: two independent samples, 1/4 -> 3/4
    assert lines[-1] == ("success_rate t/checkpoint_000002 - t/checkpoint_000001: +0.500, 95% CI [-0.100, +1.000]; "
                         "holds zero: no difference seen")


def test_eval_pairs_checkpoints_that_met_the_same_episodes():
    """One seed meets the same episodes in every checkpoint: the later checkpoints' success is
    compared with the first's episode by episode (39 of 80 -> 54 of 80, 18 gained, 3 lost)."""
    from draco_gym.algos.cli.eval import versus_first
    from draco_gym.metrics import share

    def run(outcomes):
        rate = {**share(sum(outcomes), len(outcomes)), "outcomes": {f"t{i % 20}/{i // 20}": o for i, o in enumerate(outcomes)}}
        return {"rates": {"success_rate": rate}}

    before = [True] * 39 + [False] * 41
    after = [True] * 36 + [False] * 3 + [True] * 18 + [False] * 23
    assert versus_first({"base": run(before), "runs/q/checkpoint": run(after)}) == [
        "success_rate runs/q/checkpoint - base: +0.188, 95% CI [+0.078, +0.289] (paired over the same 80 episodes: 18 "
        "passed only in runs/q/checkpoint, 3 only in base); excludes zero"]
