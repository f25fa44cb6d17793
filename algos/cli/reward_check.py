"""``draco-gym train --check``'s question to the reward: can it see whether the task was done?

A reward that cannot (the rule rubric where it reads only which calls ran, a random
control) ranks a wrong solution that makes the right calls as high as the right one, so a
run that trains on it alone learns to look busy. The check asks the reward itself: two
rollouts identical but for the environment's outcome (``metrics["success"]`` and the
metrics the config's outcome parts read), scored as a group in both orders; a reward that
does not put the successful one first both times is blind to the outcome. A run whose
credit rule takes its advantage from the outcome (TRCA's episode advantage, TRACE's and
ProVer's base advantage) sees it there, whatever the reward.
"""

from __future__ import annotations

from typing import Any

from draco_gym.types import Step, Task, Trajectory


def _uses_judge(options: Any) -> bool:
    """Whether a reward's options (a weighted reward's parts included) name a judge: a judged
    reward reads the rollouts' text, which no offline probe can stand in for."""
    if isinstance(options, dict):
        return "judge" in options or any(_uses_judge(v) for v in options.values())
    if isinstance(options, (list, tuple)):
        return any(_uses_judge(v) for v in options)
    return False


def _outcome_keys(options: Any) -> tuple[set[str], set[tuple[str, str]]]:
    """The metrics the reward's outcome parts read: ``metric`` values and ``ratio`` pairs."""
    metrics, ratios = {"success"}, set()
    if isinstance(options, dict):
        if isinstance(options.get("metric"), str):
            metrics.add(options["metric"])
        ratio = options.get("ratio")
        if isinstance(ratio, (list, tuple)) and len(ratio) == 2 and all(isinstance(k, str) for k in ratio):
            ratios.add((ratio[0], ratio[1]))
        for value in options.values():
            more_metrics, more_ratios = _outcome_keys(value)
            metrics |= more_metrics
            ratios |= more_ratios
    elif isinstance(options, (list, tuple)):
        for value in options:
            more_metrics, more_ratios = _outcome_keys(value)
            metrics |= more_metrics
            ratios |= more_ratios
    return metrics, ratios


def _rollout(task: Task, success: bool, options: dict) -> Trajectory:
    """A one-step rollout that hands in a result, with the outcome ``success``."""
    metrics_keys, ratios = _outcome_keys(options)
    metrics: dict[str, Any] = {"submitted": True}
    metrics.update({key: success for key in metrics_keys})
    for numerator, denominator in ratios:
        metrics[numerator], metrics[denominator] = (1 if success else 0), 1
    step = Step(index=1, text="```python\nsubmit(1)\n```", code="submit(1)", observation="",
                info={"tool_calls": [{"name": "submit", "ok": True}], "submitted": True})
    return Trajectory(task=task, steps=[step], termination="submitted", metrics=metrics)


def outcome_blind(name: str, options: dict) -> bool | None:
    """True when the reward ``name`` built with ``options`` ranks two rollouts that differ
    only in their outcome alike; None when that cannot be asked offline (a judged reward, a
    factory, or a reward for another environment's rollouts, which refuses the probe).
    ``ConfigError`` when the reward cannot be built with ``options``."""
    from draco_gym.reward import build_reward

    if not isinstance(name, str) or _uses_judge(options):
        return None
    from draco_gym.algos.config import ConfigError

    task = Task(id="outcome-probe", instruction="Hand in the answer.")
    try:
        reward = build_reward(name, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"reward: {name!r} cannot be built with options {options}: {exc}") from None
    try:
        first = reward.score_group(task, [_rollout(task, True, options), _rollout(task, False, options)]).rewards
        second = reward.score_group(task, [_rollout(task, False, options), _rollout(task, True, options)]).rewards
    except (ValueError, KeyError, TypeError):
        return None
    return not (first[0] > first[1] and second[1] > second[0])


def credit_reads_outcome(credit) -> bool:
    """Whether the credit rule sees the outcome: it reads it itself (``Need.OUTCOME``) or builds
    on the outcome reward's advantage (``Need.OUTCOME_REWARD``), as it declares."""
    from draco_gym.algos.credit import Need, credit_spec

    if not isinstance(credit.name, str):
        return False
    spec = credit_spec(credit.name)
    return bool({Need.OUTCOME, Need.OUTCOME_REWARD} & spec.needs(spec.parse(credit.options)[0]))


def outcome_blind_warning(config) -> str | None:
    """The warning ``train --check`` prints when nothing the run learns from sees the outcome:
    a reward blind to it and a credit rule that does not read it."""
    name, options = config.reward.name, dict(config.reward.options)
    if not outcome_blind(name, options) or credit_reads_outcome(config.credit):
        return None
    credit = config.credit.name if isinstance(config.credit.name, str) else "this run's"
    return (f"warning: reward {name!r} is blind to the outcome, and credit {credit!r} does not read it either: two "
            "rollouts that differ only in whether the "
            "task was done (metrics['success']) get the same rank, so training on it alone pays a wrong solution "
            "that makes the right calls as much as the right one. Add the outcome, e.g. reward: {name: weighted, "
            "options: {parts: [{name: outcome, weight: 1.0}, {name: " + name + ", weight: 0.25}]}} "
            "(a random reward is blind on purpose: ignore this for a control run)")
