"""What a training run shows while it runs and leaves behind: the iteration's metrics
(``iteration_metrics``, in RLlib's new-API-stack result groups: ``env_runners/``,
``learners/``, ``judge/``, ``credit/``, ``timers/``), one progress line per iteration,
``metrics.jsonl`` (one flat JSON object per iteration, keys spelled as Tune spells them),
``rollouts.jsonl`` (``RolloutLog``, train and eval alike), PNG plots of the rubric pass rate
and of the termination modes over iterations (DRACO's Figures 3 and 4), and the trackers
(``tracker_callbacks``: Tune's own W&B and MLflow callbacks). TensorBoard event files come
from Tune's own logger, in the trial directory.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draco_gym.algos.config import RESULT_GROUPS, RESULT_TOP_KEYS, LoggingSection
from draco_gym.metrics import outcome_agreement, reward_outcome_divergence, success_kl_collapse
from draco_gym.records import append_records, read_records
from draco_gym.reward.base import FallbackKind, count_fallbacks
from draco_gym.types import RolloutGroup, RolloutRecord

# The phases of one iteration, in order; each reports seconds as ``timers/phases/<phase>``.
PHASES = ("generation", "env", "judge", "credit", "learner", "sync")
OUTCOME = "success"
"""The environment's own evaluation the reward is checked against (``Trajectory.metrics``)."""
NOTE_KEY = "note"
"""The result key (top level, a string: lines, empty when none) of what an iteration has to
say on the console beside its progress line (a judge that answered nothing)."""



def iteration_metrics(groups: Sequence[RolloutGroup], batch, timers: dict[str, float], total_s: float,
                      generated_tokens: int) -> dict[str, float]:
    """One iteration in numbers, keyed by their path in the result (``group/.../name``).

    ``env_runners/`` holds the episode statistics RLlib defines (``episode_return_*``: the
    rubric reward of each episode, ``episode_len_*``: its turns, ``num_episodes``,
    ``num_env_steps_sampled``: turns in all) and ours beside them (``termination/<mode>``
    shares, ``env/<metric>`` means of the environment's own evaluation, generated tokens);
    ``judge/`` the rubric and the judge's usage; ``credit/`` the credit rule's outcome;
    ``timers/phases/`` seconds per phase.

    ``groups`` are the scored groups, ``batch`` their ``CreditedBatch``; runners work in parallel, so ``timers`` hold the slowest one's.
    """
    returns, turns, terminations, env_metrics, usage = [], [], Counter(), {}, Counter()
    passes = fails = before = after = mixed = mixed_with_criteria = 0
    for group in groups:
        score = group.score
        outcomes = {bool(t.metrics[OUTCOME]) for t in group.trajectories if OUTCOME in t.metrics}
        if len(outcomes) == 2:  # a group whose episodes differ in outcome: the rubric must tell them apart
            mixed += 1
            mixed_with_criteria += bool(score.criteria)
        returns.extend(score.rewards)
        for traj, ts in zip(group.trajectories, score.scores):
            terminations[traj.termination] += 1
            turns.append(len(traj.steps))
            passes, fails = passes + ts.p + ts.dropped_passes, fails + ts.f  # the whole rubric, dropped criteria too
            for key, value in traj.metrics.items():
                if isinstance(value, (bool, int, float)):
                    env_metrics.setdefault(key, []).append(float(value))
        after += len(score.criteria)
        before += len(score.criteria) + len(score.dropped)
        total = score.total_usage
        usage.update({"calls": total.calls, "prompt_tokens": total.prompt_tokens,
                      "completion_tokens": total.completion_tokens, "cost": total.cost})
    n_groups, n = max(len(groups), 1), max(len(turns), 1)
    fallbacks = count_fallbacks(g.score for g in groups)
    agreement = outcome_agreement((g.score.rewards, [t.metrics.get(OUTCOME) for t in g.trajectories])
                                  for g in groups)
    return {
        **_spread("env_runners/episode_return", returns),
        "env_runners/episode_return_std": float(np.std(returns)) if returns else 0.0,
        **_spread("env_runners/episode_len", turns),
        "env_runners/num_episodes": len(turns),
        "env_runners/num_env_steps_sampled": int(sum(turns)),
        "env_runners/num_generated_tokens": generated_tokens,
        "env_runners/generated_tokens_per_s": generated_tokens / timers["generation"] if timers.get("generation") else 0.0,
        **{f"env_runners/termination/{k}": v / n for k, v in terminations.items()},
        **{f"env_runners/env/{k}": float(np.mean(v)) for k, v in env_metrics.items()},
        "judge/rubric_pass_rate": passes / (passes + fails) if passes + fails else 0.0,
        "judge/criteria_before_dropout": before / n_groups,
        "judge/criteria_after_dropout": after / n_groups,
        # of the groups whose episodes differ in outcome, the share with a criterion left after
        # dropout: a rubric that discriminates keeps one in each (absent: no such group)
        "judge/mixed_groups": mixed,
        **({"judge/mixed_groups_with_criteria": mixed_with_criteria / mixed} if mixed else {}),
        "judge/fallbacks": fallbacks[FallbackKind.JUDGE],
        # an environment that reported no outcome: the outcome reward's 0, not a judge failure
        "env_runners/outcome_fallbacks": fallbacks[FallbackKind.OUTCOME],
        "judge/failed_requests": sum(len(g.score.judge_failures) for g in groups),
        # tau-b of reward against outcome within groups: falling while the reward rises is a hack
        **({"judge/outcome_agreement": agreement} if agreement is not None else {}),
        "judge/calls": usage["calls"], "judge/prompt_tokens": usage["prompt_tokens"],
        "judge/completion_tokens": usage["completion_tokens"], "judge/cost": float(usage["cost"]),
        # what the credit did (credit/apply.py's measures: both inert shares, uncredited
        # citations, changed tokens, the spread and size of a_j)
        **batch.metrics(),
        # episodes the infrastructure failed (left out of their group's statistics and the
        # loss), and the groups they left without a baseline (skipped)
        "env_runners/env_errors": batch.env_errors,
        "credit/groups_skipped": batch.skipped_groups,
        # groups whose rewards differ (env_error episodes aside): with none, every advantage is 0
        # and nothing is learned
        "credit/groups_with_spread": sum(any(a != 0 for a in advantages) for advantages in batch.group_advantages),
        **{f"timers/phases/{phase}": seconds for phase, seconds in timers.items()},
        "timers/phases/other": max(total_s - sum(timers.values()), 0.0),
    }


def _spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """RLlib's ``<name>_mean``, ``_min`` and ``_max``."""
    if not values:
        return {f"{name}_mean": 0.0, f"{name}_min": 0.0, f"{name}_max": 0.0}
    return {f"{name}_mean": float(np.mean(values)), f"{name}_min": float(np.min(values)),
            f"{name}_max": float(np.max(values))}


class RolloutLog:
    """``rollouts.jsonl``: every rollout, one ``RolloutRecord`` (``draco_gym.types``) a line,
    with its verdicts and, in training, its step credit: enough to replay and re-score later
    with another judge or credit rule. ``draco-gym report`` reads the same records."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, groups: Sequence[RolloutGroup], *, iteration: int | None = None,
              step_advantages: Sequence[Sequence[float]] | None = None) -> None:
        """``step_advantages``: one list per trajectory, in group order (``CreditedBatch``'s)."""
        start, lines = 0, []
        for group in groups:
            end = start + len(group.trajectories)
            credit = None if step_advantages is None else step_advantages[start:end]
            start = end
            lines += [record.model_dump(mode="json")
                      for record in RolloutRecord.of_group(group, iteration=iteration, step_advantages=credit)]
        append_records(self.path, lines)  # each line whole, in one write; synced


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """The run's metrics out of an RLlib result, flat (``env_runners/episode_return_mean``,
    Tune's own spelling of a nested key) and JSON-safe: every group of ``RESULT_GROUPS``
    but the learners' throughput figures, plus the top-level counters."""
    out: dict[str, Any] = {key: _plain(result[key]) for key in RESULT_TOP_KEYS if key in result}
    for group in RESULT_GROUPS:
        if isinstance(result.get(group), dict):
            for key, value in _flat(result[group], group):
                if "throughput" not in key:
                    out[key] = _plain(value)
    return out


def _flat(tree: dict, prefix: str):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}/{key}")
        else:
            yield f"{prefix}/{key}", value


def _plain(value):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return value
    return value if math.isfinite(value) else None


def progress_line(m: dict[str, Any], total_iterations: int | None = None) -> str:
    """One line per iteration, from a ``compact`` row. The iteration's time is Tune's
    ``time_this_iter_s``: RLlib's ``timers/training_iteration`` is a moving average (EMA
    coefficient 0.01) that the first iteration's start-up dominates for the whole run."""
    it = int(m.get("training_iteration", 0))
    head = f"[iter {it}/{total_iterations}]" if total_iterations else f"[iter {it}]"
    terms = " ".join(f"{k.rsplit('/', 1)[1]}={v:.2f}" for k, v in sorted(m.items())
                     if k.startswith("env_runners/termination/") and v)
    times = " ".join(f"{p}={m.get('timers/phases/' + p) or 0.0:.1f}s" for p in (*PHASES, "other"))
    success = m.get("env_runners/env/success")
    er = "env_runners/episode_return_"
    drawn = m.get("env_runners/groups_drawn")  # with dynamic sampling: groups that can teach, of all drawn
    dynamic = f" teaching={int(m.get('credit/groups_teaching') or 0)}/drawn={int(drawn)}" if drawn else ""
    return (f"{head} return={m.get(er + 'mean') or 0:+.3f}±{m.get(er + 'std') or 0:.3f} "
            f"[{m.get(er + 'min') or 0:+.2f},{m.get(er + 'max') or 0:+.2f}] "
            f"pass={m.get('judge/rubric_pass_rate') or 0:.2f} "
            f"criteria={m.get('judge/criteria_before_dropout') or 0:.1f}"
            f"->{m.get('judge/criteria_after_dropout') or 0:.1f} "
            f"inert={m.get('credit/inert_share') or 0:.2f}/paper={m.get('credit/paper_inert_share') or 0:.2f} "
            f"uncredited={int(m.get('credit/uncredited_citations') or 0)}{dynamic} "
            f"turns={m.get('env_runners/episode_len_mean') or 0:.1f}"
            f"{f' success={success:.2f}' if success is not None else ''} [{terms}] "
            f"kl={m.get('learners/default_policy/kl') or 0:.4f} "
            f"tok/s={m.get('env_runners/generated_tokens_per_s') or 0:.1f} | "
            f"{times} iter={m.get('time_this_iter_s') or 0:.1f}s")


SUCCESS_KEY = f"env_runners/env/{OUTCOME}"
KL_KEY = "learners/default_policy/kl"
REWARD_KEY = "env_runners/episode_return_mean"


def reward_hacking_warning(iteration: int, rise: float, fall: float) -> str:
    return (f"iteration {iteration}: the reward rose by {rise:.3f} while the environment's {OUTCOME} fell by "
            f"{-fall:.3f} over the last iterations: the policy may be learning to please the reward, not to do "
            "the task (read the report's rollouts)")


def run_alarms(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The alarms that hold at the last of a run's ``compact`` rows, by name, each as the
    warning to print: ``reward_hacking`` (``metrics.reward_outcome_divergence``: the reward
    rising while the outcome falls) and ``collapse`` (``metrics.success_kl_collapse``: the
    outcome falling while the KL to the reference climbs)."""
    if not rows:
        return {}
    iteration = int(rows[-1].get("training_iteration", len(rows)))
    out = {}
    hacking = reward_outcome_divergence([r.get(REWARD_KEY) or 0.0 for r in rows], [r.get(SUCCESS_KEY) for r in rows])
    if hacking is not None:
        out["reward_hacking"] = reward_hacking_warning(iteration, *hacking)
    collapse = success_kl_collapse([r.get(SUCCESS_KEY) for r in rows], [r.get(KL_KEY) for r in rows])
    if collapse is not None:
        out["collapse"] = (f"iteration {iteration}: the environment's {OUTCOME} fell by {-collapse[0]:.2f} over the "
                           f"last iterations while the KL to the reference policy rose by {collapse[1]:.3f}: the "
                           "policy is collapsing (a smaller optim.lr, or a larger optim.kl_coeff; the checkpoint "
                           "before the fall is the better policy)")
    return out


def print_line(line: str) -> None:
    # The default echo, not ``print`` itself: Tune pickles the CLI's progress callback, and a
    # builtin pickles by name, which fails once Ray has replaced ``builtins.print`` in the
    # driver (ray.experimental.tqdm_ray does, when a progress bar reaches it).
    print(line, flush=True)


class MetricsLog:
    """Appends compact metrics to ``metrics.jsonl`` and redraws the plots. The algorithm
    keeps one when it has an ``output_dir`` (``GRPO.train``), so a run from Python, through
    Tune or ``draco-gym train`` writes the same file."""

    def __init__(self, output_dir: str | Path) -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        # A resumed run appends: its plots cover the earlier iterations too.
        self.rows: list[dict] = read_records(self.path)[0] if self.path.exists() else []

    def add(self, result: dict[str, Any]) -> dict[str, Any]:
        """Log one result; returns its row."""
        row = compact(result)
        self.rows.append(row)
        append_records(self.path, [row])
        plot_run(self.rows, self.dir / "plots")
        return row


def plot_run(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """rubric_pass_rate.png and termination_modes.png; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    its = [r.get("training_iteration", i + 1) for i, r in enumerate(rows)]
    written = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(its, [r.get("judge/rubric_pass_rate") or 0 for r in rows], marker="o", label="rubric pass rate")
    ax.plot(its, [r.get("env_runners/episode_return_mean") or 0 for r in rows], marker=".", linestyle="--",
            label="episode return mean")
    if any(r.get("env_runners/env/success") is not None for r in rows):
        ax.plot(its, [r.get("env_runners/env/success") or 0 for r in rows], marker="x", linestyle=":",
                label="env success")
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Rubric pass rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    written.append(out / "rubric_pass_rate.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    modes = sorted({k.rsplit("/", 1)[1] for r in rows for k in r if k.startswith("env_runners/termination/")})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if modes:
        ax.stackplot(its, *[[r.get(f"env_runners/termination/{m}") or 0 for r in rows] for m in modes],
                     labels=modes)
        ax.legend(loc="upper left", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of rollouts")
    ax.set_title("Termination modes")
    fig.tight_layout()
    written.append(out / "termination_modes.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written


# -- trackers: Ray Tune's own logger callbacks ---------------------------------------------


def tracker_callbacks(logging, *, run_name: str, output_dir: str | Path, plots_dir: str | Path | None = None) -> list:
    """Tune's ``WandbLoggerCallback`` and ``MLflowLoggerCallback`` for a run's ``logging:``
    section (a ``LoggingSection`` or its dict), for ``tune.RunConfig(callbacks=...)``.

    Both log every scalar of each result and the algorithm's config; W&B also gets the PNGs
    of ``plots_dir`` as images each iteration, MLflow the trial folder (plots included when
    the caller copies them there) as artifacts at the end. An API key is read from the
    environment variable the section names and handed on through the environment only:
    Tune pickles its callbacks into the experiment folder, so a key given to a callback
    would be written to disk.
    """
    section = logging if isinstance(logging, LoggingSection) else LoggingSection.model_validate(logging or {})
    callbacks = []
    if section.wandb is not None:
        callbacks.append(_wandb_callback(section.wandb, run_name, plots_dir))
    if section.mlflow is not None:
        callbacks.append(_mlflow_callback(section.mlflow, run_name, Path(output_dir)))
    return callbacks


def _export_key(variable: str | None, standard: str, where: str, required: bool) -> None:
    """Make the key held in ``variable`` visible under the name the tracker reads."""
    if not variable or variable == standard:
        return
    value = os.environ.get(variable)
    if value:
        os.environ[standard] = value
    elif required:
        raise ValueError(f"{where}: the environment variable {variable} is not set; export the key there")


def _wandb_callback(section, run_name: str, plots_dir):
    from ray.air.integrations.wandb import WandbLoggerCallback

    _export_key(section.api_key_env, "WANDB_API_KEY", "logging.wandb.api_key_env", section.mode == "online")

    class WandbWithPlots(WandbLoggerCallback):
        """Tune's W&B callback; each result also carries the run's plots, as images.

        Tune hands the API key to its logging actor as a ``runtime_env`` variable, and Ray's
        runtime-env agent writes every runtime_env it sets up, values included, to
        ``session_*/logs/runtime_env_agent.log``. This actor gets no runtime_env: it inherits
        the key from the environment the Ray node started with (``tracker_callbacks`` runs
        before ``ray.init``; on a cluster, export the key before ``ray start`` on the node
        that runs ``draco-gym train``)."""

        def _start_logging_actor(self, trial, exclude_results, **wandb_init_kwargs):
            if not self._remote_logger_class:
                import ray
                from ray.air.util.node import _force_on_current_node

                self._remote_logger_class = ray.remote(num_cpus=0, **_force_on_current_node(), max_restarts=-1,
                                                       max_task_retries=-1)(self._logger_actor_cls)
            super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

        def log_trial_result(self, iteration, trial, result):
            plots = sorted(Path(plots_dir).glob("*.png")) if plots_dir else []
            if plots:  # an (H, W, C) array is what Tune's W&B callback logs as an image
                result = {**result, "plots": {p.stem: _png_pixels(p) for p in plots}}
            super().log_trial_result(iteration, trial, result)

    extra = {k: v for k, v in (("entity", section.entity), ("job_type", "train")) if v}
    return WandbWithPlots(project=section.project, group=section.group or run_name, mode=section.mode,
                          upload_checkpoints=section.upload_checkpoints, **extra)


def _png_pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _mlflow_callback(section, run_name: str, output_dir: Path):
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    _export_key(section.tracking_token_env, "MLFLOW_TRACKING_TOKEN", "logging.mlflow.tracking_token_env", True)
    uri = section.tracking_uri or f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"
    experiment = section.experiment_name or run_name
    if uri.startswith(("sqlite:", "file:")) or "://" not in uri:
        # A local store keeps its artifacts beside the run, not in ./mlruns of whatever
        # directory the command was started from (MLflow's default for a new experiment).
        import mlflow

        client = mlflow.MlflowClient(uri)
        if client.get_experiment_by_name(experiment) is None:
            client.create_experiment(experiment, artifact_location=(output_dir / "mlflow-artifacts").resolve().as_uri())
    return MLflowLoggerCallback(tracking_uri=uri, experiment_name=experiment, save_artifact=section.save_artifacts,
                                tags={"draco_gym.run": run_name})
