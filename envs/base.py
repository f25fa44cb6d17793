"""The code-step environment: one Gymnasium step is one assistant message.

Every text tool-use environment in draco-gym (AppWorld, tau-bench, PythonTools, yours)
subclasses ``CodeStepEnv`` and implements these hooks:

    _start(seed, options) -> Task   pick and load the task; Task.agent_prompt is the first
                                    observation
    _execute(code) -> Execution     run one code block in the task's world
    _evaluate() -> dict             the environment's own evaluation, once, at episode end
    _act(action) -> Outcome         what one message does; by default: find its code block
                                    and ``_execute`` it. An environment whose action is not
                                    a code block to run (tau-bench: a tool call or a message
                                    to the customer) overrides this one hook, never ``step``.
    _state_key_after(code) -> str | None
                                    (with ``names_states = True``) the state key after a
                                    block that ran without error, None when it changed
                                    nothing; ``info["state_key"]`` of each step is then the
                                    key of the state it was taken in (``envs/state_keys.py``)

An environment whose world lives in another process that can die or hang (an interpreter,
an engine server) implements ``_run`` and ``_restart`` instead of ``_execute``:

    _run(code) -> Execution         run one block; raise ``WorldLost`` when the process died
                                    or stopped answering
    _restart()                      a fresh process holding the task as reset left it

The default ``_execute`` then keeps every block that ran and, when the process is lost,
restarts it and replays them (``_recover``), so the agent's earlier work survives; the lost
block is reported failed and not replayed, and when the replay fails too the episode ends
with termination ``env_error``.

The base class owns everything that must behave the same across environments: finding the
code block (``draco_gym.codeblock``), the end rule, the turn budget, observation truncation,
valid text and bounded data out of whatever the agent's code produced (``draco_gym.text``),
and recording the episode as a ``Trajectory``. The Gymnasium reward is always 0: in this
library rewards come from the rubric layer, which sees the whole group of rollouts.

End rules (``end_rule``):
  - ``"no_code"`` (DRACO, default): the episode ends when a message carries no code block,
    so a short closing message after the task is submitted is the normal ending.
  - ``"task_completed"`` (LOOP): the episode ends when the environment reports the task
    submitted; a message without code is an error observation.
The episode is truncated (``max_turns``) after ``max_turns`` messages.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from draco_gym.codeblock import DEFAULT_LANGUAGES, MULTI_BLOCK_POLICIES, MultiBlockPolicy, parse_message
from draco_gym.envs.state_keys import START
from draco_gym.text import truncate_middle, valid_data, valid_text
from draco_gym.types import STATE_KEY, TOOL_CALLS, Step, Task, Termination, Trajectory

EndRule = Literal["no_code", "task_completed"]
END_RULES: tuple[str, ...] = ("no_code", "task_completed")

MAX_TEXT_CHARS = 1_000_000
"""Upper bound on the length of any message or observation (the Text spaces' max_length)."""


@functools.lru_cache(maxsize=1)
def unicode_charset() -> str:
    """Every Unicode scalar value (surrogates excluded)."""
    return "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


class UnicodeText(spaces.Text):
    """A ``Text`` space over all of Unicode.

    Gymnasium's ``Text`` defaults to an alphanumeric charset, and ``check_env`` then rejects
    any observation holding a newline or a brace, i.e. every real tool output. Over the
    full charset, ``Text.__init__`` would build a set, a list and an index of 1.1 million
    one-character strings: ~3 s and ~210 MiB in every process that builds an environment
    (the driver and each env runner). Here ``contains`` asks only that every character be a
    Unicode scalar value (no lone surrogate), and the tables are built on first use by what
    needs them (``sample``, flattening); the space pickles as its arguments."""

    def __init__(self, max_length: int = 1_000_000, min_length: int = 0) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length}, {max_length}")
        self.min_length, self.max_length = int(min_length), int(max_length)
        spaces.Space.__init__(self, dtype=str)

    def contains(self, x: Any) -> bool:
        return (isinstance(x, str) and self.min_length <= len(x) <= self.max_length
                and _SURROGATE.search(x) is None)

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, UnicodeText) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    @functools.cached_property
    def _char_set(self) -> frozenset[str]:
        return _unicode_tables()[0]

    @functools.cached_property
    def _char_list(self) -> tuple[str, ...]:
        return _unicode_tables()[1]

    @functools.cached_property
    def _char_index(self) -> dict[str, np.int32]:
        return {c: np.int32(i) for i, c in enumerate(self._char_list)}

    @functools.cached_property
    def _char_str(self) -> str:
        return unicode_charset()

    def __reduce__(self):
        return (type(self), (self.max_length, self.min_length))

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


# What no Unicode scalar value is: a lone surrogate (a Python str can hold one).
_SURROGATE = re.compile("[\ud800-\udfff]")


@functools.lru_cache(maxsize=1)
def _unicode_tables() -> tuple[frozenset[str], tuple[str, ...]]:
    chars = unicode_charset()
    return frozenset(chars), tuple(chars)


def text_space(max_length: int = MAX_TEXT_CHARS) -> UnicodeText:
    """The Text space of every code-step message and observation."""
    return UnicodeText(max_length=max_length)


@dataclass(frozen=True)
class Execution:
    """What running one code block produced.

    ``error`` is a short description when the code failed (the agent sees it inside
    ``output``); ``submitted`` is the environment's completion signal; ``fatal`` means the
    environment itself broke and the episode cannot go on (termination ``env_error``).
    ``tool_calls``, where the environment observes them, are the block's tool calls
    (``draco_gym.types.TOOL_CALLS``), recorded in the step's info.
    """

    output: str
    error: str | None = None
    submitted: bool = False
    fatal: bool = False
    tool_calls: list[dict[str, Any]] | None = None


class WorldLost(RuntimeError):
    """The process holding the episode's world died or stopped answering while running a
    block, which therefore had no effect. ``error`` is the label the step reports."""

    def __init__(self, message: str, error: str = "world_lost") -> None:
        super().__init__(message)
        self.error = error


@dataclass
class Outcome:
    """What one agent message did.

    ``code`` is recorded as the step's code (what ran); ``termination`` or ``truncation`` (a
    ``Termination`` value) ends the episode; ``parse_error`` and ``exec_error`` count into the
    episode's metrics; ``info`` joins the step's info.
    """

    observation: str
    code: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    termination: str | None = None
    truncation: str | None = None
    parse_error: bool = False
    exec_error: bool = False


def check_render_mode(render_mode: str | None, metadata: dict) -> None:
    if render_mode is not None and render_mode not in metadata["render_modes"]:
        raise ValueError(f"render_mode must be one of {metadata['render_modes']}, got {render_mode!r}")


class CodeStepEnv(gym.Env[str, str]):
    """Base class of every code-step environment (see the module docstring for the hooks).

    ## Action space
    ``UnicodeText``: one assistant message.

    ## Observation space
    ``UnicodeText``: the agent prompt at reset, then what the message produced, cut in the
    middle to ``max_observation_chars``.

    ## Rewards
    Always 0; the environment's own evaluation is in ``info["metrics"]`` at the end.

    ## Episode end
    Terminated by the end rule (``no_code`` or ``submitted``), ``env_error``, or whatever
    ``_act`` returns; truncated after ``max_turns`` messages. ``info["trajectory"]`` holds the
    episode at its end.

    ## Arguments
    ``end_rule``, ``max_turns`` (50), ``max_observation_chars``, ``multi_block`` (policy for
    several code blocks), ``languages`` (accepted fence languages), ``render_mode`` ("ansi").

    Subclasses set ``can_restore = True`` when replaying an episode's messages into a fresh
    episode reproduces its state (needed by ProVer's restarts), and ``names_states = True``
    when they name the state each step was taken in (``_state_key_after``; TRCA compares
    steps across a group by it).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    can_restore: bool = False
    names_states: bool = False

    def __init__(
        self,
        *,
        end_rule: EndRule = "no_code",
        max_turns: int = 50,
        max_observation_chars: int = 12_000,
        multi_block: MultiBlockPolicy = "reject",
        languages: tuple[str, ...] = DEFAULT_LANGUAGES,
        render_mode: str | None = None,
    ) -> None:
        if end_rule not in END_RULES:
            raise ValueError(f"end_rule must be one of {END_RULES}, got {end_rule!r}")
        if multi_block not in MULTI_BLOCK_POLICIES:
            raise ValueError(f"multi_block must be one of {MULTI_BLOCK_POLICIES}, got {multi_block!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
        if max_observation_chars < 100:
            raise ValueError(f"max_observation_chars must be >= 100, got {max_observation_chars}")
        check_render_mode(render_mode, self.metadata)
        self.end_rule = end_rule
        self.max_turns = max_turns
        self.max_observation_chars = max_observation_chars
        self.multi_block = multi_block
        self.languages = tuple(languages)
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        self._task: Task | None = None
        self._steps: list[Step] = []
        self._termination: str | None = None
        self._metrics: dict[str, Any] = {}
        self._counts = {"parse_errors": 0, "exec_errors": 0}
        self._executed: list[str] = []
        self._state_key = START

    # -- hooks ---------------------------------------------------------------------------

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        raise NotImplementedError

    def _execute(self, code: str) -> Execution:
        """Run one block with ``_run``, keeping it for a replay; when its process is lost,
        recover (``_recover``) and report the block failed, or end the episode if that fails."""
        try:
            execution = self._run(code)
        except WorldLost as lost:
            return self._lost_block(lost, self._recover())
        self._executed.append(code)
        return execution

    # -- restart and replay (environments whose world lives in a process) -----------------

    def _run(self, code: str) -> Execution:
        raise NotImplementedError(f"{type(self).__name__} implements neither _execute nor _run")

    def _restart(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot restart its world")

    def _recover(self) -> str | None:
        """A fresh process (``_restart``) with every block that ran this episode replayed in
        order: the state the agent had before the lost block. Returns None when that worked,
        else why it did not."""
        try:
            self._restart()
            for code in self._executed:
                self._run(code)
        except Exception as exc:  # noqa: BLE001 - whatever stops the replay, the state is gone
            return repr(exc)
        return None

    def _lost_block(self, lost: WorldLost, failure: str | None) -> Execution:
        """What the agent sees after its block's process was lost; ``failure`` says why the
        episode could not be restored (None: it was)."""
        if failure is not None:
            return Execution(output=f"Environment error: {lost}, and the episode could not be restored ({failure}).",
                             error=lost.error, fatal=True)
        return Execution(output=f"Execution failed: {lost}. The environment was restarted and your earlier code "
                                "re-run, so the state is as it was before this block, which had no effect.",
                         error=lost.error)

    def _evaluate(self) -> dict[str, Any]:
        return {}

    def _state_key_after(self, code: str) -> str | None:
        return None

    def _act(self, action: str) -> Outcome:
        """One message of the agent: run its code block (``_execute``), or apply the end
        rule to a message without one; a malformed message is an error observation."""
        parsed = parse_message(action, multi_block=self.multi_block, languages=self.languages)
        info: dict[str, Any] = {"parse": parsed.to_info()}
        if parsed.code is not None:
            execution = self._execute(parsed.code)
            info["exec_error"] = execution.error
            if execution.tool_calls is not None:
                info[TOOL_CALLS] = execution.tool_calls
            termination = None
            if execution.fatal:
                termination = Termination.ENV_ERROR
            elif execution.submitted and self.end_rule == "task_completed":
                termination = Termination.SUBMITTED
            if execution.submitted:
                info["submitted"] = True
            return Outcome(execution.output, code=parsed.code, info=info, termination=termination,
                           exec_error=execution.error is not None)
        if parsed.error is not None:
            return Outcome(f"Error: {parsed.error}.", info=info, parse_error=True)
        if self.end_rule == "no_code":
            return Outcome("", info=info, termination=Termination.NO_CODE)
        return Outcome("Error: no code block found. Put the code to run in one ```python block.", info=info,
                       parse_error=True)

    # -- Gymnasium API -------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._executed = []
        self._state_key = START
        self._task = self._start(seed, dict(options or {}))
        self._steps = []
        self._termination = None
        self._metrics = {}
        self._counts = {"parse_errors": 0, "exec_errors": 0}
        return self._task.agent_prompt, {"task_id": self._task.id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        index = self._begin_step()
        state_key = self._state_key
        outcome = self._act(action)
        self._counts["parse_errors"] += outcome.parse_error
        self._counts["exec_errors"] += outcome.exec_error
        info: dict[str, Any] = {"task_id": self.task.id, "step": index, **outcome.info}
        if self.names_states:
            info[STATE_KEY] = state_key
            if outcome.code is not None and not outcome.exec_error:
                self._state_key = self._state_key_after(outcome.code) or state_key
        # What the agent's code printed and called enters the pipeline here: valid text,
        # bounded data, whatever the block wrote (draco_gym.text)
        observation = valid_text(truncate_middle(outcome.observation, self.max_observation_chars))
        info = valid_data(info)
        return self._record_step(index, action, outcome.code, observation, info, outcome.termination,
                                 outcome.truncation)

    # -- the two halves of every step ------------------------------------------------------

    def _begin_step(self) -> int:
        """Check that a step may be taken; returns its 1-based index."""
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self._termination is not None:
            raise gym.error.ResetNeeded(f"the episode has ended ({self._termination}); call reset()")
        return len(self._steps) + 1

    def _record_step(
        self,
        index: int,
        action: Any,
        code: str | None,
        observation: str,
        info: dict[str, Any],
        termination: str | None = None,
        truncation: str | None = None,
    ) -> tuple[str, float, bool, bool, dict]:
        """Append the step, apply the turn budget, and at the episode's end evaluate it and
        attach the trajectory; returns Gymnasium's step tuple."""
        text = action if isinstance(action, str) else repr(action)
        self._steps.append(Step(index=index, text=text, code=code, observation=observation, info=info))
        if termination is None and truncation is None and index >= self.max_turns:
            truncation = Termination.MAX_TURNS
        self._termination = termination or truncation
        terminated, truncated = termination is not None, termination is None and truncation is not None
        if terminated or truncated:
            self._metrics = self._safe_evaluate()
            info["metrics"] = self._metrics
            info["trajectory"] = self.trajectory()
        return observation, 0.0, terminated, truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        if not self._steps:
            return self._task.agent_prompt if self._task else ""
        last = self._steps[-1]
        return f"[step {last.index}]\n{last.text}\n[observation]\n{last.observation}"

    # -- episode record -----------------------------------------------------------------

    @property
    def termination(self) -> str | None:
        """Why the episode ended (a ``Termination`` value); None while it runs."""
        return self._termination

    @property
    def task(self) -> Task:
        if self._task is None:
            raise gym.error.ResetNeeded("no task yet; call reset()")
        return self._task

    def trajectory(self) -> Trajectory:
        """The episode so far (or finished) in the library's data model."""
        return Trajectory(
            task=self.task,
            steps=[s.model_copy(deep=True) for s in self._steps],
            termination=self._termination,
            metrics={**self._metrics, **self._counts},
        )

    def end_episode(self, termination: str) -> Trajectory:
        """End a running episode from outside (the trainer's token budget ran out,
        ``Termination.LENGTH``; the environment raised, ``ENV_ERROR``): the environment still
        evaluates it as it stands, so a cut-off episode has an outcome (a task left undone is
        a failure) and its termination beside it. An episode that already ended keeps its
        own termination and evaluation."""
        if self._task is None:
            raise gym.error.ResetNeeded("no episode to end; call reset()")
        if self._termination is None:
            self._termination = termination
            self._metrics = self._safe_evaluate()
        return self.trajectory()

    def restore(self, task_id: str, messages: list[str], seed: int | None = None) -> tuple[str, dict]:
        """Start ``task_id`` afresh and replay ``messages`` through ``step``: the state an
        episode had after those messages, when the environment is deterministic
        (``can_restore``). Returns the last observation and info."""
        if not self.can_restore:
            raise NotImplementedError(f"{type(self).__name__} cannot restore episode state")
        observation, info = self.reset(seed=seed, options={"task_id": task_id})
        for message in messages:
            observation, _, terminated, truncated, info = self.step(message)
            if terminated or truncated:
                raise ValueError("replayed messages ended the episode; restore needs a non-terminal prefix")
        return observation, info

    def _safe_evaluate(self) -> dict[str, Any]:
        try:
            metrics = dict(self._evaluate())
        except Exception as exc:  # noqa: BLE001 - an evaluation failure must not lose the episode
            metrics = {"evaluation_error": f"{type(exc).__name__}: {exc}"}
        return valid_data(metrics)  # the submitted answer is the agent's: bytes, any nesting


def play_messages(env: gym.Env, task_id: str, messages: list[str]) -> Trajectory:
    """The episode of ``task_id`` in which a scripted agent sends ``messages`` in order, the
    last one again until the episode ends: how references, near-misses and exploits are
    replayed through the same ``step`` a policy uses. Raises when the episode outlives the
    env's ``max_turns`` (a script that never ends its episode is a broken script)."""
    if not messages:
        raise ValueError("play_messages needs at least one message")
    env.reset(options={"task_id": task_id})
    for k in range(env.unwrapped.max_turns):
        _, _, terminated, truncated, info = env.step(messages[min(k, len(messages) - 1)])
        if terminated or truncated:
            return info["trajectory"]
    raise AssertionError(f"{task_id}: the episode did not end within max_turns={env.unwrapped.max_turns}")
