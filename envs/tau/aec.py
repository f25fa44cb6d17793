"""The τ-bench dialogue as a two-agent PettingZoo AEC environment: ``assistant`` and ``user``.

Either side can be a learner, a frozen model or a script, so the same episode serves training
the agent against a simulated customer, training a customer simulator, or evaluating both.

Turn order follows the benchmark: the assistant's fixed greeting is already said, so the user
acts first (unless the task's history ends with a user message). The assistant's action is
read exactly as in ``TauBenchEnv``: one code block with one tool call runs the tool and the
assistant acts again on its result; text without a block goes to the user, whose turn it
becomes. The user's action is its message (a stop token such as ``###STOP###`` ends the
episode); in domains where the customer has tools of its own (telecom), a user's code block
is a call to one of them. A malformed action is an error observation for its author, who
acts again; nothing malformed reaches the other side.

Each observation is what the acting agent sees new: its system prompt and the conversation
so far on its first turn, then the other side's message or its own tool result. Rewards are 0;
the benchmark's grade is in ``infos[agent]["metrics"]`` when the episode ends.

Observations are ``TextObservation``, a ``str`` that also carries the Text space's ``dtype``:
``pettingzoo.test.api_test`` compares ``observation.dtype`` with the space's, which a plain
``str`` lacks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pettingzoo import AECEnv

from draco_gym.envs.base import MAX_TEXT_CHARS, check_render_mode, text_space, truncate_middle
from draco_gym.envs.tau.backends import Backend, make_backend
from draco_gym.envs.tau.conversation import Conversation, agent_system_prompt, render_lines
from draco_gym.types import Termination

ASSISTANT, USER = "assistant", "user"


class TextObservation(str):
    """A string observation with the ``dtype`` of draco-gym's Text space."""

    __slots__ = ()
    dtype = np.dtype(str)


class TauBenchAEC(AECEnv):
    """The τ-bench dialogue between two agents, ``assistant`` and ``user`` (see the module
    docstring).

    ## Action spaces
    ``UnicodeText`` per agent (``max_length`` = ``max_action_chars``): the assistant's
    message or one tool call in a code block; the user's message (or its own tool call where
    the domain gives the customer tools).

    ## Observation spaces
    ``UnicodeText`` per agent, observations as ``TextObservation``: on an agent's first turn
    its system prompt and the conversation so far, then what is new to it (the other side's
    message, its own tool result or error).

    ## Rewards
    Always 0; the benchmark's grade is in ``infos[agent]["metrics"]`` at the end.

    ## Episode end
    Terminated: ``user_stop``, ``agent_stop``, ``submitted``, ``too_many_errors``.
    Truncated: ``max_steps`` messages of any role, or ``max_turns`` actions of both sides
    together, malformed ones included.

    ## Arguments
    As for ``TauBenchEnv``, without a user simulator (the user is an agent here);
    ``max_action_chars`` is the action spaces' ``max_length`` (what ``sample()`` draws up to).

    ## Version history
    - v0: the initial version.
    """

    metadata = {"name": "tau_bench_aec_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        backend: str | Backend = "tau2",
        domain: str = "mock",
        *,
        task_id: str | int | None = None,
        max_turns: int = 200,
        max_steps: int = 100,
        max_errors: int = 10,
        max_observation_chars: int = 12_000,
        max_action_chars: int = MAX_TEXT_CHARS,
        multi_block: str = "reject",
        render_mode: str | None = None,
        **backend_options: Any,
    ) -> None:
        super().__init__()
        check_render_mode(render_mode, self.metadata)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.backend = backend if isinstance(backend, Backend) else make_backend(backend, domain, **backend_options)
        self.task_id = None if task_id is None else self.backend.check_task(task_id)
        self.conversation = Conversation(self.backend, multi_block=multi_block, max_steps=max_steps, max_errors=max_errors)
        self.max_turns = max_turns
        self.max_observation_chars = max_observation_chars
        self.render_mode = render_mode
        self.possible_agents = [ASSISTANT, USER]
        self.observation_spaces = {a: text_space() for a in self.possible_agents}
        self.action_spaces = {a: text_space(max_action_chars) for a in self.possible_agents}
        self.agents: list[str] = []
        self._observations: dict[str, str] = {}
        self._rng = np.random.default_rng()
        self._turns = 0
        self._last = ""

    def observation_space(self, agent: str):
        return self.observation_spaces[agent]

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        # Other keys are ignored: PettingZoo's api_test passes an arbitrary options dict.
        spec = self.conversation.begin((options or {}).get("task_id", self.task_id), self._rng)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {"task_id": spec.id} for a in self.agents}
        lines = spec.opening.history
        self._observations = {
            ASSISTANT: f"{agent_system_prompt(spec)}\n\n{render_lines(lines, me='agent')}",
            USER: f"{spec.user_system_prompt}\n\n{render_lines(lines, me='user')}",
        }
        self._user_tools = bool(spec.user_tools)
        self._turns = 0
        self._last = ""
        self.agent_selection = USER if spec.opening.user_first else ASSISTANT

    def observe(self, agent: str) -> TextObservation:
        return TextObservation(self._observations.get(agent, ""))

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        other = USER if agent == ASSISTANT else ASSISTANT
        turn = self.conversation.act(agent, action, tools_allowed=agent == ASSISTANT or self._user_tools)
        self._turns += 1
        if turn.kind in ("error", "tool") or "tool_call" in turn.info:
            self._observations[agent] = truncate_middle(turn.observation, self.max_observation_chars)
            self._last = f"[{agent}] {turn.observation}"
        else:
            label = "Agent" if agent == ASSISTANT else "User"
            self._observations[other] = f"{label}: {turn.message}"
            self._last = f"[{agent}] {turn.message}"
            self.agent_selection = other
        ending = self.conversation.ending(turn, agent)
        if ending is None and self._turns >= self.max_turns:
            ending = (Termination.MAX_TURNS, True)
        if ending is not None:
            self._end(*ending)
        self._accumulate_rewards()

    def _end(self, termination: str, truncated: bool) -> None:
        try:
            metrics = self.backend.evaluate(termination)
        except Exception as exc:  # noqa: BLE001 - a grading failure must not lose the episode
            metrics = {"evaluation_error": f"{type(exc).__name__}: {exc}", "termination": termination}
        for a in self.agents:
            (self.truncations if truncated else self.terminations)[a] = True
            self.infos[a] = {**self.infos[a], "metrics": metrics}

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        pass
