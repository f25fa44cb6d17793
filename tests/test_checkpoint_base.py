"""A trained adapter runs on the base model it was trained on: PEFT's ``adapter_config.json``
records it (after a warm start, ``OUTPUT_DIR/warm_start``), and every path that loads a
checkpoint (``draco-gym eval``, the before/after evaluation, ``--resume``, ``restore_from``,
``Algorithm.from_checkpoint``) takes that base or refuses a mismatch, naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draco_gym.algos.checkpoints import seal
from draco_gym.algos.policy.models import BaseModelMismatch, adapter_base, base_for_adapter, check_adapter_base


def model_dir(path: Path, origin: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if origin is not None:  # what draco-gym sft writes beside a warm-started model
        (path / "warm_start.json").write_text(json.dumps({"key": {"model": origin}}))
    return path


def adapter(path: Path, base: Path | str) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "r": 4}))
    return path


def test_a_warm_started_runs_adapter_runs_on_the_warm_start(tmp_path):
    raw = model_dir(tmp_path / "smollm2")
    warm = model_dir(tmp_path / "run" / "warm_start", origin=str(raw))
    trained = adapter(tmp_path / "run" / "checkpoint" / "adapter", warm)
    assert adapter_base(trained) == str(warm)
    # the config names the raw model (its warm_start: section made the warm start from it)
    assert base_for_adapter(trained, str(raw)) == str(warm)
    assert base_for_adapter(trained, str(warm)) == str(warm)


def test_another_base_is_refused_naming_both(tmp_path):
    raw = model_dir(tmp_path / "smollm2")
    other = model_dir(tmp_path / "qwen")
    warm = model_dir(tmp_path / "run" / "warm_start", origin=str(raw))
    trained = adapter(tmp_path / "ckpt" / "adapter", warm)
    with pytest.raises(BaseModelMismatch, match=f"trained on the base model {warm}, but policy.model is {other}"):
        base_for_adapter(trained, str(other))
    with pytest.raises(BaseModelMismatch, match=f"trained on the base model {warm}.*built on {raw}; rebuild"):
        check_adapter_base(trained, str(raw), fix="rebuild")  # a policy already built on the raw model
    check_adapter_base(trained, str(warm), fix="rebuild")


def test_an_adapter_without_a_record_or_with_a_base_not_here_takes_the_configs(tmp_path, capsys):
    raw = model_dir(tmp_path / "smollm2")
    (tmp_path / "bare").mkdir()
    assert base_for_adapter(tmp_path / "bare", str(raw)) == str(raw)
    moved = adapter(tmp_path / "copied" / "adapter", "/elsewhere/run/warm_start")
    assert base_for_adapter(moved, str(raw)) == str(raw)
    assert "trained on /elsewhere/run/warm_start, which is not on this machine" in capsys.readouterr().err
    check_adapter_base(moved, str(raw), fix="")


def test_eval_refuses_a_checkpoint_of_another_base_before_ray_starts(tmp_path, capsys):
    from draco_gym.cli import main

    raw = model_dir(tmp_path / "smollm2")
    other = model_dir(tmp_path / "qwen")
    checkpoint = tmp_path / "ckpt"
    adapter(checkpoint / "adapter", other)
    (checkpoint / "rllib_checkpoint.json").write_text("{}")
    seal(checkpoint, iteration=1)  # complete: the base is what is wrong with it
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"env": {"id": "draco_gym/Corridor-v0"}, "policy": {"model": str(raw)},
                                  "output_dir": str(tmp_path / "run")}))
    assert main(["eval", str(config), "--checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"trained on the base model {other}, but policy.model is {raw}" in err
    assert "Traceback" not in err


def docs_eval_line() -> list[str]:
    """The quickstart's eval command, as the manual's training page gives it first (later lines
    compare several checkpoints)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    lines = [ln for ln in page.splitlines() if ln.startswith("draco-gym eval configs/quickstart.yaml")]
    assert lines, "docs/training.md gives no quickstart eval line"
    args = lines[0].split("#")[0].split()[1:]
    assert args.count("--checkpoint") == 1, lines[0]
    return args


def test_the_docs_eval_line_evaluates_the_quickstarts_checkpoint():
    """The slow test below replays this line; a page edit that breaks it should fail here, fast."""
    assert docs_eval_line() == ["eval", "configs/quickstart.yaml", "--checkpoint", "runs/quickstart/checkpoint"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_docs_eval_line_gives_the_train_commands_after_numbers(tmp_path, capsys):
    """A warm-started run (Corridor, a tiny policy whose warm start teaches it every task's
    reference), ``draco-gym train --before-after``, then the training page's eval line on its final
    checkpoint, same tasks and seed: the same episodes, so the same numbers (on the raw base
    model the same adapter opens doors at chance)."""
    pytest.importorskip("peft")
    from draco_gym.bench.learning_setting import ENV_CONFIG, build_corridor_policy
    from draco_gym.cli import main

    policy = build_corridor_policy(tmp_path / "policy")
    out = tmp_path / "runs" / "quickstart"
    config = tmp_path / "quickstart.yaml"
    config.write_text(json.dumps({
        "name": "quickstart", "output_dir": str(out), "iterations": 1, "seed": 3,
        "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG},
        "policy": {"model": str(policy), "lora": {"r": 8, "alpha": 16}},
        "warm_start": {"epochs": 80, "lr": 1e-2},
        "rollout": {"group_size": 2, "tasks_per_iteration": 1, "max_new_tokens": 8, "max_prompt_tokens": 512,
                    "max_response_tokens": 400, "temperature": 1.0},
        "reward": {"name": "corridor"}, "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
        "eval": {"episodes_per_task": 2, "temperature": 1.0, "score": True},
    }))
    assert main(["train", str(config), "--before-after"]) == 0
    after = json.loads((out / "summary.json").read_text())["eval"]["after"]
    capsys.readouterr()

    args = [str(config) if a == "configs/quickstart.yaml" else a.replace("runs/quickstart", str(out))
            for a in docs_eval_line()]
    assert main(args) == 0  # the line is "draco-gym eval ...": args start with "eval"
    assert "its adapter was trained on" in capsys.readouterr().out
    evaluated = json.loads((out / "eval" / "summary.json").read_text())
    assert evaluated["episodes"] == after["episodes"] == 8
    assert evaluated["success_rate"] == after["success_rate"]["mean"]

    # Another model entirely is refused, naming both.
    from draco_gym.algos.policy.models import build_tiny_llama

    other = build_tiny_llama(tmp_path / "other")
    assert main([*args, "--set", f"policy.model={other}"]) == 2
    assert f"trained on the base model {out / 'warm_start'}, but policy.model is {other}" in capsys.readouterr().err
