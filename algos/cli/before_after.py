"""``draco-gym train CONFIG --before-after``: the policy on held-out tasks before and after training.

Both evaluations run the config's ``eval:`` tasks (its ``env_config`` merged over the
environment's, ``task_ids`` or ``max_tasks``, ``episodes_per_task``, ``temperature``) with the
same seed, scored by the run's reward, so the two sets of episodes differ only by the policy.
``OUTPUT_DIR/summary.json`` then holds ``{"eval": {"before": ..., "after": ...}, "notes": [...]}``
with ``draco_gym.algos.evaluation.episode_summary``'s rates and their 95% intervals.
"""

from __future__ import annotations

from pathlib import Path

from draco_gym.records import write_json


def eval_setup(config):
    """The eval tasks and the config whose environment is the eval environment."""
    from draco_gym.algos.cli.prepare import prepare

    ev = config.eval
    env_config = {**config.env.config, **ev.env_config}
    eval_config = config.model_copy(update={"env": config.env.model_copy(update={"config": env_config})})
    task_ids = prepare(eval_config, env_config=env_config, task_ids=ev.task_ids)
    return eval_config, task_ids[: ev.max_tasks] if ev.max_tasks else task_ids


def evaluate_policy(config, checkpoint: str | Path | None = None) -> dict:
    """``episode_summary`` of the eval episodes of the config's policy, or of a checkpoint."""
    from draco_gym.algos.evaluation import episode_summary
    from draco_gym.algos.rllib.runs import checkpoint_rollouts

    eval_config, task_ids = eval_setup(config)
    ev = config.eval
    [(_, groups)] = checkpoint_rollouts(eval_config, task_ids, [checkpoint], group_size=ev.episodes_per_task,
                                        temperature=ev.temperature, score=True, seed=config.seed)
    return {"tasks": len(task_ids), "episodes_per_task": ev.episodes_per_task, "temperature": ev.temperature,
            **episode_summary(groups, ev.success_metric)}


def table(before: dict, after: dict) -> str:
    from draco_gym.algos.evaluation import rates_table

    return rates_table({"before": before, "after": after}, "held-out evaluation")


def write_summary(out_dir: str | Path, before: dict, after: dict, rows: list[dict]) -> dict:
    from draco_gym.algos.evaluation import comparison_notes, no_update_note

    notes = comparison_notes(before, after)
    note = no_update_note(rows)
    if note:
        notes.insert(0, note)
    summary = {"eval": {"before": before, "after": after}, "notes": notes, "iterations": len(rows)}
    write_json(Path(out_dir, "summary.json"), summary)
    return summary
