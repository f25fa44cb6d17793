"""Whole runs on Ray from a validated ``RunConfig``: training through Tune, and rollouts of
checkpoints for evaluation. The commands (``algos/cli``) call these and do the talking.

``fit`` runs the algorithm through ``tune.Tuner("GRPO", param_space=config)`` until a stop
criterion holds (``iterations``, or any of ``stop:``): Tune writes the TensorBoard event
files and checkpoints and feeds the trackers of ``logging:`` (its own W&B and MLflow
callbacks); the algorithm writes ``metrics.jsonl`` and the plots (``reporting.MetricsLog``)
and ``ProgressCallback`` prints one progress line per iteration.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import ray
from ray import tune

from draco_gym.algos.config import ConfigError, RunConfig
from draco_gym.algos.policy.models import BaseModelMismatch, base_for_adapter, resolve_model
from draco_gym.algos.rllib.grpo import ADAPTER_DIR, GRPOConfig
from draco_gym.algos.rllib.reporting import NOTE_KEY, compact, print_line, progress_line, run_alarms, tracker_callbacks
from draco_gym.algos.rllib.session import start_ray


class ProgressCallback(tune.Callback):
    """One progress line per result, the iteration's notes under it (``NOTE_KEY``), and the
    run's plots copied into the trial folder, where a tracker that uploads it finds them. The
    trial itself writes ``metrics.jsonl`` and the plots (``GRPO.train``); ``rows`` keeps the
    lines' rows for the command's closing notes."""

    def __init__(self, output_dir: str | Path, total_iterations: int | None = None, echo=print_line) -> None:
        self.plots = Path(output_dir) / "plots"
        self.total = total_iterations
        self.echo = echo
        self.rows: list[dict] = []
        self.warned: set[str] = set()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        row = compact(result)
        self.rows.append(row)
        if self.echo:
            self.echo(progress_line(row, self.total))
            # The trial's own warnings stay in its worker's log: the console hears each alarm here, once.
            for name, warning in run_alarms(self.rows).items():
                if name not in self.warned:
                    self.warned.add(name)
                    self.echo(f"warning: {warning}")
            for line in (result.get(NOTE_KEY) or "").splitlines():  # e.g. a judge that answered nothing
                self.echo(line)
        target = getattr(trial, "local_path", None)
        if target is not None and self.plots.is_dir():
            (Path(target) / "plots").mkdir(parents=True, exist_ok=True)
            for path in self.plots.glob("*.png"):
                shutil.copy2(path, Path(target) / "plots" / path.name)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        print(f"trial {trial} failed; see {getattr(trial, 'path', '')}", file=sys.stderr, flush=True)


def fit(config: RunConfig, algo_config: GRPOConfig, progress: ProgressCallback, output_dir: Path) -> tune.ResultGrid:
    """Tune's run of ``algo_config`` in a Ray session of its own. A tracker that refuses its
    settings raises ``ConfigError`` naming ``logging``."""
    try:
        # Before Ray starts: a key the trackers read from a variable of another name is then in
        # the environment every Ray process inherits (and nowhere else).
        trackers = tracker_callbacks(config.logging, run_name=config.name, output_dir=output_dir,
                                     plots_dir=output_dir / "plots")
    except Exception as exc:  # noqa: BLE001 - a tracker refusing its settings (MLflow's own errors too)
        raise ConfigError(f"logging: {type(exc).__name__}: {exc}") from None
    if start_ray(config.resources):
        reserve_every_cpu(algo_config)
    try:
        # The progress callback first: it copies the plots the trackers then pick up.
        tuner = tune.Tuner("GRPO", param_space=algo_config, run_config=tune.RunConfig(
            name="tune", storage_path=str(output_dir), stop=config.tune_stop(), verbose=0,
            callbacks=[progress, *trackers],
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=config.checkpoint.every,
                                                    num_to_keep=config.checkpoint.keep, checkpoint_at_end=True)))
        return tuner.fit()
    finally:
        ray.shutdown()


def reserve_every_cpu(algo_config: GRPOConfig) -> None:
    """A trial with no env runner and no learner actor samples and learns in turn, and alone:
    on a Ray this command started it reserves every CPU, and Ray gives its torch as many
    threads (measured on 2 cores, one quickstart iteration: the update 42.8 s with two against
    55.2 s with the one RLlib reserves by default, the same episodes). With actors, each keeps
    its own reservation, RLlib's."""
    if algo_config.num_env_runners == 0 and algo_config.num_learners == 0:
        algo_config.learners(num_cpus_per_learner=int(ray.cluster_resources()["CPU"]))


def checkpoint_rollouts(config: RunConfig, task_ids: Sequence[str], checkpoints: Sequence[str | Path | None], *,
                        group_size: int, temperature: float, score: bool, seed: int,
                        announce: Callable[[str | Path | None], None] | None = None) -> Iterator[tuple]:
    """``(checkpoint, groups)`` for each checkpoint in turn (``None``: the policy of the config,
    its adapter at its zero start): ``group_size`` episodes of every task, no update. Each
    checkpoint runs on the base model its adapter was trained on (``checkpoint_model``: after
    a warm start, ``OUTPUT_DIR/warm_start``, not the config's ``policy.model``). One algorithm
    is built per base model (its env runners once), in a Ray session of its own that ends with
    the iteration. ``announce(checkpoint)`` runs before each is evaluated."""
    given = resolve_model(config.policy.model)
    models = [checkpoint_model(config, checkpoint) for checkpoint in checkpoints]  # refused before Ray starts
    start_ray(config.resources)
    algo, built_on = None, None
    try:
        for checkpoint, model in zip(checkpoints, models):
            if model != built_on:
                if algo is not None:
                    algo.stop()
                if model != given:
                    print(f"{checkpoint}: its adapter was trained on {model} (adapter_config.json), the warm start "
                          f"of policy.model; evaluating on that base", flush=True)
                run = config.model_copy(update={"policy": config.policy.model_copy(update={"model": model})})
                algo, built_on = GRPOConfig.from_run_config(run).training(task_ids=list(task_ids)).build_algo(), model
            if announce is not None:
                announce(checkpoint)
            if checkpoint is not None:
                algo.restore_from_path(str(Path(checkpoint).resolve()))
                algo.sync_weights()
            yield checkpoint, algo.rollout(list(task_ids), group_size=group_size, temperature=temperature,
                                           score=score, seed=seed)
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()


def checkpoint_model(config: RunConfig, checkpoint: str | Path | None) -> str:
    """The base model a checkpoint's adapter runs on (``models.base_for_adapter``): the one
    recorded with the adapter, which the config's ``policy.model`` must be or have been
    warm-started into; a mismatch raises ``ConfigError`` naming both. ``None``: the config's."""
    model = resolve_model(config.policy.model)
    if checkpoint is None:
        return model
    try:
        return base_for_adapter(Path(checkpoint) / ADAPTER_DIR, model)
    except BaseModelMismatch as exc:
        raise ConfigError(f"--checkpoint {checkpoint}: {exc}") from None
