"""``draco-gym sft CONFIG.yaml``: a supervised LoRA warm start on the train tasks' reference solutions.

It reads the same run config as ``draco-gym train`` (environment, train tasks, policy model,
LoRA shape), asks the environment for each train task's reference solution
(``env.unwrapped.reference_messages(task_id)``: the assistant messages of a solution), plays
them through the environment so that the tokens are exactly those a rollout would hold,
trains the policy on them (``draco_gym.algos.policy.sft``), one progress line per step with
its loss, and writes the warm-started model, adapter merged, to ``OUTPUT_DIR/warm_start``. It
then samples that policy at the rollout temperature on a few of GRPO's train tasks, several
episodes each, and on a few held-out tasks (``warm_start.check_tasks``,
``warm_start.check_train_episodes``), prints each side's share of turns with a closed,
well-formed code block, the env's success rate, how many train tasks gave both a success and a
failure, and a verdict (``policy.sft.warm_start_verdict``): "ready for GRPO" only when groups
on the train tasks would hold both outcomes and held-out episodes succeed sometimes.
``warm_start.json`` keeps them, ``warm_start/check/rollouts.jsonl`` the episodes behind them
(``draco-gym report OUTPUT_DIR/warm_start/check`` shows them). Train from it with
``--set policy.model=OUTPUT_DIR/warm_start``: GRPO then measures and improves the
warm-started policy, and its KL reference is that policy.
"""

from __future__ import annotations

import argparse
import json
import os
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
    out = Path(os.path.abspath(out or Path(config.output_dir) / "warm_start"))  # printed: any folder can use it
    env = make_env(config.env.id, config.env.config, config.env.modules)
    try:
        grpo_tasks, task_ids = warm_start_tasks(config, env, settings, max_tasks)
        key = {"model": str(model), "env": config.env.id, "env_config": config.env.config, "tasks": task_ids,
               "epochs": settings.epochs, "lr": settings.lr, "batch_size": settings.batch_size,
               "lora": config.policy.lora.model_dump(), "dtype": config.policy.dtype, "seed": config.seed}
        done = out / "warm_start.json"
        if reuse and done.is_file() and json.loads(done.read_text()).get("key") == json.loads(json.dumps(key)):
            print(f"warm start: reusing {out} (same model, tasks and settings)", flush=True)
            check = json.loads(done.read_text()).get("check")
            if check and "train" in check:  # a check saved by this version
                print(check_summary(check), flush=True)
            return out
        chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(model))
        check_turn_budget(config, env, chat, task_ids)
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
                        activation_checkpointing=config.policy.gradient_checkpointing,
                        log=lambda row: print(progress(row, time.time() - t0), flush=True))
    report["seconds"] = round(time.time() - t0, 1)
    report["key"] = key
    print(f"warm-started model in {out} ({report['seconds']} s, {steps} steps, final epoch's loss "
          f"{report['losses'][-1]:.4f})", flush=True)
    if settings.check_tasks:
        report["check"] = check_warm_start(config, out, task_ids, grpo_tasks or task_ids, settings.check_tasks,
                                           settings.check_train_episodes)
    (out / "warm_start.json").write_text(json.dumps(report, indent=1))
    return out


def warm_start_tasks(config, env, settings, max_tasks: int | None = None) -> tuple[list[str], list[str]]:
    """GRPO's train tasks (``env.task_ids``, else every task the env lists) and the warm
    start's (``warm_start.task_ids``, else GRPO's; the first ``max_tasks``)."""
    grpo_tasks = list(config.env.task_ids or getattr(env.unwrapped, "task_ids", None) or [])
    task_ids = list(settings.task_ids or grpo_tasks)[: max_tasks or None]
    if not task_ids:
        raise ValueError(f"{config.env.id} lists no tasks; give warm_start.task_ids or env.task_ids")
    return grpo_tasks, task_ids


def longest_reference_turn(env, chat, task_ids) -> tuple[int, str, int] | None:
    """The longest assistant turn of the tasks' reference solutions in the policy's tokens,
    its end-of-turn token included (what one sampled turn must hold to write it), as
    (tokens, task id, message number from 1); None when no task has a reference."""
    reference = getattr(env.unwrapped, "reference_messages", None)
    longest = None
    for task_id in task_ids if reference is not None else []:
        for k, message in enumerate(reference(task_id) or [], start=1):
            tokens = len(chat.encode(message)) + 1
            if longest is None or tokens > longest[0]:
                longest = (tokens, task_id, k)
    return longest


def check_turn_budget(config, env, chat, task_ids) -> None:
    """A warm start teaches turns the policy then has to write within ``rollout.max_new_tokens``
    tokens a turn: a longer reference turn is cut mid-block when sampled (a malformed reply,
    never the demonstrated one). Raises ``ConfigError`` naming the key, the task and the size."""
    from draco_gym.algos.config import ConfigError

    longest = longest_reference_turn(env, chat, task_ids)
    budget = config.rollout.max_new_tokens
    if longest is not None and longest[0] > budget:
        tokens, task_id, k = longest
        raise ConfigError(f"rollout.max_new_tokens is {budget}, but message {k} of {task_id!r}'s reference solution is "
                         f"{tokens} tokens in the policy's tokenizer (its end-of-turn token included): a sampled turn "
                         f"would be cut before it ends; raise rollout.max_new_tokens to at least {tokens}")


def check_reference_turns(config) -> str:
    """``check_turn_budget`` for ``train --check`` of a config with a warm start: the env built
    and the policy's tokenizer read here. Returns what was checked."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.algos.rllib.env_runner import make_env

    chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(resolve_model(config.policy.model)))
    env = make_env(config.env.id, config.env.config, config.env.modules)
    try:
        task_ids = warm_start_tasks(config, env, config.warm_start)[1]
        check_turn_budget(config, env, chat, task_ids)
        longest = longest_reference_turn(env, chat, task_ids)
    finally:
        env.close()
    if longest is None:
        return "warm start: no task has a reference solution"
    return (f"warm start: the longest reference turn ({longest[1]!r}, message {longest[2]}) is {longest[0]} tokens, "
            f"within rollout.max_new_tokens {config.rollout.max_new_tokens}")


def progress(row: dict, seconds: float) -> str:
    """One line of the warm start's progress (``train_supervised``'s log rows)."""
    if "epoch_loss" in row:
        return f"  epoch {row['epoch']}/{row['epochs']}: mean loss {row['epoch_loss']:.4f} ({seconds:.0f} s)"
    return f"  step {row['step']}/{row['steps']} (epoch {row['epoch']}): loss {row['loss']:.4f} ({seconds:.0f} s)"


def check_tasks(config, trained: list[str], n: int) -> list[str]:
    """The held-out tasks the warm start is checked on: the first ``n`` of ``eval.task_ids``,
    else of the eval environment's tasks not trained on; none when nothing is held out."""
    from draco_gym.algos.cli.before_after import eval_setup

    _, eval_ids = eval_setup(config)
    held_out = [t for t in eval_ids if t not in set(trained)] if config.eval.task_ids is None else list(eval_ids)
    return held_out[:n]


HELD_OUT_EPISODES = 2


def check_warm_start(config, model_dir: Path, trained: list[str], grpo_tasks: list[str], n: int,
                     train_episodes: int) -> dict:
    """Sampled episodes of the warm-started policy at the rollout temperature: ``n`` of GRPO's
    train tasks (a seeded sample of ``grpo_tasks``), ``train_episodes`` each, and ``n``
    held-out tasks, ``HELD_OUT_EPISODES`` each. Prints each side's rates and the verdict
    (``policy.sft.warm_start_verdict``), writes the episodes to ``model_dir/check/rollouts.jsonl``
    (``draco-gym report`` reads it) and returns the rates and the verdict."""
    import random

    from draco_gym.algos.policy.sft import by_task, check_rates, sample_episodes, warm_start_verdict
    from draco_gym.algos.rllib.env_runner import make_env
    from draco_gym.records import append_records
    from draco_gym.types import RolloutRecord

    train_tasks = random.Random(config.seed).sample(grpo_tasks, min(n, len(grpo_tasks)))
    held_out_tasks = check_tasks(config, trained, n)
    print(f"checking the warm-started policy at temperature {config.rollout.temperature}: {len(train_tasks)} of "
          f"GRPO's train tasks x {train_episodes} episodes, " +
          (f"{len(held_out_tasks)} held-out tasks x {HELD_OUT_EPISODES} episodes ..." if held_out_tasks else
           "no held-out tasks (nothing is held out: set eval.task_ids) ..."), flush=True)

    def play(tasks: list[str], episodes: int, env_config: dict) -> list:
        plays = [task for task in tasks for _ in range(episodes)]
        return by_task(sample_episodes(model_dir, lambda: make_env(config.env.id, env_config, config.env.modules),
                                       plays, config.rollout, temperature=config.rollout.temperature,
                                       dtype=config.policy.dtype, seed=config.seed))

    train = play(train_tasks, train_episodes, config.env.config)
    held_out = play(held_out_tasks, HELD_OUT_EPISODES, {**config.env.config, **config.eval.env_config}) \
        if held_out_tasks else []
    episodes = model_dir / "check" / "rollouts.jsonl"
    episodes.parent.mkdir(parents=True, exist_ok=True)
    episodes.unlink(missing_ok=True)
    append_records(episodes, [r.model_dump(mode="json") for g in train + held_out for r in RolloutRecord.of_group(g)])
    check = {"train": check_rates(train), "held_out": check_rates(held_out) if held_out else None,
             "temperature": config.rollout.temperature, "episodes": str(episodes)}
    check["verdict"] = warm_start_verdict(check["train"], check["held_out"])
    print(check_summary(check), flush=True)
    return check


def check_summary(check: dict) -> str:
    """Each side's rates and the verdict, for the terminal."""
    rates = [("closed, well-formed code blocks", "well_formed_turns"), ("env success", "success_rate"),
             ("executed blocks that raised", "raised_blocks")]
    lines = []
    for side, label in (("train", "train tasks"), ("held_out", "held-out tasks")):
        if check.get(side):
            got = check[side]
            lines.append(f"  {label}: " + ", ".join(f"{name} {got[key]['mean']:.2f} ({got[key]['k']}/{got[key]['n']})"
                                                      for name, key in rates))
    mixed = check["train"]["mixed_tasks"]
    lines.append(f"  train tasks whose episodes hold both a success and a failure (a GRPO group on them has an "
                 f"outcome to learn from): {mixed['k']} of {mixed['n']}")
    lines.append(f"  the episodes: {check['episodes']} (draco-gym report {Path(check['episodes']).parent})")
    return "\n".join([*lines, f"warm start check: {check['verdict']}"])
