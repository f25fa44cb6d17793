"""A rubric reward as a TRL ``reward_funcs`` entry (no TRL import needed)::

    from trl import GRPOConfig, GRPOTrainer
    from draco_gym.reward import DynamicRubricReward, OpenAIJudge, TRLReward

    reward = TRLReward(DynamicRubricReward(OpenAIJudge("judge", base_url=URL)), num_generations=4)
    trainer = GRPOTrainer(model=..., reward_funcs=reward, args=GRPOConfig(num_generations=4, ...),
                          train_dataset=ds)

TRL calls the function once per batch with ``prompts``, ``completions`` and every dataset
column as keyword arguments; the ``num_generations`` completions of one prompt are
adjacent. Adjacent completions of the same prompt form one group, scored together (all
groups of a batch concurrently); the returned list holds R_i per completion, None for an
episode that ended in ``env_error`` (TRL then leaves it out of its group's baseline and
gives it no advantage: the infrastructure failed it, not the policy). The verdicts
stay on the object (``last_groups``, ``history``) for step credit or logging.

Conversion: a prompt is a string or a list of chat messages (the system message becomes
``Task.agent_prompt``, the last user message ``Task.instruction``); a completion is a
string (one step) or a list of messages (each assistant message a step, the messages
after it its observation). A ``task_id`` column, when present, names the task (the
dynamic reward caches its proposed criteria per task); a ``metrics`` column of dicts
feeds the outcome reward. A ``trajectory`` column (``Trajectory`` objects, as
``draco_gym.algos.trl.EnvRollout`` returns for whole multi-turn episodes played in
a draco-gym environment) is scored as it is, instead of converting the completion.

When to use which: completions TRL generates itself are single-turn text and nothing runs
their code, so a rubric sees one step and the rule reward fails them all; that suits judge
rewards on single-turn data. For agent episodes with code execution, give TRL
``EnvRollout`` as ``rollout_func``: the rows then carry ``trajectory``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from typing import Any

from draco_gym.codeblock import parse_message
from draco_gym.reward.base import RubricReward
from draco_gym.types import GroupScore, Step, Task, Termination, Trajectory

log = logging.getLogger(__name__)


def _content(message: Any) -> str:
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def task_from_prompt(prompt: Any, task_id: Any = None) -> Task:
    if isinstance(prompt, str):
        instruction, system = prompt, ""
    else:
        messages = list(prompt)
        system = "\n\n".join(_content(m) for m in messages if isinstance(m, dict) and m.get("role") == "system")
        users = [_content(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        instruction = users[-1] if users else _content(messages[-1]) if messages else ""
    if task_id is None:
        blob = json.dumps(prompt, sort_keys=True, default=str)
        task_id = "prompt-" + hashlib.sha256(blob.encode()).hexdigest()[:12]
    return Task(id=str(task_id), instruction=instruction, agent_prompt=system)


def trajectory_from_completion(task: Task, completion: Any, metrics: dict | None = None) -> Trajectory:
    if isinstance(completion, str):
        turns = [(completion, "")]
    else:
        turns = []
        for message in completion:
            role = message.get("role") if isinstance(message, dict) else "assistant"
            if role == "assistant" or not turns:
                turns.append((_content(message), ""))
            else:
                text, observation = turns[-1]
                turns[-1] = (text, observation + ("\n" if observation else "") + _content(message))
    steps = []
    for index, (text, observation) in enumerate(turns, start=1):
        parsed = parse_message(text)
        steps.append(Step(index=index, text=text, code=parsed.code, observation=observation, info={"parse": parsed.to_info()}))
    termination = Termination.NO_CODE if steps and steps[-1].code is None else None
    return Trajectory(task=task, steps=steps, termination=termination, metrics=dict(metrics or {}))


class TRLReward:
    """``reward_funcs``-compatible wrapper around any RubricReward (module docstring)."""

    def __init__(self, reward: RubricReward, num_generations: int | None = None, *, keep: int = 64) -> None:
        if not isinstance(reward, RubricReward):
            raise TypeError(f"reward must be a RubricReward, got {type(reward).__name__}")
        self.reward = reward
        self.num_generations = num_generations
        self.__name__ = f"draco_{reward.name}"
        self.last_groups: list[tuple[list[Trajectory], GroupScore]] = []
        self.history: deque[tuple[list[Trajectory], GroupScore]] = deque(maxlen=keep)

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        ids = columns.get("task_id")
        metrics = columns.get("metrics")
        played = columns.get("trajectory")  # whole episodes from a rollout_func (algos/trl.py)
        groups: list[tuple[Task, list[Trajectory]]] = []
        previous = object()
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            key = json.dumps(prompt, sort_keys=True, default=str)
            if key != previous:
                task = played[i].task if played is not None else task_from_prompt(prompt, ids[i] if ids is not None else None)
                groups.append((task, []))
                previous = key
            task, members = groups[-1]
            if played is not None:
                members.append(played[i])
            else:
                members.append(trajectory_from_completion(task, completion, metrics[i] if metrics is not None else None))
        if self.num_generations:
            sizes = [len(m) for _, m in groups]
            if any(s != self.num_generations for s in sizes):
                log.warning("groups of sizes %s in this batch, expected %d completions per prompt", sizes, self.num_generations)
        scored = self.reward.score_groups(groups)
        self.last_groups = [(members, score) for (_, members), score in zip(groups, scored, strict=True)]
        self.history.extend(self.last_groups)
        # None is TRL's "unscorable": its GRPOTrainer leaves the row out of the group's mean and
        # std and gives it advantage 0, which is what an episode the infrastructure failed needs
        return [None if t.termination == Termination.ENV_ERROR else r
                for members, score in self.last_groups for t, r in zip(members, score.rewards, strict=True)]
