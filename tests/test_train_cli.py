"""``draco-gym train`` then ``draco-gym eval`` end to end, as a user runs them: a YAML file,
a tiny Llama (random on PythonTools; warm-started on the Corridor for ``--before-after``), Ray
and Tune started by the command, no Ray session of the test's own."""

from __future__ import annotations

import json

import pytest
import yaml

from draco_gym.algos.policy.models import build_tiny_llama
from draco_gym.cli import main


@pytest.mark.slow
def test_train_then_eval_leave_every_artifact(tmp_path, capsys):
    model = build_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "run"
    config = {
        "name": "cli",
        "output_dir": str(out),
        "iterations": 2,
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(model), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 8, "max_response_tokens": 64},
        "reward": {"name": "rule"},
        "credit": {"name": "draco"},
        "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        "eval": {"max_tasks": 2, "episodes_per_task": 2, "temperature": 1.0, "score": True},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))

    assert main(["train", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "[iter 1/2]" in printed and "[iter 2/2]" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2]
    assert {"env_runners/episode_return_mean", "judge/rubric_pass_rate", "timers/phases/learner",
            "learners/default_policy/kl"} <= set(rows[0])
    assert (out / "plots" / "rubric_pass_rate.png").stat().st_size > 1000
    assert (out / "plots" / "termination_modes.png").stat().st_size > 1000
    assert list((out / "tune").rglob("events.out.tfevents*")), "no TensorBoard events"
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 4
    assert (out / "checkpoint").is_dir()
    # Memory, per process and for the tree, at the end (bench/measure_run.py's figures)
    assert "memory: peak " in printed and "GiB PSS for the whole process tree" in printed
    memory = json.loads((out / "memory.json").read_text())
    names = [p["name"] for p in memory["processes"]]
    assert any("GRPO" in n for n in names) and any("LLMEnvRunner" in n for n in names), names
    assert memory["peak_pss"] >= max(p["peak_pss"] for p in memory["processes"]) > 0

    # Resume: one more iteration from the final checkpoint, appended to the same metrics.
    assert main(["train", str(path), "--resume", str(out / "checkpoint"), "--iterations", "3"]) == 0
    assert "[iter 3/3]" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 6

    assert main(["eval", str(path), "--checkpoint", str(out / "checkpoint")]) == 0
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert summary["tasks"] == 2 and summary["episodes"] == 4
    assert {"success_rate", "pass@1", "pass@2", "pass^2", "reward_mean", "termination"} <= set(summary)
    assert len((out / "eval" / "rollouts.jsonl").read_text().splitlines()) == 4


def test_eval_metrics_by_hand():
    from draco_gym.metrics import pass_at_k, pass_hat_k

    # 4 episodes, 1 success: pass@2 = 1 - C(3,2)/C(4,2) = 1/2; pass^2 = C(1,2)/C(4,2) = 0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_hat_k(4, 1, 2) == 0.0
    assert pass_hat_k(4, 3, 2) == pytest.approx(3 / 6)
    assert pass_at_k(4, 4, 1) == 1.0 and pass_hat_k(4, 0, 1) == 0.0


@pytest.mark.slow
def test_the_train_command_resumes_a_pipelined_run_without_repeating_or_dropping_an_iteration(tmp_path, capsys):
    """``draco-gym train`` with ``rollout.pipeline: one_step`` (Tune, a checkpoint each
    iteration), then ``--resume`` to more iterations: each iteration is in metrics.jsonl and
    rollouts.jsonl once, with the tasks of its own draw; the resumed first iteration samples
    with the restored weights (staleness 0), the ones after it are one update stale."""
    out = tmp_path / "run"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "name": "piped", "output_dir": str(out), "iterations": 2,
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(build_tiny_llama(tmp_path / "tiny")), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 2, "max_new_tokens": 8, "max_response_tokens": 64,
                    "pipeline": "one_step"},
        "reward": {"name": "rule"}, "optim": {"minibatch_size": None},
        "checkpoint": {"every": 1, "keep": 1},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
    }))
    assert main(["train", str(path)]) == 0
    assert main(["train", str(path), "--resume", str(out / "checkpoint"), "--iterations", "4"]) == 0
    assert "[iter 4/4]" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["env_runners/policy_staleness_max"] for r in rows] == [0, 1, 0, 1]
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    groups = [(r["iteration"], r["policy_version"]) for r in records if r["index"] == 0]
    assert [k for k, _ in groups] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [k - v for k, v in groups] == [0, 0, 1, 1, 0, 0, 1, 1]


@pytest.mark.slow
def test_train_command_writes_before_and_after(tmp_path, capsys):
    """`draco-gym train --before-after`: held-out figures before and after, in summary.json,
    on the Corridor policy that ``tests/test_learning.py`` trains."""
    from draco_gym.bench.learning_setting import ENV_CONFIG, build_corridor_policy

    corridor_policy = build_corridor_policy(tmp_path / "corridor_policy")

    config = tmp_path / "corridor.yaml"
    config.write_text(json.dumps({
        "name": "corridor", "output_dir": str(tmp_path / "run"), "seed": 0, "iterations": 10,
        "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG},
        "policy": {"model": str(corridor_policy), "lora": {"r": 8, "alpha": 16}},
        "rollout": {"group_size": 8, "tasks_per_iteration": 4, "max_new_tokens": 8, "max_prompt_tokens": 512,
                    "max_response_tokens": 400},
        "reward": {"name": "corridor"},
        "optim": {"lr": 2.0e-3, "kl_coeff": 0.05, "minibatch_size": 8},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        "eval": {"episodes_per_task": 32, "temperature": 1.0},
    }))
    assert main(["train", str(config), "--before-after"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    before, after = summary["eval"]["before"], summary["eval"]["after"]
    for figures in (before, after):
        assert figures["episodes"] == 128
        assert {"success_rate", "rubric_pass_rate", "well_formed_turns", "raised_blocks"} <= set(figures)
    assert after["success_rate"]["mean"] >= before["success_rate"]["mean"] + 0.3
    assert after["success_rate"]["ci95"][0] > before["success_rate"]["ci95"][1]
    assert "held-out evaluation" in capsys.readouterr().out


@pytest.mark.slow
def test_relative_paths_are_taken_from_the_folder_the_command_runs_in(tmp_path, capsys, monkeypatch):
    """The issue's new user: ``draco-gym sft`` prints the model to train from; a relative
    ``--set policy.model=...``, config path and output folder, given from a folder that is
    neither the config's nor the trial's, reach every Ray actor as the places the user meant
    (before: FileNotFoundError in the Tune trial's actor, whose working folder is its own).
    The env reads its layout from a file named relatively in env.config, which only the env
    understands: each process that builds the env (the driver, the env runners) works in the
    user's folder."""
    from draco_gym.bench.learning_setting import ENV_CONFIG

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    build_tiny_llama(elsewhere / "models" / "tiny")
    (elsewhere / "layouts").mkdir()
    (elsewhere / "layouts" / "corridor.json").write_text(json.dumps(ENV_CONFIG))
    (project / "filed_corridor.py").write_text(
        "import json\nfrom pathlib import Path\nfrom draco_gym.envs.corridor import CorridorEnv\n\n\n"
        "class FiledCorridor(CorridorEnv):\n"
        "    def __init__(self, layout, **kwargs):\n"
        "        super().__init__(**json.loads(Path(layout).read_text()), **kwargs)\n")
    (project / "corridor.yaml").write_text(json.dumps({
        "name": "corridor", "iterations": 1,
        "env": {"id": "filed_corridor:FiledCorridor", "config": {"layout": "layouts/corridor.json"},
                "modules": ["filed_corridor"], "task_ids": ["corridor-1", "corridor-2"]},
        "policy": {"model": "models/tiny", "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 17, "max_response_tokens": 100},
        "reward": {"name": "corridor"}, "optim": {"minibatch_size": None},
        "warm_start": {"check_tasks": 0},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
    }))
    monkeypatch.chdir(elsewhere)
    assert main(["sft", "../project/corridor.yaml", "--epochs", "1", "--out", "runs/corridor/warm_start"]) == 0
    printed = capsys.readouterr().out
    warm = elsewhere / "runs" / "corridor" / "warm_start"
    assert f"train from it with --set policy.model={warm}\n" in printed  # absolute: it works from any folder

    assert main(["train", "../project/corridor.yaml", "--set", "policy.model=runs/corridor/warm_start",
                 "--output-dir", "runs/grpo"]) == 0
    assert "[iter 1/1]" in capsys.readouterr().out
    assert (elsewhere / "runs" / "grpo" / "checkpoint").is_dir()
    assert len((elsewhere / "runs" / "grpo" / "rollouts.jsonl").read_text().splitlines()) == 2

    # eval from the same folder, the checkpoint relative too: the before/after table's rates,
    # each with its interval, in a column for the checkpoint.
    assert main(["eval", "../project/corridor.yaml", "--checkpoint", "runs/grpo/checkpoint",
                 "--output-dir", "runs/grpo", "--set", "eval.max_tasks=1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("default evaluation"))
    assert lines[header].split()[2:] == ["grpo/checkpoint"]
    rates = {line.split()[0]: line.split()[1:] for line in lines[header + 1:]}
    assert rates["success_rate"][1].startswith("[") and rates["episodes"] == ["1"]
    assert lines[-1] == f"summary: {elsewhere / 'runs' / 'grpo' / 'eval' / 'summary.json'}"


def test_a_command_in_a_process_that_already_runs_ray_says_so(tmp_path, capsys):
    """``draco-gym train`` and ``eval`` start their own Ray and shut it down at the end: in a
    process already running Ray (a notebook that called ray.init) they say what to do
    instead of Ray's "called ray.init twice" traceback, before any minutes are spent."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"env": {"id": "draco_gym/PythonTools-v0"},
                                    "policy": {"model": "smollm2-135m-instruct"}, "output_dir": str(tmp_path / "r")}))
    import ray

    ray.init(num_cpus=1, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False)
    try:
        errors = []
        for command in (["train", str(path)], ["eval", str(path), "--checkpoint", "base"]):
            errors.append((command[0], main(command), capsys.readouterr().err))
    finally:
        ray.shutdown()
    for command, code, err in errors:
        assert code == 2, err
        assert f"error: draco-gym {command} starts a Ray session of its own" in err, err
        # a message, not the exception's traceback (a logging error an earlier test's captured
        # stream leaves behind may precede it)
        assert "ray.shutdown()" in err and "RaySessionOpen" not in err and "ray.init twice" not in err
