"""A judge-free rubric for the Corridor environment, with controllable citation noise.

Its verdicts are what a perfect DRACO judge would write about a corridor episode:

    "Opens the treasure door"        PASS/FAIL, citing the step that opened a door in the
                                     treasure room (the pivotal step)
    "Avoids the hallway traps"       FAIL citing every step that opened a trap door, else
                                     PASS citing every hallway step
    "Sends only valid door calls"    FAIL citing every message that was not one valid
                                     ``open_door(n)`` call, else PASS citing every step

A treasure room never reached is a FAIL cited at the last step (where the omission
mattered most). Outcome and traps weigh the same in R_i, so a policy cannot earn its reward
by avoiding traps alone.

With ``traps="room"`` the trap criterion is split into one per hallway room, "Avoids the
trap in room k", citing the step that opened a door there (a room never reached: FAIL at
the last step). Each verdict then cites one step, as DRACO's judge is asked to, and R_i
weighs the treasure door 1 : (rooms - 1) against the hallways: the pivotal step's share of
a trajectory's advantage shrinks with the corridor, which is what uniform credit pays for
and DRACO's per-step redistribution should not.
On the ``locks`` layout (every room its own decision) the rubric is one criterion per room,
"Opens the lock in room k", citing the step that opened a door there (a room never reached:
FAIL at the last step), and the valid-call criterion; ``traps`` does not apply.

With probability ``p`` each citation instead points at a wrong step, drawn uniformly from
the episode's other steps: the judge's attribution error, the quantity the credit
benchmark varies. The draw is seeded from ``seed`` and the episode's own content, so a
group scores the same in any order and on any process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from draco_gym.reward.base import REWARDS, RubricReward, check_group, finalize_group
from draco_gym.types import Criterion, GroupScore, Task, Trajectory, Verdict

TREASURE = "Opens the treasure door"
TRAPS = "Avoids the hallway traps"
VALID = "Sends only valid door calls"
TRAP_CRITERIA = ("episode", "room")


def room_trap(room: int) -> str:
    """The title of room ``room``'s own trap criterion (``traps="room"``)."""
    return f"Avoids the trap in room {room}"


def room_lock(room: int) -> str:
    """The title of room ``room``'s criterion on the ``locks`` layout."""
    return f"Opens the lock in room {room}"


@REWARDS.register("corridor")
class CorridorReward(RubricReward):
    """``p``: probability that a verdict cites a wrong step; ``seed``: the noise's seed;
    ``dropout``: DRACO's discriminative dropout (on by default, as in the paper);
    ``traps``: "episode" (one trap criterion for the whole corridor, the default) or "room"
    (one per hallway, as a rubric that judges each step's own risk would write)."""

    name = "corridor"

    def __init__(self, *, p: float = 0.0, seed: int = 0, dropout: bool = True, traps: str = "episode") -> None:
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p (the wrong-citation probability) must be in [0, 1], got {p!r}")
        if traps not in TRAP_CRITERIA:
            raise ValueError(f"traps must be one of {TRAP_CRITERIA} (one trap criterion per episode or per hallway), "
                             f"got {traps!r}")
        self.p, self.seed, self.dropout, self.traps = float(p), int(seed), bool(dropout), traps

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return self.score_group(task, trajectories)

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        rooms = int(task.metadata.get("n_rooms", 0))
        valid = Criterion(title=VALID, origin="rule",
                          description="Every message is exactly one open_door(n) call with a valid door.")
        if task.metadata.get("layout") == "locks" and rooms >= 1:
            criteria = [Criterion(title=room_lock(room), origin="rule",
                                  description=f"The door opened in room {room} is the one that opens its lock.")
                        for room in range(1, rooms + 1)]
            verdicts = [self._verdicts(t, criteria + [valid], 0) for t in trajectories]
            return finalize_group(criteria + [valid], verdicts, dropout=self.dropout)
        pivot = int(task.metadata.get("pivot_room", 0))
        if not 1 <= pivot <= rooms:
            raise ValueError(f"task {task.id!r} is not a Corridor task (its metadata lacks pivot_room / n_rooms)")
        criteria = [Criterion(title=TREASURE, origin="rule",
                              description="The door opened in the treasure room is the one hiding the treasure.")]
        if self.traps == "room":
            criteria += [Criterion(title=room_trap(room), origin="rule",
                                   description=f"The door opened in hallway room {room} is not a trap.")
                         for room in range(1, rooms + 1) if room != pivot]
        else:
            criteria.append(Criterion(title=TRAPS, origin="rule", description="No door opened in a hallway is a trap."))
        criteria.append(valid)
        verdicts = [self._verdicts(t, criteria, pivot) for t in trajectories]
        return finalize_group(criteria, verdicts, dropout=self.dropout)

    def _verdicts(self, traj: Trajectory, criteria: list[Criterion], pivot: int) -> list[Verdict]:
        if "visits" not in traj.metrics:
            raise ValueError(f"trajectory of {traj.task.id!r} has no metrics['visits']: not a finished Corridor episode")
        by_room = {room: (step, outcome) for step, room, _door, outcome in traj.metrics["visits"]}
        last = max(len(traj.steps), 1)
        rng = np.random.default_rng([self.seed, _digest(traj)])
        out = []
        for criterion in criteria:
            if criterion.title.startswith("Opens the lock in room "):
                room = int(criterion.title.rsplit(" ", 1)[1])
                step, outcome = by_room.get(room, (last, None))
                out.append(Verdict(criterion=criterion.title, score=1 if outcome == "open" else -1,
                                   cited_steps=[self._cite(step, len(traj.steps), rng)],
                                   evidence=f"room {room}: {outcome or 'never reached'}"))
                continue
            if criterion.title.startswith("Avoids the trap in room "):
                room = int(criterion.title.rsplit(" ", 1)[1])
                step, outcome = by_room.get(room, (last, None))
                out.append(Verdict(criterion=criterion.title, score=1 if outcome == "safe" else -1,
                                   cited_steps=[self._cite(step, len(traj.steps), rng)],
                                   evidence=f"hallway room {room}: {outcome or 'never reached'}"))
                continue
            if criterion.title == TRAPS:
                hallway = [step for step, room, _door, _outcome in traj.metrics["visits"] if room != pivot]
                trapped = [step for step, _room, _door, outcome in traj.metrics["visits"] if outcome == "trap"]
                cited = sorted({self._cite(j, len(traj.steps), rng) for j in trapped or hallway or [last]})
                out.append(Verdict(criterion=TRAPS, score=-1 if trapped else 1, cited_steps=cited,
                                   evidence=f"traps at steps {trapped}" if trapped else "no trap opened"))
                continue
            if criterion.title == VALID:
                opened = {step for step, *_ in traj.metrics["visits"]}
                invalid = [s.index for s in traj.steps if s.index not in opened]
                cited = sorted({self._cite(j, len(traj.steps), rng) for j in invalid or [s.index for s in traj.steps]})
                out.append(Verdict(criterion=VALID, score=-1 if invalid else 1, cited_steps=cited,
                                   evidence=f"invalid messages at steps {invalid}" if invalid else "all valid"))
                continue
            step, outcome = by_room.get(pivot, (last, None))
            passed = outcome in ("treasure", "safe")
            cited = self._cite(step, len(traj.steps), rng)
            evidence = f"treasure room {pivot}: {outcome or 'never reached'}"
            out.append(Verdict(criterion=criterion.title, score=1 if passed else -1, cited_steps=[cited],
                               evidence=evidence))
        return out

    def _cite(self, step: int, n_steps: int, rng: np.random.Generator) -> int:
        """The step a verdict cites: the right one, or with probability p another one."""
        wrong = rng.random() < self.p  # drawn for every verdict, so p changes nothing else
        other = int(rng.integers(1, n_steps)) if n_steps > 1 else step
        if not wrong or n_steps < 2:
            return step
        return other if other < step else other + 1


def _digest(traj: Trajectory) -> int:
    text = traj.task.id + "\x00" + "\x00".join(s.text for s in traj.steps)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
