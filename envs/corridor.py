"""Corridor: a synthetic code-step environment with exactly one pivotal step.

The agent walks a corridor of rooms and opens one door per room by writing a code block
that calls ``open_door(n)``. One room, the treasure room, is pivotal: the door opened there
alone decides success. Every other room is a hallway whose trap doors cost a coin but never
change the outcome. So each episode has several steps, one of which matters for success,
and a judge-free rubric (``draco_gym.reward.corridor``) can cite exactly that step; this is
the environment of the trainer's learning test and of ``bench/learning.py``.
"""

from __future__ import annotations

import ast
from typing import Any

from draco_gym.envs.base import CodeStepEnv, Execution
from draco_gym.types import Task

PROMPT = (
    "You walk a corridor of {rooms} rooms. In each room open one door by writing exactly one "
    "code block:\n```python\nopen_door(n)\n```\nwhere n is a door number from 0 to {last}. "
    "Hallway doors {traps} hide traps. The treasure is behind one door of the treasure room.\n"
    "Room 1 of {rooms}: {kind}."
)


class CorridorEnv(CodeStepEnv):
    """A corridor of ``n_rooms`` rooms; in room k the agent opens one door with a code block
    ``open_door(n)``. Room ``pivot`` (the task) is the treasure room.

    ## Spaces
    Action and observation are ``Text`` spaces over all of Unicode (one assistant message
    in, one observation out), as in every code-step environment.

    ## Tasks
    One task per treasure-room position: ``corridor-1`` .. ``corridor-{n_rooms}``
    (``task_ids``); ``reset(options={"task_id": ...})`` picks one, otherwise the seed does.
    The first observation is the agent prompt, ending with the first room's description;
    after each door the next room is described ("Room 3 of 4: the treasure room.").

    ## Steps and episode end
    A message whose code block is a single call ``open_door(n)`` with an integer literal
    ``0 <= n < n_doors`` opens that door and moves to the next room. Opening a trap door in
    a hallway raises ``TrapError`` in the agent's output and costs a coin, but the agent
    still moves on. Anything else (no block, several calls, another function, a bad door)
    is an error observation, and the agent stays in the room. The episode terminates
    (``submitted``) after the last room and is truncated after ``max_turns`` messages.

    ## Reward and evaluation
    The Gymnasium reward is 0, as in every code-step environment. ``trajectory.metrics``
    holds ``success`` (the treasure door was opened: decided by the pivotal step alone),
    ``traps`` (trap doors opened), ``pivot_step`` (the step that opened a door in the
    treasure room, or 0) and ``visits``: one ``[step, room, door, outcome]`` per door
    opened, outcome ``"treasure"``, ``"empty"``, ``"trap"`` or ``"safe"``, which the
    ``corridor`` reward cites (its trap criterion is one for the corridor, or with
    ``traps="room"`` one per hallway; ``bench/learning.py`` uses the latter).

    ## Arguments
    - ``n_rooms`` (4): rooms per corridor, >= 2, so every episode has non-pivotal steps.
    - ``n_doors`` (4): doors per room.
    - ``treasure_door`` (3): the treasure room's winning door; chance is ``1/n_doors``.
    - ``trap_doors`` ((2,)): the hallway doors that hide traps.
    - ``max_turns`` (``2 * n_rooms``), ``max_observation_chars``, ``multi_block``: as in
      ``CodeStepEnv``. The end rule is ``task_completed``: a message without code does not
      end the episode, since leaving the corridor early is not a way through it.

    ## Version history
    - v0: first version.
    """

    can_restore = True

    def __init__(self, *, n_rooms: int = 4, n_doors: int = 4, treasure_door: int = 3,
                 trap_doors: tuple[int, ...] | list[int] = (2,), max_turns: int | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(n_rooms, int) or n_rooms < 2:
            raise ValueError(f"n_rooms must be an integer >= 2 (one treasure room and at least one hallway), got {n_rooms!r}")
        if not isinstance(n_doors, int) or n_doors < 2:
            raise ValueError(f"n_doors must be an integer >= 2, got {n_doors!r}")
        if not 0 <= treasure_door < n_doors:
            raise ValueError(f"treasure_door must be a door number in 0..{n_doors - 1}, got {treasure_door!r}")
        traps = tuple(int(d) for d in trap_doors)
        if any(not 0 <= d < n_doors for d in traps) or len(set(traps)) >= n_doors:
            raise ValueError(f"trap_doors must be distinct doors in 0..{n_doors - 1}, leaving one safe door; got {trap_doors!r}")
        kwargs.setdefault("end_rule", "task_completed")
        super().__init__(max_turns=max_turns or 2 * n_rooms, **kwargs)
        self.n_rooms, self.n_doors, self.treasure_door, self.trap_doors = n_rooms, n_doors, treasure_door, traps
        self.task_ids = [f"corridor-{k}" for k in range(1, n_rooms + 1)]
        self._pivot = 1
        self._room = 1
        self._visits: list[list] = []

    def reference_messages(self, task_id: str) -> list[str]:
        """A reference solution of ``task_id``: the treasure door in the treasure room, the
        lowest safe door in every hallway (demonstrations for a supervised warm start)."""
        if task_id not in self.task_ids:
            raise ValueError(f"unknown task_id {task_id!r}; this corridor has {self.task_ids}")
        pivot = int(task_id.rsplit("-", 1)[1])
        safe = min(d for d in range(self.n_doors) if d not in self.trap_doors)
        return [f"```python\nopen_door({self.treasure_door if room == pivot else safe})\n```"
                for room in range(1, self.n_rooms + 1)]

    def describe(self, room: int) -> str:
        kind = "the treasure room" if room == self._pivot else "a hallway"
        return f"Room {room} of {self.n_rooms}: {kind}."

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        task_id = options.get("task_id")
        if task_id is None:
            task_id = self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        if task_id not in self.task_ids:
            raise ValueError(f"unknown task_id {task_id!r}; this corridor has {self.task_ids}")
        self._pivot = int(task_id.rsplit("-", 1)[1])
        self._room, self._visits = 1, []
        kind = "the treasure room" if self._pivot == 1 else "a hallway"
        prompt = PROMPT.format(rooms=self.n_rooms, last=self.n_doors - 1, kind=kind,
                               traps=" and ".join(map(str, self.trap_doors)) or "(none)")
        return Task(id=task_id, instruction=f"Find the treasure; it is in room {self._pivot}.", agent_prompt=prompt,
                    metadata={"pivot_room": self._pivot, "n_rooms": self.n_rooms})

    def _execute(self, code: str) -> Execution:
        door, problem = self._door(code)
        if problem:
            return Execution(output=f"Error: {problem}\n{self.describe(self._room)}", error=problem)
        step = len(self._steps) + 1
        if self._room == self._pivot:
            outcome = "treasure" if door == self.treasure_door else "empty"
            output = "You found the treasure!" if outcome == "treasure" else "The room behind the door is empty."
        else:
            outcome = "trap" if door in self.trap_doors else "safe"
            output = (f"Traceback (most recent call last):\nTrapError: door {door} was a trap; you lose a coin."
                      if outcome == "trap" else "The door opens onto the corridor.")
        self._visits.append([step, self._room, door, outcome])
        self._room += 1
        if self._room > self.n_rooms:
            return Execution(output=output + "\nYou reached the end of the corridor.", submitted=True,
                             error="TrapError" if outcome == "trap" else None)
        return Execution(output=f"{output}\n{self.describe(self._room)}",
                         error="TrapError" if outcome == "trap" else None)

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
        if not 0 <= door < self.n_doors:
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
        pivot = [v for v in self._visits if v[1] == self._pivot]
        return {
            "success": bool(pivot) and pivot[0][3] == "treasure",
            "traps": sum(v[3] == "trap" for v in self._visits),
            "pivot_step": pivot[0][0] if pivot else 0,
            "rooms_done": len(self._visits),
            "visits": [list(v) for v in self._visits],
        }
