"""Whole runs on Ray from a validated ``RunConfig``: training through Tune, and rollouts of
checkpoints for evaluation. The commands (``algos/cli``) call these and do the talking.

``fit`` runs the algorithm through ``tune.Tuner("GRPO", param_space=config)`` until a stop
criterion holds (``iterations``, or any of ``stop:``): Tune writes the TensorBoard event
files and checkpoints and feeds the trackers of ``logging:`` (its own W&B and MLflow
callbacks); ``ProgressCallback`` adds one progress line per iteration, ``metrics.jsonl`` and
the plots (``reporting.MetricsLog``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import ray
from ray import tune

from draco_gym.algos.config import ConfigError, RunConfig
from draco_gym.algos.rllib.grpo import GRPOConfig
from draco_gym.algos.rllib.reporting import MetricsLog, tracker_callbacks
from draco_gym.algos.rllib.session import start_ray


class ProgressCallback(tune.Callback):
    """Each result into the run's ``MetricsLog`` (progress line, metrics.jsonl, plots), the
    plots copied into the trial folder where a tracker that uploads it finds them."""

    def __init__(self, log: MetricsLog) -> None:
        self.log = log

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.log.add(result, copy_plots_to=getattr(trial, "local_path", None))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        print(f"trial {trial} failed; see {getattr(trial, 'path', '')}", file=sys.stderr, flush=True)


def fit(config: RunConfig, algo_config: GRPOConfig, log: MetricsLog, output_dir: Path) -> tune.ResultGrid:
    """Tune's run of ``algo_config`` in a Ray session of its own. A tracker that refuses its
    settings raises ``ConfigError`` naming ``logging``."""
    try:
        # Before Ray starts: a key the trackers read from a variable of another name is then in
        # the environment every Ray process inherits (and nowhere else).
        trackers = tracker_callbacks(config.logging, run_name=config.name, output_dir=output_dir,
                                     plots_dir=output_dir / "plots")
    except Exception as exc:  # noqa: BLE001 - a tracker refusing its settings (MLflow's own errors too)
        raise ConfigError(f"logging: {type(exc).__name__}: {exc}") from None
    start_ray(config.resources)
    try:
        # The progress callback first: it draws the plots the trackers then pick up.
        tuner = tune.Tuner("GRPO", param_space=algo_config, run_config=tune.RunConfig(
            name="tune", storage_path=str(output_dir), stop=config.tune_stop(), verbose=0,
            callbacks=[ProgressCallback(log), *trackers],
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=config.checkpoint.every,
                                                    num_to_keep=config.checkpoint.keep, checkpoint_at_end=True)))
        return tuner.fit()
    finally:
        ray.shutdown()


def checkpoint_rollouts(config: RunConfig, task_ids: Sequence[str], checkpoints: Sequence[str | Path | None], *,
                        group_size: int, temperature: float, score: bool, seed: int,
                        announce: Callable[[str | Path | None], None] | None = None) -> Iterator[tuple]:
    """``(checkpoint, groups)`` for each checkpoint in turn (``None``: the policy of the config,
    its adapter at its zero start): ``group_size`` episodes of every task, no update. One
    algorithm is built for all of them (its env runners once), in a Ray session of its own
    that ends with the iteration. ``announce(checkpoint)`` runs before each is evaluated."""
    start_ray(config.resources)
    try:
        algo = GRPOConfig.from_run_config(config).training(task_ids=list(task_ids)).build_algo()
        try:
            for checkpoint in checkpoints:
                if announce is not None:
                    announce(checkpoint)
                if checkpoint is not None:
                    algo.restore_from_path(str(Path(checkpoint).resolve()))
                    algo.sync_weights()
                yield checkpoint, algo.rollout(list(task_ids), group_size=group_size, temperature=temperature,
                                               score=score, seed=seed)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
