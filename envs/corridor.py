"""Corridor: a synthetic code-step environment whose steps a rubric can cite exactly.

The agent walks a corridor of rooms and opens one door per room by writing a code block
that calls ``open_door(n)``. Two layouts:

- ``treasure`` (the learning test's): one room, the treasure room, is pivotal: the door
  opened there alone decides success. Every other room is a hallway whose trap doors cost a
  coin but never change the outcome. Door numbers are the same in every room.
- ``locks`` (``bench/learning.py``'s): every room is its own decision. One door of each
  room opens its lock, a different one per room and per task; success is every lock
  opened. Each room of each task has its own door numbers (``doors(task_id, room)``), so a
  policy whose every action is one token has a separate set of tokens for every decision,
  as the tabular simulation of ``draco-gym bench credit`` has a separate logit row per step.

A judge-free rubric (``draco_gym.reward.corridor``) cites the step behind each verdict.
"""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from draco_gym.envs.base import CodeStepEnv, Execution
from draco_gym.types import Task

PROMPT = (
    "You walk a corridor of {rooms} rooms. In each room open one door by writing exactly one "
    "code block:\n```python\nopen_door(n)\n```\nwhere n is a door number from 0 to {last}. "
    "Hallway doors {traps} hide traps. The treasure is behind one door of the treasure room.\n"
    "Room 1 of {rooms}: {kind}."
)
LOCKS_PROMPT = (
    "You walk corridor {corridor}, {rooms} rooms long. One door of every room opens its lock; "
    "a locked door costs a coin. In each room open one door by writing exactly one code block:\n"
    "```python\nopen_door(n)\n```\nwhere n is one of the room's door numbers.\n{room}"
)
LAYOUTS = ("treasure", "locks")


class CorridorEnv(CodeStepEnv):
    """A corridor of ``n_rooms`` rooms; in room k the agent opens one door with a code block
    ``open_door(n)``.

    ## Spaces
    Action and observation are ``Text`` spaces over all of Unicode (one assistant message
    in, one observation out), as in every code-step environment.

    ## Tasks
    ``treasure``: one task per treasure-room position, ``corridor-1`` .. ``corridor-{n_rooms}``.
    ``locks``: ``n_tasks`` corridors, ``corridor-1`` .. ``corridor-{n_tasks}``, each with its
    own right door per room. ``task_ids`` lists them; ``reset(options={"task_id": ...})``
    picks one, otherwise the seed does. The first observation is the agent prompt, ending
    with the first room's description; after each door the next room is described
    ("Room 3 of 4: the treasure room.", or under ``locks`` "Corridor 2, room 3 of 4: its doors
    are open_door(230), open_door(231) and open_door(232).").

    ## Steps and episode end
    A message whose code block is a single call ``open_door(n)`` with an integer literal
    naming one of the room's doors opens that door and moves to the next room: under
    ``treasure`` the doors are ``0 .. n_doors - 1`` in every room, under ``locks`` room k of
    corridor t has the doors ``100 t + 10 k + d``, d in ``0 .. n_doors - 1``
    (``doors(task_id, room)``). A trap door in a hallway (``TrapError``) or a locked door
    (``LockedError``) raises in the agent's output and costs a coin, but the agent still
    moves on. Anything else (no block, several calls, another function, a door not in this
    room) is an error observation, and the agent stays in the room. The episode terminates
    (``submitted``) after the last room and is truncated after ``max_turns`` messages.

    ## Reward and evaluation
    The Gymnasium reward is 0, as in every code-step environment. ``trajectory.metrics``
    holds ``success`` (``treasure``: the treasure door was opened, decided by the pivotal step
    alone; ``locks``: every room's lock was opened), ``traps`` (trap doors opened; ``locks``:
    ``locked``, locked doors opened), ``pivot_step`` (``treasure``: the step that opened a
    door in the treasure room, or 0), ``rooms_done`` and ``visits``: one ``[step, room, door,
    outcome]`` per door opened, outcome ``"treasure"``, ``"empty"``, ``"trap"``, ``"safe"``,
    ``"open"`` or ``"locked"``, which the ``corridor`` reward cites. Each step's
    ``info["state_key"]`` names the room it was taken in (``"start"`` for room 1), the
    state TRCA compares steps by. A ``locks`` task's ``metadata["answer"]`` is its right doors
    ("312, 320, 331, 342"), the gold answer TRACE's reference scores.

    ## Arguments
    - ``layout`` ("treasure"): ``treasure`` or ``locks`` (see above).
    - ``n_rooms`` (4): rooms per corridor, >= 2 (``locks``: at most 9).
    - ``n_doors`` (4): doors per room (``locks``: at most 10).
    - ``treasure_door`` (3), ``trap_doors`` ((2,)): ``treasure``'s winning door (chance is
      ``1/n_doors``) and the hallway doors that hide traps; ``locks`` has neither.
    - ``n_tasks`` (4), ``lock_seed`` (0): ``locks``'s corridors (at most 9) and the seed its
      right doors are drawn from, one per task and room.
    - ``max_turns`` (``2 * n_rooms``), ``max_observation_chars``, ``multi_block``: as in
      ``CodeStepEnv``. The end rule is ``task_completed``: a message without code does not
      end the episode, since leaving the corridor early is not a way through it.

    ## Version history
    - v0: first version; the ``locks`` layout and the state keys were added within v0
      (``treasure`` episodes are unchanged).
    """

    can_restore = True
    names_states = True

    def __init__(self, *, layout: str = "treasure", n_rooms: int = 4, n_doors: int = 4, treasure_door: int = 3,
                 trap_doors: tuple[int, ...] | list[int] = (2,), n_tasks: int = 4, lock_seed: int = 0,
                 max_turns: int | None = None, **kwargs: Any) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not isinstance(n_rooms, int) or n_rooms < 2:
            raise ValueError(f"n_rooms must be an integer >= 2 (one treasure room and at least one hallway), got {n_rooms!r}")
        if not isinstance(n_doors, int) or n_doors < 2:
            raise ValueError(f"n_doors must be an integer >= 2, got {n_doors!r}")
        if layout == "locks":
            if n_rooms > 9 or n_doors > 10 or not isinstance(n_tasks, int) or not 1 <= n_tasks <= 9:
                raise ValueError(f"the locks layout numbers doors 100 t + 10 k + d: it takes n_rooms <= 9, n_doors <= 10 "
                                 f"and 1 <= n_tasks <= 9, got n_rooms={n_rooms!r}, n_doors={n_doors!r}, n_tasks={n_tasks!r}")
        traps = tuple(int(d) for d in trap_doors)
        if layout == "treasure" and not 0 <= treasure_door < n_doors:
            raise ValueError(f"treasure_door must be a door number in 0..{n_doors - 1}, got {treasure_door!r}")
        if layout == "treasure" and (any(not 0 <= d < n_doors for d in traps) or len(set(traps)) >= n_doors):
            raise ValueError(f"trap_doors must be distinct doors in 0..{n_doors - 1}, leaving one safe door; got {trap_doors!r}")
        kwargs.setdefault("end_rule", "task_completed")
        super().__init__(max_turns=max_turns or 2 * n_rooms, **kwargs)
        self.layout = layout
        self.n_rooms, self.n_doors, self.treasure_door, self.trap_doors = n_rooms, n_doors, treasure_door, traps
        self.n_tasks = n_tasks if layout == "locks" else n_rooms
        self.lock_seed = int(lock_seed)
        self.task_ids = [f"corridor-{k}" for k in range(1, self.n_tasks + 1)]
        self._corridor = 1  # the task's number: treasure, the treasure room; locks, the corridor
        self._pivot = 1
        self._room = 1
        self._visits: list[list] = []

    # -- the layout ------------------------------------------------------------------------

    def _task_number(self, task_id: str) -> int:
        if task_id not in self.task_ids:
            raise ValueError(f"unknown task_id {task_id!r}; this corridor has {self.task_ids}")
        return int(task_id.rsplit("-", 1)[1])

    def doors(self, task_id: str, room: int) -> list[int]:
        """The door numbers of ``room`` (1-based) in ``task_id``'s corridor."""
        if not 1 <= room <= self.n_rooms:
            raise ValueError(f"room must be in 1..{self.n_rooms}, got {room!r}")
        return self._doors(self._task_number(task_id), room)

    def right_door(self, task_id: str, room: int) -> int:
        """The door that opens ``room``'s lock (``locks``), drawn per task and room from ``lock_seed``."""
        if self.layout != "locks":
            raise ValueError("right_door belongs to the locks layout; the treasure layout has one treasure_door")
        if not 1 <= room <= self.n_rooms:
            raise ValueError(f"room must be in 1..{self.n_rooms}, got {room!r}")
        return self._right_door(self._task_number(task_id), room)

    def _doors(self, corridor: int, room: int) -> list[int]:
        if self.layout == "treasure":
            return list(range(self.n_doors))
        return [100 * corridor + 10 * room + d for d in range(self.n_doors)]

    def _right_door(self, corridor: int, room: int) -> int:
        pick = int(np.random.default_rng([self.lock_seed, corridor, room]).integers(self.n_doors))
        return self._doors(corridor, room)[pick]

    def reference_messages(self, task_id: str) -> list[str]:
        """A reference solution of ``task_id`` (demonstrations for a supervised warm start):
        ``treasure``, the treasure door in the treasure room and the lowest safe door in every
        hallway; ``locks``, every room's right door."""
        corridor = self._task_number(task_id)
        if self.layout == "locks":
            return [_open(self._right_door(corridor, room)) for room in range(1, self.n_rooms + 1)]
        safe = min(d for d in range(self.n_doors) if d not in self.trap_doors)
        return [_open(self.treasure_door if room == corridor else safe) for room in range(1, self.n_rooms + 1)]

    def describe(self, room: int) -> str:
        if self.layout == "locks":
            calls = [f"open_door({d})" for d in self._doors(self._corridor, room)]
            return (f"Corridor {self._corridor}, room {room} of {self.n_rooms}: its doors are "
                    f"{', '.join(calls[:-1])} and {calls[-1]}.")
        kind = "the treasure room" if room == self._pivot else "a hallway"
        return f"Room {room} of {self.n_rooms}: {kind}."

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        task_id = options.get("task_id")
        if task_id is None:
            task_id = self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        self._corridor = self._task_number(task_id)
        self._room, self._visits = 1, []
        if self.layout == "locks":
            self._pivot = 0
            answer = ", ".join(str(self._right_door(self._corridor, room)) for room in range(1, self.n_rooms + 1))
            prompt = LOCKS_PROMPT.format(corridor=self._corridor, rooms=self.n_rooms, room=self.describe(1))
            return Task(id=task_id, instruction=f"Open every lock of corridor {self._corridor}.", agent_prompt=prompt,
                        metadata={"layout": "locks", "n_rooms": self.n_rooms, "answer": answer})
        self._pivot = self._corridor
        kind = "the treasure room" if self._pivot == 1 else "a hallway"
        prompt = PROMPT.format(rooms=self.n_rooms, last=self.n_doors - 1, kind=kind,
                               traps=" and ".join(map(str, self.trap_doors)) or "(none)")
        return Task(id=task_id, instruction=f"Find the treasure; it is in room {self._pivot}.", agent_prompt=prompt,
                    metadata={"pivot_room": self._pivot, "n_rooms": self.n_rooms})

    def _outcome(self, door: int) -> tuple[str, str, str | None]:
        """(outcome, what the agent reads, the error it raised) for ``door`` in the current room."""
        if self.layout == "locks":
            if door == self._right_door(self._corridor, self._room):
                return "open", "The lock opens.", None
            return "locked", (f"Traceback (most recent call last):\nLockedError: door {door} is locked; "
                              "you lose a coin."), "LockedError"
        if self._room == self._pivot:
            if door == self.treasure_door:
                return "treasure", "You found the treasure!", None
            return "empty", "The room behind the door is empty.", None
        if door in self.trap_doors:
            return "trap", f"Traceback (most recent call last):\nTrapError: door {door} was a trap; you lose a coin.", "TrapError"
        return "safe", "The door opens onto the corridor.", None

    def _execute(self, code: str) -> Execution:
        door, problem = self._door(code)
        if problem:
            return Execution(output=f"Error: {problem}\n{self.describe(self._room)}", error=problem)
        outcome, output, error = self._outcome(door)
        self._visits.append([len(self._steps) + 1, self._room, door, outcome])
        self._room += 1
        # The agent moves on whatever the door did, a raising one included: the next step's
        # state is the next room (CodeStepEnv keeps the key of a block that raised).
        self._state_key = self._state_key_after(code)
        if self._room > self.n_rooms:
            return Execution(output=output + "\nYou reached the end of the corridor.", submitted=True, error=error)
        return Execution(output=f"{output}\n{self.describe(self._room)}", error=error)

    def _state_key_after(self, code: str) -> str | None:
        return f"room {self._room}"

    def _door(self, code: str) -> tuple[int | None, str | None]:
        """The door of a single ``open_door(<int>)`` call, or why the code is not one."""
        try:
            tree = ast.parse(code.strip())
        except SyntaxError as exc:
            return None, f"SyntaxError: {exc.msg}"
        calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        if len(tree.body) != 1 or len(calls) != 1:
            return None, "write exactly one call, open_door(n)"
        call = calls[0]
        if not (isinstance(call.func, ast.Name) and call.func.id == "open_door"):
            return None, "the only function here is open_door(n)"
        if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Constant) \
                or not isinstance(call.args[0].value, int) or isinstance(call.args[0].value, bool):
            return None, "open_door takes one integer door number"
        door = call.args[0].value
        here = self._doors(self._corridor, self._room)
        if door not in here:
            if self.layout == "locks":
                return None, f"there is no door {door} in this room; its doors are {', '.join(map(str, here))}"
            return None, f"there is no door {door}; doors are 0 to {self.n_doors - 1}"
        return door, None

    def trajectory(self):
        """The episode so far; its metrics are current also when the trainer cut the episode
        short (token budget), so the rubric can judge the rooms that were reached."""
        traj = super().trajectory()
        if self._task is not None and "visits" not in traj.metrics:
            traj.metrics = {**self._evaluate(), **traj.metrics}
        return traj

    def _evaluate(self) -> dict[str, Any]:
        visits = [list(v) for v in self._visits]
        if self.layout == "locks":
            return {"success": len(visits) == self.n_rooms and all(v[3] == "open" for v in visits),
                    "locked": sum(v[3] == "locked" for v in visits), "rooms_done": len(visits), "visits": visits}
        pivot = [v for v in self._visits if v[1] == self._pivot]
        return {
            "success": bool(pivot) and pivot[0][3] == "treasure",
            "traps": sum(v[3] == "trap" for v in self._visits),
            "pivot_step": pivot[0][0] if pivot else 0,
            "rooms_done": len(visits),
            "visits": visits,
        }


def _open(door: int) -> str:
    return f"```python\nopen_door({door})\n```"
