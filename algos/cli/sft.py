"""``draco-gym sft CONFIG.yaml``: a supervised LoRA warm start on the train tasks' reference solutions.

It reads the same run config as ``draco-gym train`` (environment, train tasks, policy model,
LoRA shape), asks the environment for each train task's reference solution
(``env.unwrapped.reference_messages(task_id)``: the assistant messages of a solution), plays
them through the environment so that the tokens are exactly those a rollout would hold,
trains the policy on them (``draco_gym.algos.policy.sft``), one progress line per step with
its loss, and writes the warm-started model, adapter merged, to ``OUTPUT_DIR/warm_start``. It
then tries that policy on a few held-out tasks (``warm_start.check_tasks``: sampled episodes
at the rollout temperature) and prints the share of turns with a closed, well-formed code
block, the env's success rate and a verdict, "ready for GRPO" or "too weak: more epochs or a
larger model" (``policy.sft.warm_start_verdict``); ``warm_start.json`` keeps them. Train from it with
``--set policy.model=OUTPUT_DIR/warm_start``: GRPO then measures and improves the
warm-started policy, and its KL reference is that policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (the one you will train with)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--out", help="where the warm-started model goes (default: OUTPUT_DIR/warm_start)")
    parser.add_argument("--epochs", type=int, help="default: the config's warm_start.epochs, or 3 where that is 0")
    parser.add_argument("--lr", type=float, help="default: the config's warm_start.lr")
    parser.add_argument("--batch-size", type=int, help="default: the config's warm_start.batch_size")
    parser.add_argument("--max-tasks", type=int, help="use only the first N train tasks")


def demonstrations(env, chat, task_ids, *, max_prompt_tokens: int | None = None):
    """One ``Demonstration`` per task that has a reference solution; the tasks without one
    are returned apart, so the caller can say which."""
    from draco_gym.algos.policy.sft import demonstration

    reference = getattr(env.unwrapped, "reference_messages", None)
    if reference is None:
        raise ValueError(f"{type(env.unwrapped).__name__} has no reference solutions "
                         "(reference_messages(task_id)); a warm start needs demonstrations")
    out, missing = [], []
    for task_id in task_ids:
        messages = reference(task_id)
        if not messages:
            missing.append(task_id)
            continue
        out.append(demonstration(env, chat, task_id, messages, max_prompt_tokens=max_prompt_tokens))
    return out, missing


def run(args: argparse.Namespace) -> int:
    from draco_gym.algos.config import ConfigError, load_config

    try:
        config = load_config(args.config, list(args.set))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    given = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size}
    settings = config.warm_start.model_copy(update={k: v for k, v in given.items() if v is not None})
    if args.epochs is None and settings.epochs == 0:
        settings = settings.model_copy(update={"epochs": 3})
    if settings.epochs < 1 or settings.lr <= 0 or settings.batch_size < 1:
        print("error: --epochs and --batch-size must be >= 1 and --lr > 0", file=sys.stderr)
        return 2
    try:
        out = warm_start_from_config(config, settings, out=args.out, max_tasks=args.max_tasks, reuse=False)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"train from it with --set policy.model={out}", flush=True)
    return 0


def warm_start_from_config(config, settings=None, *, out: str | Path | None = None, max_tasks: int | None = None,
                           reuse: bool = True) -> Path:
    """Warm-start ``config``'s policy on its environment's reference solutions (``settings``:
    a ``WarmStartSection``, default ``config.warm_start``) and return the model directory,
    ``OUTPUT_DIR/warm_start`` unless ``out`` is given. With ``reuse``, a directory already
    warm-started from the same model, tasks and settings is returned as it is (a rerun or
    ``--resume`` of the same config does not train it again). Raises ``ValueError`` naming
    what is wrong (no tasks, no reference solutions, a reference that does not fit the env)."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.rllib.env_runner import make_env
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.algos.policy.sft import warm_start

    settings = settings or config.warm_start
    model = resolve_model(config.policy.model)
    out = Path(out or Path(config.output_dir) / "warm_start")
    env = make_env(config.env.id, config.env.config, config.env.modules)
    try:
        task_ids = list(settings.task_ids or config.env.task_ids or getattr(env.unwrapped, "task_ids", None) or [])
        if max_tasks:
            task_ids = task_ids[:max_tasks]
        if not task_ids:
            raise ValueError(f"{config.env.id} lists no tasks; give warm_start.task_ids or env.task_ids")
        key = {"model": str(model), "env": config.env.id, "env_config": config.env.config, "tasks": task_ids,
               "epochs": settings.epochs, "lr": settings.lr, "batch_size": settings.batch_size,
               "lora": config.policy.lora.model_dump(), "dtype": config.policy.dtype, "seed": config.seed}
        done = out / "warm_start.json"
        if reuse and done.is_file() and json.loads(done.read_text()).get("key") == json.loads(json.dumps(key)):
            print(f"warm start: reusing {out} (same model, tasks and settings)", flush=True)
            check = json.loads(done.read_text()).get("check")
            if check:
                print(check_summary(check), flush=True)
            return out
        chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(model))
        examples, missing = demonstrations(env, chat, task_ids, max_prompt_tokens=config.rollout.max_prompt_tokens)
    finally:
        env.close()
    if missing:
        print(f"{len(missing)} of {len(task_ids)} tasks have no reference solution, e.g. {missing[:3]}")
    if not examples:
        raise ValueError("no demonstrations to train on")
    steps = -(-len(examples) // settings.batch_size) * settings.epochs
    print(f"warm start of {config.policy.model} on {len(examples)} reference solutions of {config.env.id}: "
          f"{settings.epochs} epochs x {-(-len(examples) // settings.batch_size)} steps (batch {settings.batch_size}), "
          f"lr {settings.lr}, {sum(e.n_policy_tokens for e in examples)} policy tokens", flush=True)
    t0 = time.time()
    report = warm_start(model, examples, out, lora=config.policy.lora.model_dump(), epochs=settings.epochs,
                        lr=settings.lr, batch_size=settings.batch_size, dtype=config.policy.dtype, seed=config.seed,
                        log=lambda row: print(progress(row, time.time() - t0), flush=True))
    report["seconds"] = round(time.time() - t0, 1)
    report["key"] = key
    print(f"warm-started model in {out} ({report['seconds']} s, {steps} steps, final epoch's loss "
          f"{report['losses'][-1]:.4f})", flush=True)
    if settings.check_tasks:
        report["check"] = check_warm_start(config, out, task_ids, settings.check_tasks)
    (out / "warm_start.json").write_text(json.dumps(report, indent=1))
    return out


def progress(row: dict, seconds: float) -> str:
    """One line of the warm start's progress (``train_supervised``'s log rows)."""
    if "epoch_loss" in row:
        return f"  epoch {row['epoch']}/{row['epochs']}: mean loss {row['epoch_loss']:.4f} ({seconds:.0f} s)"
    return f"  step {row['step']}/{row['steps']} (epoch {row['epoch']}): loss {row['loss']:.4f} ({seconds:.0f} s)"


def check_tasks(config, trained: list[str], n: int) -> tuple[list[str], bool]:
    """The tasks the warm start is checked on: the first ``n`` of ``eval.task_ids``, else of
    the eval environment's tasks not trained on; the train tasks when nothing is held out
    (the bool says whether the tasks are held out)."""
    from draco_gym.algos.cli.before_after import eval_setup

    _, eval_ids = eval_setup(config)
    held_out = [t for t in eval_ids if t not in set(trained)] if config.eval.task_ids is None else list(eval_ids)
    return (held_out[:n], True) if held_out else (trained[:n], False)


def check_warm_start(config, model_dir: Path, trained: list[str], n: int) -> dict:
    """Sampled episodes of a few held-out tasks with the warm-started policy
    (``policy.sft.check_policy``); prints the rates and the verdict, returns them."""
    from draco_gym.algos.policy.sft import check_policy
    from draco_gym.algos.rllib.env_runner import make_env

    tasks, held_out = check_tasks(config, trained, n)
    env_config = {**config.env.config, **config.eval.env_config}
    where = "held-out tasks" if held_out else "train tasks (nothing is held out: set eval.task_ids)"
    print(f"checking the warm-started policy on {len(tasks)} {where}, 2 episodes each at temperature "
          f"{config.rollout.temperature} ...", flush=True)
    check = check_policy(model_dir, lambda: make_env(config.env.id, env_config, config.env.modules), tasks,
                         config.rollout, temperature=config.rollout.temperature,
                         dtype=config.policy.dtype, seed=config.seed)
    check["held_out"] = held_out
    print(check_summary(check), flush=True)
    return check


def check_summary(check: dict) -> str:
    """The check's rates and its verdict, for the terminal."""
    rates = [("closed, well-formed code blocks", check["well_formed_turns"]),
             ("env success", check["success_rate"]), ("executed blocks that raised", check["raised_blocks"])]
    lines = [f"  {name}: {rate['mean']:.2f} ({rate['k']}/{rate['n']})" for name, rate in rates]
    return "\n".join([*lines, f"warm start check: {check['verdict']}"])
