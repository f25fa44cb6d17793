"""``draco-gym eval CONFIG.yaml --checkpoint PATH``: the policy on a task split, no update.

Runs ``eval.episodes_per_task`` episodes (n) of every evaluation task (greedy by default)
and reports the environment's success rate, pass@k and pass^k for k = 1..n (pass^k: all k
of k runs succeed, tau-bench's consistency metric), termination modes and turns; on AppWorld
also SGC (every task of a scenario solved); with ``eval.score: true`` the reward's mean. It
prints the rates of ``draco-gym train --before-after``'s table (``rates``: success, well-formed
turns, raised blocks, and the rubric pass rate when scored), each with its 95% interval.

The paper's protocol is three settings of the same command: n = 3 runs per task
(``eval.episodes_per_task: 3``), the normal and challenge splits apart where the data has
them (``eval.splits: [test_normal, test_challenge]``; a split the data lacks is skipped and
recorded under ``skipped_splits``), and the mean over the run's last three checkpoints
(``--checkpoint last`` with ``eval.last_checkpoints: 3``; ``--checkpoint`` also repeats).
Then ``summary.json`` holds ``splits.<split>.checkpoints.<checkpoint>`` (each run's metrics)
and ``splits.<split>.mean`` (each metric's mean over the checkpoints); a single split and
checkpoint also keeps its metrics at the top level.

A checkpoint runs on the base model its adapter was trained on (PEFT's ``adapter_config.json``
names it: after a warm start, ``OUTPUT_DIR/warm_start``), which the config's ``policy.model``
must be, or have been warm-started into; another base is refused, naming both.

Writes ``OUTPUT_DIR/eval/summary.json`` and every episode to ``OUTPUT_DIR/eval/rollouts.jsonl``
(one run) or ``rollouts-<split>-<checkpoint>.jsonl`` (several). ``--checkpoint base``
evaluates the base model (adapter at its zero start).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draco_gym.algos.evaluation import episode_summary, eval_summary, mean_summary, paired_clause, rates_table
from draco_gym.metrics import difference
from draco_gym.records import write_json

BASE = "base"
LAST = "last"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (the eval: section applies)")
    parser.add_argument("--checkpoint", required=True, action="append",
                        help="a checkpoint directory written by draco-gym train, 'base' for the base model, or "
                             "'last' for the run's last eval.last_checkpoints checkpoints; repeatable: each split's "
                             "metrics are then averaged over the checkpoints")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--output-dir", help="where eval/ goes (default: the config's output_dir)")


def last_checkpoints(output_dir: str | Path, n: int) -> list[Path]:
    """The run's last ``n`` complete checkpoints by iteration, oldest first, as Tune keeps them
    (``OUTPUT_DIR/tune/<trial>/checkpoint_<i>``; ``checkpoint.keep`` must be >= n); an
    incomplete one (a save cut short) is passed over with a note."""
    from draco_gym.algos.checkpoints import CheckpointError, checkpoint_dirs, require_complete

    root = Path(output_dir) / "tune"
    complete = []
    for path in checkpoint_dirs(root):
        try:
            complete.append(require_complete(path))
        except CheckpointError as exc:
            if not path.name.startswith("."):
                print(f"note: {exc}; passed over", file=sys.stderr)
    if not complete:
        raise ValueError(f"no complete checkpoints under {root}: train the run first, or give --checkpoint PATH")
    complete.sort(key=lambda c: (c.iteration, c.path.parent.name, c.path.name))
    if len(complete) < n:
        print(f"note: eval.last_checkpoints is {n} but {root} keeps {len(complete)}; averaging over those "
              "(keep more with checkpoint.keep)", file=sys.stderr)
    return [c.path for c in complete[-n:]]


def resolve_checkpoints(given: list[str], output_dir: str | Path, last: int) -> list[str]:
    """``--checkpoint`` values as paths (or ``base``), ``last`` expanded, duplicates once, the
    base model first (it is evaluated before any adapter is restored). A path must be a
    complete checkpoint (``CheckpointError``, a ``ValueError``, names what it lacks)."""
    from draco_gym.algos.checkpoints import require_complete

    out: list[str] = []
    for item in given:
        if item == BASE:
            paths = [BASE]
        elif item == LAST:
            paths = [str(p.resolve()) for p in last_checkpoints(output_dir, last)]
        else:
            path = Path(item)
            if not path.is_dir():
                raise ValueError(f"--checkpoint {item}: no such directory")
            paths = [str(require_complete(path).path.resolve())]
        out += [p for p in paths if p not in out]
    return sorted(out, key=lambda p: p != BASE)


def _label(checkpoint: str) -> str:
    return BASE if checkpoint == BASE else f"{Path(checkpoint).parent.name}/{Path(checkpoint).name}"


def run(args: argparse.Namespace) -> int:
    from draco_gym.algos.config import ConfigError, load_config
    from draco_gym.algos.cli.prepare import prepare

    overrides = list(args.set) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ev = config.eval
    from draco_gym.algos.rllib.session import RaySessionOpen, require_no_ray_session

    try:
        require_no_ray_session("draco-gym eval")
        checkpoints = resolve_checkpoints(args.checkpoint, config.output_dir, ev.last_checkpoints)
    except (ValueError, RaySessionOpen) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from draco_gym.algos.rllib.runs import checkpoint_model

    try:  # each adapter's base model, checked here, before Ray starts
        for checkpoint in checkpoints:
            checkpoint_model(config, None if checkpoint == BASE else checkpoint)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plans, skipped = [], {}
    for split in ev.splits or [None]:
        env_config = {**config.env.config, **ev.env_config, **({"split": split} if split else {})}
        try:
            task_ids = prepare(config, env_config=env_config, task_ids=ev.task_ids)
        except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError) as exc:
            if split is None:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            skipped[split] = f"{type(exc).__name__}: {exc}"
            print(f"note: split {split!r} skipped, the data lacks it ({skipped[split]})", file=sys.stderr)
            continue
        plans.append((split, env_config, task_ids[: ev.max_tasks] if ev.max_tasks else task_ids))
    if not plans:
        print(f"error: none of eval.splits {ev.splits} could be evaluated: {skipped}", file=sys.stderr)
        return 2

    out = Path(config.output_dir).resolve() / "eval"
    out.mkdir(parents=True, exist_ok=True)
    single = len(plans) == 1 and len(checkpoints) == 1
    for stale in out.glob("rollouts*.jsonl"):
        stale.unlink()
    splits = {}
    for split, env_config, task_ids in plans:
        name = split or "default"
        runs = _evaluate(config, env_config, task_ids, checkpoints, out, name, single)
        splits[name] = {"tasks": len(task_ids), "checkpoints": runs, "mean": mean_summary(list(runs.values()))}
    summary: dict = {"checkpoints": [_label(c) for c in checkpoints], "env": config.env.id,
                     "protocol": {"episodes_per_task": ev.episodes_per_task, "temperature": ev.temperature,
                                  "splits": [s for s, _, _ in plans]}}
    if skipped:
        summary["skipped_splits"] = skipped
    if single:
        summary.update(checkpoint=args.checkpoint[0], **next(iter(next(iter(splits.values()))["checkpoints"].values())))
    summary["splits"] = splits
    write_json(out / "summary.json", summary)
    for name, split in splits.items():
        print(evaluation_table(name, split))
    print(f"summary: {out / 'summary.json'}", flush=True)
    return 0


def evaluation_table(split: str, figures: dict) -> str:
    """What ``draco-gym train --before-after`` prints, a column per checkpoint: each rate with
    its 95% interval (``rates``), then pass@k and pass^k, turns and the reward's mean, and
    with several checkpoints their mean."""
    runs = figures["checkpoints"]
    keys = [k for k in next(iter(runs.values())) if k.startswith(("pass@", "pass^")) or k in ("sgc", "turns_mean",
                                                                                             "reward_mean")]
    more = [(key, [f"{run[key]:.3f}" if key in run else "-" for run in runs.values()]) for key in keys]
    lines = [rates_table({label: run["rates"] for label, run in runs.items()}, f"{split} evaluation", more)]
    if len(runs) > 1:
        mean = figures["mean"]
        lines.append(f"mean over the {len(runs)} checkpoints: " + ", ".join(
            f"{k} {mean[k]:.3f}" for k in ("success_rate", *keys) if k in mean))
        lines += versus_first(runs)
    return "\n".join(lines)


def versus_first(runs: dict[str, dict]) -> list[str]:
    """Each later checkpoint's success rate against the first's, with the difference's 95%
    interval: paired, since one seed meets the same episodes in every checkpoint
    (``draco_gym.metrics.difference``), e.g. ``--checkpoint base --checkpoint RUN/checkpoint``
    for a run's gain, or two runs' checkpoints for the one against the other."""
    (first, head), *rest = runs.items()
    lines = []
    for label, run in rest:
        b, a = head["rates"]["success_rate"], run["rates"]["success_rate"]
        diff = difference(b, a)
        lo, hi = diff["ci95"]
        line = (f"success_rate {label} - {first}: {diff['delta']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]"
                + paired_clause(diff, f"in {label}", f"in {first}"))
        lines.append(line + ("; holds zero: no difference seen" if lo <= 0 <= hi else "; excludes zero"))
    return lines


def _evaluate(config, env_config: dict, task_ids: list[str], checkpoints: list[str], out: Path, split: str,
              single: bool) -> dict[str, dict]:
    """Every checkpoint on one split, on one algorithm (its env runners built once)."""
    from draco_gym.algos.rllib.reporting import RolloutLog
    from draco_gym.algos.rllib.runs import checkpoint_rollouts

    ev = config.eval
    config = config.model_copy(update={"env": config.env.model_copy(update={"config": env_config})})
    scenarios = "AppWorld" in config.env.id

    def announce(checkpoint) -> None:
        print(f"evaluating {_label(checkpoint or BASE)} on {split}: {len(task_ids)} tasks x "
              f"{ev.episodes_per_task} episodes (temperature {ev.temperature})", flush=True)

    runs: dict[str, dict] = {}
    for checkpoint, groups in checkpoint_rollouts(config, task_ids, [None if c == BASE else c for c in checkpoints],
                                                  group_size=ev.episodes_per_task, temperature=ev.temperature,
                                                  score=ev.score, seed=config.seed, announce=announce):
        label = _label(checkpoint or BASE)
        runs[label] = {**eval_summary(groups, ev.success_metric, scenarios=scenarios),
                       "rates": episode_summary(groups, ev.success_metric)}
        name = "rollouts.jsonl" if single else f"rollouts-{split}-{label.replace('/', '-')}.jsonl"
        RolloutLog(out / name).write(groups)
    return runs
