"""``draco-gym train CONFIG.yaml``: validate, prepare, then run GRPO through Ray Tune.

Order matters for a first run on a fresh machine, and for the run a folder already holds:
the config is validated first (a typo fails in a second, naming the key), then the model and
its tokenizer are prepared and the environment built once in this process (a converted
model, an AppWorld runtime set up with visible progress, environment keyword errors surfacing
here, each naming its key), and only then is anything in the output folder touched and does
Ray start. A folder that holds an earlier run is left alone unless the command says what to
do with it: ``--resume`` (continue it from its newest complete checkpoint, every log cut at
that checkpoint's iteration, ``run_folder.continue_logs``) or ``--overwrite`` (replace it).

With a ``warm_start:`` section (``epochs`` > 0) the policy is first fine-tuned on the
environment's reference solutions (``draco_gym.algos.cli.sft.warm_start_from_config``) and
GRPO, and the ``--before-after`` evaluation, start from that model.

Tune runs the algorithm (``draco_gym.algos.rllib.runs.fit``) until a stop criterion holds
(``iterations``, or any of ``stop:``): it writes the TensorBoard event files and checkpoints,
and feeds the trackers of ``logging:``; the run adds one progress line per iteration,
``metrics.jsonl`` and the plots, and this command a copy of the final checkpoint at
``OUTPUT_DIR/checkpoint`` for ``draco-gym eval`` (copied beside it and renamed into place:
``checkpoints.copy_checkpoint``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from draco_gym.records import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (every key: python -m draco_gym.algos.config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set rollout.group_size=4 (repeatable)")
    parser.add_argument("--iterations", type=int, help="override the number of iterations")
    parser.add_argument("--output-dir", help="override output_dir")
    parser.add_argument("--resume", nargs="?", const="", metavar="CHECKPOINT",
                        help="continue up to `iterations` from a checkpoint (adapter, optimizer, iteration count): "
                             "the one given, or the newest complete one under a folder; alone, under output_dir. "
                             "Every log continues after the checkpoint's iteration; what came after it is moved "
                             "to OUTPUT_DIR/set-aside/")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the run output_dir already holds (its logs, checkpoints, tune/); without "
                             "it, or --resume, such a folder is an error")
    parser.add_argument("--check", action="store_true",
                        help="validate the config, resolve the model and its tokenizer, build the environment "
                             "once and probe a judge server, then exit")
    parser.add_argument("--before-after", action="store_true",
                        help="evaluate the policy on the eval tasks before and after training; write OUTPUT_DIR/summary.json")


def run(args: argparse.Namespace) -> int:
    from draco_gym.algos.checkpoints import CheckpointError, resume_point
    from draco_gym.algos.cli.prepare import prepare, probe_judge
    from draco_gym.algos.cli.sft import check_reference_turns
    from draco_gym.algos.config import ConfigError, load_config
    from draco_gym.algos.run_folder import previous_run

    overrides = list(args.set)
    if args.iterations is not None:
        overrides.append(f"iterations={args.iterations}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        return _error(exc)
    if not args.check:
        from draco_gym.algos.rllib.session import RaySessionOpen, require_no_ray_session

        try:  # before the warm start's minutes, not when Tune is about to start
            require_no_ray_session("draco-gym train")
        except RaySessionOpen as exc:
            return _error(exc)
    out = Path(config.output_dir).resolve()
    resume = None
    if args.resume is not None and not args.check:
        if args.overwrite:
            return _error("--resume continues the run in output_dir and --overwrite replaces it: give one")
        try:
            choice = resume_point(args.resume or out)
        except CheckpointError as exc:
            return _error(f"--resume: {exc}")
        print(f"resuming from {choice.describe()}", flush=True)
        resume = choice.checkpoint
    elif not args.check and not args.overwrite and previous_run(out):
        return _error(f"{out} holds an earlier run ({', '.join(previous_run(out))}): continue it with --resume, "
                      "replace it with --overwrite, or give another --output-dir")
    try:
        task_ids = prepare(config, task_ids=config.env.task_ids)
        if args.check:
            print(probe_judge(config), flush=True)
    except ConfigError as exc:
        return _error(exc)
    if args.check:
        from draco_gym.algos.cli.reward_check import outcome_blind_warning

        try:
            check_task_ids(config)
            if config.warm_start.epochs:
                print(check_reference_turns(config), flush=True)
            warning = outcome_blind_warning(config)
        except ConfigError as exc:
            return _error(exc)
        except ValueError as exc:
            return _error(f"warm_start: {exc}")
        if warning:
            print(warning, flush=True)
        print(f"{config.env.id}: {len(task_ids)} tasks; model {config.policy.model}: config and tokenizer read")
        print(f"{args.config}: ok")
        return 0
    from draco_gym.algos.memory import TreeMemory

    with TreeMemory() as memory:
        code = warm_start_then_train(config, args, task_ids, resume)
    print(memory.report(), flush=True)
    out = Path(config.output_dir)
    if out.is_dir():
        write_json(out / "memory.json", memory.summary())
    return code


def warm_start_then_train(config, args: argparse.Namespace, task_ids: list[str], resume) -> int:
    """The warm start (``warm_start:``), the before evaluation (``--before-after``), GRPO and
    the after evaluation, in order; ``resume`` is the checkpoint ``--resume`` chose (or None)."""
    from draco_gym.algos.config import ConfigError

    out = Path(config.output_dir).resolve()
    if config.warm_start.epochs:
        try:
            model = in_child_process(warm_start_from_config, config)
        except (ValueError, FileNotFoundError) as exc:
            return _error(f"warm_start: {exc}")
        config = config.model_copy(update={"policy": config.policy.model_copy(update={"model": str(model.resolve())})})
    if not args.before_after:
        return train(config, task_ids, resume=resume, overwrite=args.overwrite)
    from draco_gym.algos.cli.before_after import evaluate_policy, table, write_summary
    from draco_gym.records import read_records

    print("evaluating the policy before training ...", flush=True)
    try:
        before = in_child_process(evaluate_policy, config, resume.path if resume else None)
    except ConfigError as exc:
        return _error(exc)
    rate = before["success_rate"]
    print(f"before training: success rate {rate['mean']:.3f} [{rate['ci95'][0]:.2f}, {rate['ci95'][1]:.2f}] "
          f"over {before['episodes']} held-out episodes", flush=True)
    code = train(config, task_ids, resume=resume, overwrite=args.overwrite)
    if code:
        return code
    print("evaluating the trained policy ...", flush=True)
    after = in_child_process(evaluate_policy, config, out / "checkpoint")
    summary = write_summary(out, before, after, read_records(out / "metrics.jsonl")[0])
    print(table(before, after))
    for note in summary["notes"]:
        print(note)
    print(f"summary: {out / 'summary.json'}", flush=True)
    return 0


def warm_start_from_config(config):
    from draco_gym.algos.cli.sft import warm_start_from_config as warm_start

    return warm_start(config)


def in_child_process(function, config, *args):
    """``function(config, *args)`` in a fresh process started on ``config.resources.allocator``,
    its result or exception returned here: the warm start's model and optimizer, and the before
    evaluation's policy and learner (an Algorithm built in the calling process), leave with the
    process instead of staying in this one's heap for the rest of the run (Ray's actors hold the
    policy from then on)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from draco_gym.algos.memory import allocator_env, set_environ, started_with

    env = allocator_env(config.resources.allocator)
    # the child puts the variables back first: the Ray it starts keeps the C library's
    # allocator in its own processes, like the command's (its workers get mimalloc from start_ray)
    ours = {name: os.environ.get(name) for name in env}
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=set_environ, initargs=(ours,)) as pool:
        with started_with(env):
            future = pool.submit(function, config, *args)  # starts the process
        return future.result()


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


def _error(message) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def train(config, task_ids: list[str], *, resume=None, overwrite: bool = False) -> int:
    """Tune's run of a checked config: ``resume`` (a complete ``checkpoints.Checkpoint``)
    continues from it, every log cut at its iteration; ``overwrite`` first clears an earlier
    run out of the output folder. The final checkpoint is copied to ``OUTPUT_DIR/checkpoint``."""
    from draco_gym.algos.checkpoints import copy_checkpoint
    from draco_gym.algos.config import ConfigError
    from draco_gym.algos.evaluation import credit_note, no_update_note
    from draco_gym.algos.rllib.grpo import ADAPTER_DIR, GRPOConfig
    from draco_gym.algos.rllib.runs import ProgressCallback, fit
    from draco_gym.algos.run_folder import clear_previous_run, continue_logs
    from draco_gym.records import RecordError

    out = Path(config.output_dir).resolve()
    if resume is not None:
        try:
            continued = continue_logs(out, resume.iteration)
        except RecordError as exc:
            return _error(exc)
        print(f"resume: {continued.describe()}", flush=True)
        for note in continued.notes:
            print(f"note: {note}", file=sys.stderr)
    elif overwrite:
        removed = clear_previous_run(out)
        if removed:
            print(f"--overwrite: removed the earlier run's {', '.join(removed)} from {out}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    algo_config = GRPOConfig.from_run_config(config, output_dir=str(out)).training(
        task_ids=task_ids, restore_from=str(resume.path) if resume else None)
    progress = ProgressCallback(out, config.iterations)
    print(f"training {config.name}: {config.iterations} iterations x {config.rollout.tasks_per_iteration} tasks x "
          f"G={config.rollout.group_size} on {len(task_ids)} tasks; output in {out}", flush=True)
    t0 = time.time()
    try:
        results = fit(config, algo_config, progress, out)
    except ConfigError as exc:
        return _error(exc)
    if results.errors:
        for err in results.errors:
            print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    result = results[0]
    final = out / "checkpoint"
    if result.checkpoint is not None:
        copy_checkpoint(result.checkpoint.path, final)
    print(f"done in {time.time() - t0:.0f}s after {result.metrics.get('training_iteration')} iterations: "
          f"checkpoint {final} (LoRA adapter: {final / ADAPTER_DIR}), metrics {out / 'metrics.jsonl'}, plots {out / 'plots'}, "
          f"rollouts {out / 'rollouts.jsonl'}, TensorBoard: tensorboard --logdir {out / 'tune'}", flush=True)
    for note in (credit_note(progress.rows), no_update_note(progress.rows)):
        if note:
            print(note, flush=True)
    return 0
