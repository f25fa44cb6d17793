"""τ-bench as a code-step Gymnasium environment: ``draco_gym/TauBench-v0``.

    env = gym.make("draco_gym/TauBench-v0", backend="tau2", domain="retail", task_id="0",
                   user={"type": "llm", "model": "gpt-4.1", "base_url": "http://127.0.0.1:8000/v1"})

One step is one agent message. A message with one code block holding one tool call runs that
tool (``actions.py`` says what a well-formed call is); a message with no code block is said to
the customer, whose reply is the next observation; anything malformed is an error observation
for the agent alone, and the episode goes on. The episode ends when the customer writes a
stop token (termination ``user_stop``), the agent writes ``###STOP###`` (``agent_stop``), the
official limits are hit (``max_steps`` messages of any role, ``max_errors`` failed tool
calls), ``max_turns`` agent messages pass, or the user simulator fails (``env_error``).

The first observation is the agent prompt: instructions, the domain policy, the tool
signatures, then the conversation so far (the agent's fixed greeting and the customer's first
message). At the end ``info["metrics"]`` holds the benchmark's own grade (``reward``,
``success``, ``db_match`` and the full evaluation record) plus the user's description
(model and endpoint for an LLM user). The Gymnasium reward is 0, as for every draco-gym env.
"""

from __future__ import annotations

from typing import Any


from draco_gym.codeblock import MultiBlockPolicy
from draco_gym.envs.base import CodeStepEnv, Outcome
from draco_gym.envs.tau.backends import Backend, BackendError, make_backend
from draco_gym.envs.tau.conversation import (
    LANGUAGES,
    Conversation,
    Turn,
    agent_system_prompt,
    render_lines,
)
from draco_gym.envs.tau.users import User, UserContext, make_user
from draco_gym.types import STATE_KEY, Task, Termination


class TauBenchEnv(CodeStepEnv):
    """τ-bench's customer-service dialogue; one step is one agent message (see the module
    docstring).

    ## Action space
    ``UnicodeText``: the agent message. One code block holding one tool call with keyword
    literal arguments (Python or JSON form) runs the tool; no code block is a message to the
    customer.

    ## Observation space
    ``UnicodeText``: at reset the agent prompt (instructions, policy, tool signatures, the
    conversation so far); after a step the tool's result, the customer's reply
    (``"User: ..."``) or an error, cut in the middle to ``max_observation_chars``.

    ## Rewards
    Always 0. The benchmark's grade (``reward``, ``success``, ``db_match``, ...) is in
    ``info["metrics"]`` at the end.

    ## Episode end
    Terminated: ``user_stop`` (the customer's stop token), ``agent_stop`` (``###STOP###``),
    ``submitted`` (a tool that ends the task), ``too_many_errors`` (``max_errors`` failed
    tool calls), ``env_error`` (the user simulator failed). Truncated: ``max_steps``
    messages of any role, or ``max_turns`` agent messages.

    ## State key
    ``info["state_key"]`` (``draco_gym.types.STATE_KEY``) names the state the step was
    taken in: the last tool that ran without error (``"none"`` before any) and the
    conversation stage, the number of customer replies so far, as
    ``"<tool>@customer_turns=<n>"``. Steps of a group with equal keys are compared by
    TRCA's credit.

    ## Arguments
    ``backend`` is "tau2", "tau_bench" or a built ``Backend`` (share one across envs to load
    the task set once); other keyword arguments go to the backend (``task_split``,
    ``retrieval_variant``, ``env_kwargs``, ``keep_noop_tasks``, ...). ``domain`` picks the
    domain. ``task_id`` fixes the task; otherwise ``reset(options={"task_id": ...})`` picks
    it, or the seed does from ``task_ids``, the default task set: the tasks a no-op passes
    (``backends.NOOP_PASSING``) are left out unless ``keep_noop_tasks=True``. ``user``: an
    LLM user (a dict or ``LLMUser``) or a scripted one.

    ## Version history
    - v0: the initial version; since this release each step's info carries ``state_key``
      (an addition only: episodes, observations and metrics are unchanged).
    """

    def __init__(
        self,
        backend: str | Backend = "tau2",
        domain: str = "mock",
        *,
        task_id: str | int | None = None,
        user: User | str | dict[str, Any] | None = None,
        max_turns: int = 50,
        max_steps: int = 100,
        max_errors: int = 10,
        max_observation_chars: int = 12_000,
        multi_block: MultiBlockPolicy = "reject",
        render_mode: str | None = None,
        **backend_options: Any,
    ) -> None:
        super().__init__(
            max_turns=max_turns,
            max_observation_chars=max_observation_chars,
            multi_block=multi_block,
            languages=LANGUAGES,
            render_mode=render_mode,
        )
        self.backend = backend if isinstance(backend, Backend) else make_backend(backend, domain, **backend_options)
        self.user = make_user(user)
        self.task_id = None if task_id is None else self.backend.check_task(task_id)
        self.conversation = Conversation(self.backend, multi_block=multi_block, max_steps=max_steps, max_errors=max_errors)
        self._system_prompt = ""
        self._opening = ""
        self._last_tool = "none"
        self._customer_turns = 0

    @property
    def task_ids(self) -> list[str]:
        """The backend's default task set (what a trainer or ``draco-gym eval`` iterates): every
        task but those a no-op passes (``backends.NOOP_PASSING``), which still run when named
        (and are kept with ``keep_noop_tasks=True``)."""
        return self.backend.task_ids()

    # -- CodeStepEnv hooks -----------------------------------------------------------------

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        unknown = sorted(set(options) - {"task_id"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; TauBench accepts only 'task_id'")
        spec = self.conversation.begin(options.get("task_id", self.task_id), self.np_random)
        self._last_tool, self._customer_turns = "none", 0
        lines = list(spec.opening.history)
        # The user answers the last agent line itself; tool traffic is not part of its view.
        before = lines[:-1] if spec.opening.user_first else lines
        self.user.reset(
            UserContext(
                instructions=spec.instruction,
                system_prompt=spec.user_system_prompt,
                tools=spec.user_tools,
                call_tool=self.conversation.user_tool_output if spec.user_tools else None,
                history=[(who, text) for who, text in before if who in ("agent", "user") and not text.startswith("[tool call]")],
            )
        )
        if spec.opening.user_first:
            turn = self.conversation.act("user", self.user.respond(lines[-1][1]), tools_allowed=False)
            if turn.kind == "error":
                raise BackendError(f"the user simulator's opening message is unusable: {turn.info['action_error']}")
            lines.append(("user", turn.message or ""))
        self._system_prompt = agent_system_prompt(spec)
        self._opening = render_lines(lines, me="agent")
        return Task(
            id=spec.id,
            instruction=spec.instruction,
            agent_prompt=f"{self._system_prompt}\n\n{self._opening}",
            metadata={**spec.metadata, "user": self.user.describe()},
        )

    def _evaluate(self) -> dict[str, Any]:
        grade = self.backend.evaluate(self.termination or "")
        return {
            **grade,
            "user": self.user.describe(),
            "messages": self.conversation.steps,
            "tool_errors": self.conversation.tool_errors,
        }

    # -- Gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        observation, info = super().reset(seed=seed, options=options)
        return observation, {**info, "user": self.user.describe()}

    def _act(self, action: str) -> Outcome:
        """A tool call runs; a message goes to the customer, whose reply is the observation."""
        turn = self.conversation.act("assistant", action)
        info: dict[str, Any] = {**turn.info, STATE_KEY: f"{self._last_tool}@customer_turns={self._customer_turns}"}
        if "tool_call" in turn.info and not turn.info.get("tool_error"):
            self._last_tool = turn.info["tool_call"].partition("(")[0]
        outcome = Outcome(turn.observation, code=info.get("tool_call"), info=info, parse_error=turn.kind == "error",
                          exec_error=turn.kind == "tool" and bool(turn.info["tool_error"]))
        ending = self.conversation.ending(turn, "assistant")
        if turn.kind == "message":
            ending, outcome.observation = self._user_reply(turn.message or "", info)
        if ending is not None:
            termination, truncated = ending
            if truncated:
                outcome.truncation = termination
            else:
                outcome.termination = termination
        return outcome

    def _user_reply(self, message: str, info: dict[str, Any]) -> tuple[tuple[str, bool] | None, str]:
        """Send the agent's message to the customer; returns (the episode's ending or None,
        the observation)."""
        try:
            reply = self.user.respond(message)
        except Exception as exc:  # noqa: BLE001 - a broken user simulator ends the episode, recorded
            info["user_error"] = f"{type(exc).__name__}: {exc}"
            return (Termination.ENV_ERROR, False), ""
        turn: Turn = self.conversation.act("user", reply, tools_allowed=False)
        if turn.kind == "error":  # the simulator said nothing: the conversation cannot go on
            info["user_error"] = turn.info["action_error"]
            return (Termination.ENV_ERROR, False), ""
        info["user_message"] = turn.message
        self._customer_turns += 1
        return self.conversation.ending(turn, "user"), f"User: {turn.message}"

    # -- chat view -------------------------------------------------------------------------

    def chat_messages(self) -> list[dict[str, str]]:
        """The episode so far as chat messages for a policy: the agent prompt as system
        message, the opening as first user message, then each step's action and observation."""
        messages = [{"role": "system", "content": self._system_prompt}, {"role": "user", "content": self._opening}]
        for step in self.trajectory().steps:
            messages.append({"role": "assistant", "content": step.text})
            if step.observation:
                messages.append({"role": "user", "content": step.observation})
        return messages
