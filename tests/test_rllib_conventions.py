"""RLlib's conventions: a GRPO result in the new API stack's shape (RLlib's own checker), a
checkpoint whose adapter opens with PEFT (``Algorithm.from_checkpoint``: test_train_grpo), Tune stop criteria on result keys, and
Tune's W&B (offline) and MLflow (local store) logger callbacks fed by ``draco-gym train``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

ray = pytest.importorskip("ray")

from grpo_fixtures import lora_state, make_config  # noqa: E402


def test_result_has_rllibs_shape_and_the_adapter_opens_with_peft(ray_session, tiny_model, tmp_path):
    from ray.rllib.utils.test_utils import check_train_results_new_api_stack

    from draco_gym.algos.rllib.grpo import ADAPTER_DIR

    algo = make_config(tiny_model, tmp_path / "run").build_algo()
    try:
        result = algo.train()
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        trained = lora_state(algo)
    finally:
        algo.stop()

    check_train_results_new_api_stack(result)
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    returns = [r["score"]["reward"] for r in rollouts]
    turns = [len(r["trajectory"]["steps"]) for r in rollouts]
    runners = result["env_runners"]
    # RLlib's episode statistics: the rubric reward of each episode, its turns, the counters.
    assert runners["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert runners["episode_return_min"] == pytest.approx(min(returns))
    assert runners["episode_return_max"] == pytest.approx(max(returns))
    assert runners["episode_len_mean"] == pytest.approx(np.mean(turns))
    assert runners["num_episodes"] == runners["num_episodes_lifetime"] == 6
    assert runners["num_env_steps_sampled"] == runners["num_env_steps_sampled_lifetime"] == sum(turns)
    # Ours beside them: environment evaluation, termination shares, tokens.
    assert {"success", "parse_errors", "exec_errors"} <= set(runners["env"])
    assert sum(runners["termination"].values()) == pytest.approx(1.0)
    assert runners["num_generated_tokens"] == result["learners"]["default_policy"]["policy_tokens"] > 0
    assert {"rubric_pass_rate", "criteria_before_dropout", "calls", "cost"} <= set(result["judge"])
    assert "inert_share" in result["credit"]
    assert {"generation", "env", "judge", "credit", "learner", "sync", "other"} <= set(result["timers"]["phases"])
    assert result["learners"]["default_policy"]["policy_tokens"] > 0
    for old in ("reward_mean", "num_trajectories", "time/learner", "env/success"):
        assert old not in result

    # The HF way: the adapter folder opens with PEFT on the base model, with the trained weights.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = Path(ckpt) / ADAPTER_DIR
    assert (adapter / "adapter_config.json").is_file()
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model)), str(adapter))
    loaded = {k: v for k, v in peft_model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(trained)
    moved = [k for k in trained if "lora_B" in k and np.abs(np.asarray(trained[k])).max() > 0]
    assert moved, "one update must move LoRA B, or this comparison proves nothing"
    for key, value in trained.items():
        (match,) = [v for k, v in loaded.items() if key.endswith(k.removeprefix("base_model."))]
        assert np.allclose(match.numpy(), np.asarray(value))


def _run(**extra):
    from draco_gym.algos.config import parse_config

    return parse_config({"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": "m"}, **extra})


def test_stop_and_logging_sections_are_checked_where_written():
    from draco_gym.algos.config import ConfigError

    run = _run(stop={"env_runners/episode_return_mean": 0.5, "training_iteration": 7})
    assert run.iterations == 7
    assert run.tune_stop() == {"env_runners/episode_return_mean": 0.5, "training_iteration": 7}
    assert _run(iterations=4).tune_stop() == {"training_iteration": 4}
    with pytest.raises(ConfigError, match="did you mean 'env_runners/episode_return_mean'"):
        _run(stop={"episode_return_mean": 0.5})
    with pytest.raises(ConfigError, match="iterations=3 and stop.training_iteration=5 disagree"):
        _run(iterations=3, stop={"training_iteration": 5})
    with pytest.raises(ConfigError, match="logging.wandb.api_key: secrets do not belong.*api_key_env"):
        _run(logging={"wandb": {"project": "p", "api_key": "k-123"}})
    with pytest.raises(ConfigError, match="did you mean 'logging.wandb.project'"):
        _run(logging={"wandb": {"projet": "p"}})


def test_an_online_wandb_key_variable_that_is_not_set_is_named(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    from ray.air.integrations.wandb import WandbLoggerCallback

    from draco_gym.algos.rllib.reporting import tracker_callbacks

    monkeypatch.delenv("DRACO_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match="DRACO_TEST_UNSET_KEY is not set"):
        tracker_callbacks({"wandb": {"project": "p", "api_key_env": "DRACO_TEST_UNSET_KEY"}}, run_name="r",
                          output_dir=tmp_path)
    (callback,) = tracker_callbacks({"wandb": {"project": "p", "mode": "offline"}}, run_name="r", output_dir=tmp_path)
    assert isinstance(callback, WandbLoggerCallback) and callback.kwargs["mode"] == "offline"


def test_metrics_rows_flatten_the_result_groups():
    from draco_gym.algos.rllib.reporting import compact, progress_line

    result = {"training_iteration": 2, "time_this_iter_s": 41.0, "config": {"lr": 1.0},
              "perf": {"cpu_util_percent": 50.0},
              "env_runners": {"episode_return_mean": 0.25, "termination": {"no_code": 0.5, "submitted": 0.5},
                              "env": {"success": 0.5}},
              "learners": {"default_policy": {"kl": 0.01, "x_throughput": {"since": 3.0}}},
              "judge": {"rubric_pass_rate": 0.75},
              "credit": {"inert_share": 0.25, "paper_inert_share": 0.625, "uncredited_citations": 3},
              "timers": {"phases": {"learner": 1.5}, "training_iteration": 80.1}}  # RLlib's EMA of iteration times
    row = compact(result)
    assert row == {"training_iteration": 2, "time_this_iter_s": 41.0, "env_runners/episode_return_mean": 0.25,
                   "env_runners/termination/no_code": 0.5, "env_runners/termination/submitted": 0.5,
                   "env_runners/env/success": 0.5, "learners/default_policy/kl": 0.01,
                   "judge/rubric_pass_rate": 0.75, "credit/inert_share": 0.25, "credit/paper_inert_share": 0.625,
                   "credit/uncredited_citations": 3, "timers/phases/learner": 1.5,
                   "timers/training_iteration": 80.1}
    line = progress_line(row, 3)
    for shown in ("[iter 2/3]", "return=+0.250", "pass=0.75", "success=0.50", "no_code=0.50", "kl=0.0100",
                  "inert=0.25/paper=0.62", "uncredited=3", "learner=1.5s", "iter=41.0s"):
        assert shown in line


@pytest.mark.slow
def test_train_stops_on_return_and_feeds_wandb_and_mlflow(tiny_model, tmp_path, monkeypatch, capsys):
    """``draco-gym train`` with a ``stop:`` on the episode return and both trackers, offline."""
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    from draco_gym.cli import main

    ray.shutdown()  # the command starts its own Ray (a module-scoped session may still be up)
    # Canary keys in every variable a run reads one from: W&B's (named by api_key_env, then
    # exported as WANDB_API_KEY), MLflow's token (tracking_token_env) and a judge's.
    secret = "draco-test-secret-7f3a9c"
    monkeypatch.setenv("DRACO_TEST_WANDB_KEY", secret)
    monkeypatch.setenv("DRACO_TEST_MLFLOW_TOKEN", secret + "-mlflow")
    monkeypatch.setenv("OPENAI_API_KEY", secret + "-judge")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # restored after the test
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))  # this run's Ray session folder, logs included
    out = tmp_path / "run"
    config = {
        "name": "trackers",
        "output_dir": str(out),
        "iterations": 3,
        # Every return is >= -1: the run must stop after its first iteration, not the third.
        "stop": {"env_runners/episode_return_mean": -1.0},
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(tiny_model), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 8, "max_response_tokens": 64},
        "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        "logging": {"wandb": {"project": "draco-test", "mode": "offline", "api_key_env": "DRACO_TEST_WANDB_KEY"},
                    "mlflow": {"tracking_token_env": "DRACO_TEST_MLFLOW_TOKEN"}},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))

    assert main(["train", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "[iter 1/3]" in printed and "[iter 2/3]" not in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1]
    assert {"env_runners/episode_return_mean", "env_runners/num_episodes", "judge/rubric_pass_rate",
            "timers/phases/learner", "learners/default_policy/kl"} <= set(rows[0])
    assert (out / "checkpoint" / "adapter" / "adapter_config.json").is_file()

    # W&B, offline: the run folder, with the scalars, the config and the plots.
    (run_file,) = list((out / "tune").rglob("offline-run-*/run-*.wandb"))
    history, wandb_config = wandb_records(run_file)
    assert history[0]["env_runners/episode_return_mean"] == pytest.approx(rows[0]["env_runners/episode_return_mean"])
    assert history[0]["learners/default_policy/kl"] == pytest.approx(rows[0]["learners/default_policy/kl"])
    assert history[0]["plots/rubric_pass_rate/_type"] == "image-file"
    assert wandb_config["run"]["rollout"]["group_size"] == 2
    assert list(run_file.parent.rglob("media/images/plots/rubric_pass_rate*.png"))

    # MLflow, the local store the config defaults to: scalars, the config as params, the plots.
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("trackers").experiment_id])
    assert run.data.metrics["env_runners/episode_return_mean"] == pytest.approx(
        rows[0]["env_runners/episode_return_mean"])
    assert run.data.params["run/rollout/group_size"] == "2"
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert (artifacts / "plots" / "rubric_pass_rate.png").stat().st_size > 1000

    # No key reached a file: the run's (config, Tune's pickles, checkpoints, trackers' folders)
    # or Ray's session folder (its logs: the runtime-env agent logs every runtime_env it sets up).
    sessions = list((ray_tmp / "ray").glob("session_2*"))
    assert sessions and list(sessions[0].glob("logs/runtime_env_agent.log")), "not the run's Ray session folder"
    files = [p for root in (out, ray_tmp) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    leaks = [p for p in files if secret.encode() in p.read_bytes()]
    assert not leaks, f"an API key was written to {leaks}"


def wandb_records(path: Path) -> tuple[list[dict], dict]:
    """The logged rows and the config of an offline W&B run file: W&B's protobuf records in
    the LevelDB log layout (7-byte file header, 32 KiB blocks, 7-byte record headers)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    pos, chunks, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
        elif kind == 0:
            break
    history, config = [], {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
        elif record.WhichOneof("record_type") == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return history, config


@pytest.mark.parametrize("env_runners, trial_cpus", [(0, 2), (1, 1)])
def test_a_trial_alone_on_its_ray_reserves_every_cpu(ray_session, tiny_model, tmp_path, env_runners, trial_cpus):
    """Ray gives a trial's torch one thread per CPU its first bundle reserves; a trial that
    samples and learns by itself gets them all (of the 2 the session has), one beside an env
    runner keeps RLlib's one."""
    from draco_gym.algos.rllib.grpo import GRPO
    from draco_gym.algos.rllib.runs import reserve_every_cpu

    config = make_config(tiny_model, tmp_path).env_runners(num_env_runners=env_runners)
    reserve_every_cpu(config)
    bundles = GRPO.default_resource_request(config).bundles
    assert bundles[0]["CPU"] == trial_cpus
    assert sum(b.get("CPU", 0) for b in bundles) <= 2  # the trial still fits the machine
