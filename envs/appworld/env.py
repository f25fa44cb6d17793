"""``draco_gym/AppWorld-v0``: AppWorld on the real engine, one code block per step.

The environment is a thin client of an engine server (see ``server.py``) borrowed from a
pool at the first reset and kept across episodes, so only the first episode of a process
pays the server's start-up. The agent's code runs in a shell process forked afresh for each
episode; the apps and their databases live in a world process that runs no agent code; the
environment relays the shell's API calls to the world and records them (``tool_calls``);
the pool's evaluator grades the world's saved end state. So nothing the agent's code does
in its process reaches the outcome. Every code block that ran is remembered
(``CodeStepEnv``'s restart and replay); that log is what makes the two recoveries possible:

- the shell or the world dies (killed, out of memory, stuck past the step timeout): the
  task is reloaded in the world, a fresh shell replays the log, and the episode continues
  from the same state. The block that was running when it died is reported as failed and
  not replayed. If the replay fails too, the episode ends with termination ``env_error``;
  it never hangs. A shell that breaks the protocol (forged, malformed or flooded lines)
  ends the episode with ``env_error`` at once.
- ``restore`` (ProVer): replaying messages into a fresh episode rebuilds the state, since
  the engine is deterministic (frozen clock, fixed random seed), hence ``can_restore``.

The engine's own evaluation (tests passed, total, success) arrives in ``info["metrics"]``
at the episode's end. It is for analysis and for the outcome-reward baseline; the
Gymnasium reward stays 0, as in every draco-gym environment.
"""

from __future__ import annotations

import os
from typing import Any

from draco_gym.codeblock import DEFAULT_LANGUAGES, MultiBlockPolicy
from draco_gym.envs.appworld.runtime import AppWorldRuntime, print_progress
from draco_gym.envs.appworld.server import (
    EnvServer, ProtocolError, RemoteError, ServerDied, ServerError, ServerPool, shell_sandbox)
from draco_gym.envs.appworld.suite import TaskSource, resolve_source
from draco_gym.envs.base import CodeStepEnv, EndRule, Execution, WorldLost
from draco_gym.envs.os_sandbox import SandboxMode
from draco_gym.envs.state_keys import last_call
from draco_gym.types import Task

PROMPT = """\
You are an autonomous agent working for {first_name} {last_name} (email {email}, phone {phone_number}) \
on their phone, in a world of apps ({apps}). You act by writing Python code; each message you send \
may hold one code block, which runs in a persistent Python session, and you see what it prints.

How to work:
- Every app is reached through `apis.<app_name>.<api_name>(...)`. Discover them as you go: \
`apis.api_docs.show_app_descriptions()` lists the apps, `apis.api_docs.show_api_descriptions(app_name="...")` \
lists an app's APIs and `apis.api_docs.show_api_doc(app_name="...", api_name="...")` gives one API's \
parameters and response. Do not guess API names or parameters; look them up.
- Most apps need a login. {first_name}'s account passwords come from \
`apis.supervisor.show_account_passwords()` and their profile from `apis.supervisor.show_profile()`.
- Lists come in pages: keep calling with increasing `page_index` until a page comes back empty.
- Print what you need to see; only printed output comes back. Keep each block short and check \
results before acting on them. Never make changes the task did not ask for.
- When the task is done, call `apis.supervisor.complete_task()`; if the task asks a question, pass \
the answer: `apis.supervisor.complete_task(answer=...)` (just the value, no sentence).
- Write code as one block per message, fenced like this:
```python
print(apis.api_docs.show_app_descriptions())
```
{ending}

Today is {date}.
Task: {instruction}"""

CLOSING_MESSAGE = "The task is complete."
"""The reference's last message under ``end_rule="no_code"``: no code, so the episode ends."""

ENDINGS = {
    "no_code": "After calling complete_task, reply with a short message and no code block: that ends the episode.",
    "task_completed": "The episode ends as soon as complete_task has been called.",
}


class AppWorldEnv(CodeStepEnv):
    """AppWorld on the real engine; one step is one assistant message whose code block runs
    in the task's world (see the module docstring for recovery and restore).

    ## Action space
    ``UnicodeText``: the assistant message. Its one ```` ```python ```` block (or
    ``<code>...</code>``) runs; several blocks follow ``multi_block``.

    ## Observation space
    ``UnicodeText``: at reset the agent prompt (instructions, the supervisor, the task);
    after a step the block's printed output, its error, or a parse error, cut in the middle
    to ``max_observation_chars``.

    ## Rewards
    Always 0: rewards come from the rubric layer. The engine's evaluation (``tests_passed``,
    ``tests_total``, ``success``) is in ``info["metrics"]`` at the end.

    ## Episode end
    Terminated: ``no_code`` (a message without code, under ``end_rule="no_code"``),
    ``submitted`` (``complete_task`` under ``end_rule="task_completed"``), ``env_error``
    (the engine could not be recovered). Truncated: ``max_turns`` messages.
    ``info["trajectory"]`` holds the episode at its end.

    ## State key
    ``info["state_key"]`` (``draco_gym.types.STATE_KEY``) names the state the step was
    taken in: ``"app.api"`` of the last API called by a block that ran without error
    (``"start"`` before any), read from the code. Steps of a group with equal keys are
    compared by TRCA's credit.

    ## Tool calls
    ``info["tool_calls"]`` (``draco_gym.types.TOOL_CALLS``) lists the AppWorld API calls the
    step's block made, in order, ``{"name": "app.api", "ok": bool, "status": int}``, recorded
    by the environment as it relays them to the world (outside the agent's process).

    ## Task metadata for the rule rubric
    ``Task.metadata["api_docs"]`` is True (the ``api_docs`` app documents every API) and
    ``Task.metadata["operators"]`` is the task's operator library: the APIs its solution
    calls (the offline suite's reference solution, real AppWorld's compiled solution),
    split into reads (evidence) and actions (execution); see ``TaskSource.operators``.

    ## Arguments
    ``split`` and ``task_id`` choose the task at reset (``options={"task_id": ...}``
    overrides both; without either, a task of the split is drawn with the reset seed).
    ``data_root`` points at a real AppWorld data folder; without it (and without
    ``$DRACO_GYM_APPWORLD_DATA``) the offline suite of ``suite_seed`` is used, built on
    first use. ``step_timeout_s`` bounds one code block inside the engine; the server gets
    ``grace_s`` more before it is declared stuck and replaced. ``sandbox`` (``"auto"`` or
    ``"bwrap"``; see ``draco_gym.envs.os_sandbox``) is the OS boundary around the engine's
    processes: AppWorld runs only inside bubblewrap, so ``"guard"`` is refused here
    (``ValueError``) and ``"auto"`` or ``"bwrap"`` raise ``SandboxUnavailable`` when
    bubblewrap cannot run (both name bwrap and how to install it). A ``pool`` given brings
    its own.
    ``end_rule``, ``max_turns``, ``max_observation_chars``, ``multi_block``, ``languages``,
    ``render_mode`` ("ansi") as in ``CodeStepEnv``.

    ## Version history
    - v0: the initial version; since this release each step's info carries ``state_key``
      and the task's metadata ``api_docs`` and ``operators`` (additions only: episodes,
      observations and metrics are unchanged); each step's info also carries ``tool_calls``,
      and a shell that breaks the protocol ends its episode with ``env_error``;
      ``sandbox="guard"`` is refused (AppWorld runs only inside bubblewrap); the offline
      suite's tests compare the start and end databases record by record, so solutions that
      change records the task never named, or change them the wrong way, now fail.
    """

    can_restore = True
    names_states = True

    def __init__(
        self,
        split: str = "train",
        task_id: str | None = None,
        *,
        data_root: str | os.PathLike | None = None,
        suite_seed: int = 0,
        runtime_home: str | os.PathLike | None = None,
        pool: ServerPool | None = None,
        step_timeout_s: int = 30,
        grace_s: float = 20.0,
        end_rule: EndRule = "no_code",
        max_turns: int = 50,
        max_observation_chars: int = 12_000,
        multi_block: MultiBlockPolicy = "reject",
        languages: tuple[str, ...] = DEFAULT_LANGUAGES,
        render_mode: str | None = None,
        show_progress: bool = True,
        sandbox: SandboxMode = "auto",
    ) -> None:
        super().__init__(end_rule=end_rule, max_turns=max_turns, max_observation_chars=max_observation_chars,
                         multi_block=multi_block, languages=languages, render_mode=render_mode)
        if not isinstance(step_timeout_s, int) or step_timeout_s < 1:
            raise ValueError(f"step_timeout_s must be a positive integer (seconds), got {step_timeout_s!r}")
        shell_sandbox(sandbox)  # guard mode refused, bubblewrap checked: before the suite is built
        self.runtime = AppWorldRuntime(runtime_home)
        progress = print_progress if show_progress else None
        self.source: TaskSource = resolve_source(data_root, self.runtime, seed=suite_seed, progress=progress)
        self.runtime.ensure(progress)  # a real data folder still needs the engine
        self.split = split
        self.task_ids: list[str] = self.source.task_ids(split)
        if task_id is not None:
            self._check_task_id(task_id)
        self.default_task_id = task_id
        self.pool = pool or ServerPool.shared(self.runtime, self.source.data_dir, sandbox)
        self.step_timeout_s = step_timeout_s
        self.grace_s = grace_s
        self._server: EnvServer | None = None
        self.recoveries = 0

    def reference_messages(self, task_id: str) -> list[str]:
        """The assistant messages of ``task_id``'s reference solution under this env's end
        rule: each reference block fenced, then (``end_rule="no_code"``) a closing message
        without code. Demonstrations for a supervised warm start (``draco-gym sft``)."""
        self._check_task_id(task_id)
        messages = [f"```python\n{block}\n```" for block in self.source.ground_truth(task_id).reference_blocks]
        if self.end_rule == "no_code":
            messages.append(CLOSING_MESSAGE)
        return messages

    # -- hooks ------------------------------------------------------------------------------

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        task_id = options.get("task_id") or self.default_task_id
        if task_id is None:
            task_id = str(self.np_random.choice(self.task_ids))
        self._check_task_id(task_id)
        task = self._load(task_id)
        metadata = self.source.metadata(task_id)
        supervisor = task["supervisor"]
        prompt = PROMPT.format(
            **supervisor,
            apps=", ".join(a for a in task["allowed_apps"] if a not in ("api_docs", "supervisor")),
            ending=ENDINGS[self.end_rule],
            date=task["datetime"].replace("T", " "),
            instruction=task["instruction"],
        )
        return Task(
            id=task_id,
            instruction=task["instruction"],
            agent_prompt=prompt,
            metadata={
                "split": self.split if task_id in self.task_ids else None,
                "scenario": task_id.rsplit("_", 1)[0],
                "difficulty": metadata.get("difficulty"),
                "datetime": task["datetime"],
                "supervisor": supervisor,
                "api_docs": True,
                "operators": self.source.operators(task_id),
            },
        )

    def _state_key_after(self, code: str) -> str | None:
        """The last ``apis.<app>.<api>`` call in the block, as ``<app>.<api>``."""
        called = last_call(code, lambda name: name.startswith("apis.") and name.count(".") == 2)
        return None if called is None else called[0].removeprefix("apis.")

    def _execute(self, code: str) -> Execution:
        if not self._server_alive() and self._recover() is not None:
            # died between steps (killed from outside): the state could not be rebuilt
            return self._fatal("the environment server died and the episode could not be restored")
        try:
            return super()._execute(code)
        except RemoteError as exc:  # the engine refused the request: nothing ran, nothing to replay
            return Execution(output=f"Execution failed: {exc}", error="remote_error")
        except ProtocolError as exc:  # the agent's code wrote on the shell's channel: it is stopped
            return self._fatal(f"the code broke the environment's protocol ({exc})")

    def _run(self, code: str) -> Execution:
        try:
            answer = self._server.execute(code, timeout_s=self.step_timeout_s + self.grace_s)
        except ServerDied as exc:
            raise WorldLost(str(exc), "server_died") from exc
        output = answer["output"]
        error = "execution_failed" if output.startswith("Execution failed") else None
        return Execution(output=output, error=error, submitted=answer["submitted"], tool_calls=answer["tool_calls"])

    def _lost_block(self, lost: WorldLost, failure: str | None) -> Execution:
        if failure is not None:
            return self._fatal(f"the environment server failed ({lost}) and the episode could not be restored")
        return Execution(
            output=(
                "Execution failed: the environment stopped while running this code "
                f"(it did not finish within {self.step_timeout_s} s, or it crashed the interpreter). "
                "The environment was restarted and your earlier code re-run, so the state is as it "
                "was before this block, which had no effect."
            ),
            error=lost.error,
        )

    def _evaluate(self) -> dict[str, Any]:
        if not self._server_alive() and self._recover() is not None:
            raise ServerError("the environment server died before evaluation and could not be restored")
        # graded by the pool's evaluator on the world's saved databases: neither process ran agent code
        result = self.pool.evaluate(self.task.id, self._server.save_state())
        metadata = self.task.metadata
        return {
            "task_id": self.task.id,
            "success": result["success"],
            "tests_passed": result["passed"],
            "tests_total": result["total"],
            "failed_requirements": result["failures"],
            "difficulty": metadata.get("difficulty"),
            "scenario": metadata.get("scenario"),
            "server_recoveries": self.recoveries,
        }

    # -- servers ----------------------------------------------------------------------------

    def _load(self, task_id: str) -> dict:
        """Load ``task_id`` on our server (borrowing one first) with a fresh shell, retrying
        once on a dead server."""
        for attempt in (1, 2):
            if self._server is None:
                self._server = self.pool.acquire()
            try:
                return self._server.reset(task_id, self.step_timeout_s)
            except ServerDied:
                if attempt == 2:
                    raise
                self._server.stop()
        raise AssertionError("unreachable")

    def _server_alive(self) -> bool:
        return self._server is not None and self._server.alive

    def _restart(self) -> None:
        """The task reloaded in the world and a fresh shell, its dead processes restarted
        (the base class then replays the blocks)."""
        self.recoveries += 1
        self._load(self.task.id)

    def _fatal(self, message: str) -> Execution:
        return Execution(output=f"Environment error: {message}.", error="env_error", fatal=True)

    def _check_task_id(self, task_id: Any) -> None:
        if not isinstance(task_id, str) or not self.source.has_task(task_id):
            import difflib

            near = difflib.get_close_matches(str(task_id), self.task_ids, n=3)
            hint = f"; did you mean {near}?" if near else ""
            raise ValueError(
                f"unknown AppWorld task id {task_id!r} in {self.source.data_dir} "
                f"(split {self.split!r} has {len(self.task_ids)} tasks, e.g. {self.task_ids[:3]}){hint}"
            )

    def close(self) -> None:
        """Return the server to the pool (it stays alive for the next environment)."""
        server, self._server = self._server, None
        if server is not None:
            self.pool.release(server)
        super().close()
