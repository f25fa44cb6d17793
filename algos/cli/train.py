"""``draco-gym train CONFIG.yaml``: validate, prepare, then run GRPO through Ray Tune.

Order matters for a first run on a fresh machine: the config is validated first (a typo
fails in a second, naming the key), then the model is prepared and the environment built
once in this process (a converted model, an AppWorld runtime set up with visible progress,
environment keyword errors surfacing here), and only then does Ray start.

With a ``warm_start:`` section (``epochs`` > 0) the policy is first fine-tuned on the
environment's reference solutions (``draco_gym.algos.cli.sft.warm_start_from_config``) and
GRPO, and the ``--before-after`` evaluation, start from that model.

Tune runs the algorithm (``draco_gym.algos.rllib.runs.fit``) until a stop criterion holds
(``iterations``, or any of ``stop:``): it writes the TensorBoard event files and checkpoints,
and feeds the trackers of ``logging:``; the run adds one progress line per iteration,
``metrics.jsonl`` and the plots, and this command a copy of the final checkpoint at
``OUTPUT_DIR/checkpoint`` for ``draco-gym eval``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (every key: python -m draco_gym.algos.config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set rollout.group_size=4 (repeatable)")
    parser.add_argument("--iterations", type=int, help="override the number of iterations")
    parser.add_argument("--output-dir", help="override output_dir")
    parser.add_argument("--resume", metavar="CHECKPOINT",
                        help="continue from a checkpoint (adapter, optimizer, iteration count) up to `iterations`")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("--before-after", action="store_true",
                        help="evaluate the policy on the eval tasks before and after training; write OUTPUT_DIR/summary.json")


def run(args: argparse.Namespace) -> int:
    from draco_gym.algos.config import ConfigError, load_config

    overrides = list(args.set)
    if args.iterations is not None:
        overrides.append(f"iterations={args.iterations}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        try:
            check_task_ids(config)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.config}: ok")
        return 0
    if args.resume and not Path(args.resume).is_dir():
        print(f"error: --resume {args.resume}: no such checkpoint directory", file=sys.stderr)
        return 2
    from draco_gym.algos.memory import TreeMemory

    with TreeMemory() as memory:
        code = warm_start_then_train(config, args)
    print(memory.report(), flush=True)
    out = Path(config.output_dir)
    if out.is_dir():
        (out / "memory.json").write_text(json.dumps(memory.summary(), indent=1))
    return code


def warm_start_then_train(config, args: argparse.Namespace) -> int:
    """The warm start (``warm_start:``), the before evaluation (``--before-after``), GRPO and
    the after evaluation, in order."""
    if config.warm_start.epochs:
        try:
            model = in_child_process(warm_start_from_config, config)
        except (ValueError, FileNotFoundError) as exc:
            print(f"error: warm_start: {exc}", file=sys.stderr)
            return 2
        config = config.model_copy(update={"policy": config.policy.model_copy(update={"model": str(model.resolve())})})
    if not args.before_after:
        return train(config, resume=args.resume)
    from draco_gym.algos.cli.before_after import evaluate_policy, table, write_summary

    print("evaluating the policy before training ...", flush=True)
    before = evaluate_policy(config, args.resume)
    code = train(config, resume=args.resume)
    if code:
        return code
    print("evaluating the trained policy ...", flush=True)
    out = Path(config.output_dir)
    after = evaluate_policy(config, out / "checkpoint")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = write_summary(out, before, after, rows)
    print(table(before, after))
    for note in summary["notes"]:
        print(note)
    print(f"summary: {out / 'summary.json'}", flush=True)
    return 0


def warm_start_from_config(config):
    from draco_gym.algos.cli.sft import warm_start_from_config as warm_start

    return warm_start(config)


def in_child_process(function, *args):
    """``function(*args)`` in a fresh process, its result or exception returned here: the
    warm start's model, optimizer and check leave with the process instead of staying in
    this one's heap for the rest of the run (Ray's actors hold the policy from then on)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def check_task_ids(config) -> None:
    """Every task id the config names (``env.task_ids``, ``warm_start.task_ids``,
    ``eval.task_ids``) is one its environment knows, checked by building the environment
    (the eval environment for ``eval.task_ids``); ``ConfigError`` names the key and the id."""
    from draco_gym.algos.config import ConfigError
    from draco_gym.algos.rllib.env_runner import env_source
    from draco_gym.registration import EnvSourceError

    eval_env = {**config.env.config, **config.eval.env_config}
    for key, ids, env_config in (("env.task_ids", config.env.task_ids, config.env.config),
                                 ("warm_start.task_ids", config.warm_start.task_ids, config.env.config),
                                 ("eval.task_ids", config.eval.task_ids, eval_env)):
        if ids:
            try:
                env_source(config.env.id, env_config, config.env.modules, ids)
            except EnvSourceError as exc:
                raise ConfigError(f"{key}: {str(exc).removeprefix('task_ids: ')}") from None


def train(config, resume: str | None = None) -> int:
    from draco_gym.algos.cli.prepare import prepare
    from draco_gym.algos.config import ConfigError
    from draco_gym.algos.evaluation import no_update_note
    from draco_gym.algos.rllib.grpo import ADAPTER_DIR, GRPOConfig
    from draco_gym.algos.rllib.runs import ProgressCallback, fit

    out = Path(config.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if resume is None:  # a resumed run appends to its metrics and rollouts
        for stale in ("metrics.jsonl", "rollouts.jsonl"):
            (out / stale).unlink(missing_ok=True)
    try:
        task_ids = prepare(config, task_ids=config.env.task_ids)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    algo_config = GRPOConfig.from_run_config(config, output_dir=str(out)).training(
        task_ids=task_ids, restore_from=str(Path(resume).resolve()) if resume else None)
    progress = ProgressCallback(out, config.iterations)
    print(f"training {config.name}: {config.iterations} iterations x {config.rollout.tasks_per_iteration} tasks x "
          f"G={config.rollout.group_size} on {len(task_ids)} tasks; output in {out}", flush=True)
    t0 = time.time()
    try:
        results = fit(config, algo_config, progress, out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if results.errors:
        for err in results.errors:
            print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    result = results[0]
    final = out / "checkpoint"
    if result.checkpoint is not None:
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(result.checkpoint.path, final)
    print(f"done in {time.time() - t0:.0f}s after {result.metrics.get('training_iteration')} iterations: "
          f"checkpoint {final} (LoRA adapter: {final / ADAPTER_DIR}), metrics {out / 'metrics.jsonl'}, plots {out / 'plots'}, "
          f"rollouts {out / 'rollouts.jsonl'}, TensorBoard: tensorboard --logdir {out / 'tune'}", flush=True)
    note = no_update_note(progress.rows)
    if note:
        print(note, flush=True)
    return 0
