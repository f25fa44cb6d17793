"""Scoring groups as they finish: the judge works on the groups whose episodes have all
ended while the rollout loop keeps sampling the others (on-policy; the same rewards in the
same order as scoring every group after the rollout).

The rollout loop advances every live episode in lockstep (``rollout.run_episodes``), so
groups end at different turns; ``GroupWatch`` turns its per-episode ``on_done`` into
"group k is complete" and hands the group to a ``GroupScorer``, whose one background
thread runs one event loop for all the iteration's groups: their judge calls share the
judge's concurrency and server slots as ``RubricReward.ascore_groups`` shares them, and
the judge, I/O-bound, waits on its sockets while the sampling thread computes.

A self-judge (``judge: policy``) scores with the runner's own policy copy, the one the
rollout loop is sampling with: it cannot run beside the sampling on that copy, so a
self-judged reward is scored after the rollout, in order (``uses_policy_judge``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from draco_gym.types import GroupScore, Task, Trajectory


def uses_policy_judge(options: Any) -> bool:
    """Whether a reward's options name the policy as a judge anywhere (a weighted reward's
    parts included)."""
    if isinstance(options, dict):
        if options.get("judge") == "policy" or (isinstance(options.get("judge"), dict)
                                                 and options["judge"].get("name") == "policy"):
            return True
        return any(uses_policy_judge(v) for v in options.values())
    if isinstance(options, (list, tuple)):
        return any(uses_policy_judge(v) for v in options)
    return False


class GroupScorer:
    """The groups of one iteration, scored on a background event loop as they are handed
    over; ``results`` waits for the outstanding ones and returns every score in group order."""

    def __init__(self, reward: Any, n_groups: int) -> None:
        self.reward = reward
        self._futures: list[Future | None] = [None] * n_groups
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="group-scorer", daemon=True)
        self._thread.start()

    def submit(self, index: int, task: Task, trajectories: Sequence[Trajectory]) -> None:
        if self._futures[index] is not None:
            raise RuntimeError(f"group {index} was handed over twice")
        self._futures[index] = asyncio.run_coroutine_threadsafe(
            self.reward.ascore_group(task, list(trajectories)), self._loop)

    def results(self) -> list[GroupScore]:
        """Every group's score, in order; the judge's connections are closed on the loop
        that opened them, and the loop stops, whatever happened."""
        missing = [i for i, f in enumerate(self._futures) if f is None]
        try:
            if missing:
                raise RuntimeError(f"groups {missing} were never handed over to the judge")
            return [f.result() for f in self._futures]
        finally:
            self.close()

    def close(self) -> None:
        if not self._loop.is_running():
            return
        for f in self._futures:
            if f is not None and not f.done():
                f.cancel()
        aclose = getattr(self.reward, "aclose", None)
        if aclose is not None:
            asyncio.run_coroutine_threadsafe(aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class GroupWatch:
    """Episode i of a rollout belongs to group i // G; when the last of a group's G episodes
    ends, the group goes to the scorer."""

    def __init__(self, scorer: GroupScorer, episodes: Sequence, group_size: int) -> None:
        self.scorer, self.episodes, self.group_size = scorer, episodes, group_size
        self._left = [group_size] * (len(episodes) // group_size)

    def __call__(self, index: int) -> None:
        group = index // self.group_size
        self._left[group] -= 1
        if self._left[group] == 0:
            members = [ep.trajectory for ep in self.episodes[group * self.group_size:(group + 1) * self.group_size]]
            self.scorer.submit(group, members[0].task, members)
