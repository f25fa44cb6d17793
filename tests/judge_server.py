"""A local server that speaks OpenAI's chat-completions protocol, for judge tests and benches.

It listens on 127.0.0.1 (a real socket, real HTTP), answers ``POST /v1/chat/completions``
from a *responder* (scripted answers per stage and rollout, or a generic rule-following
judge), adds a configurable latency per call, and injects faults on demand:

    transport  rate_limit (429 + Retry-After), server_error (500), hang (no answer until
               the client gives up), slow (answers after ``slow_s``)
    content    malformed_json, missing_fields, steps_out_of_range, pass_without_citation,
               unknown_title

Faults are queued with ``inject(kind, stage=..., marker=..., times=...)``, or spread
evenly over ``fault_rate`` of all calls with the kind drawn at random (seeded). Every
request is recorded (``requests``) with the stage it was for and the fault it got. The
stage is read from the response_format's schema name or, when the client sends no schema,
from the judge prompt's "Stage <name>:" line.

    with JudgeServer(ScriptedJudge({...}), latency_s=0.05) as server:
        judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test")
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TRANSPORT_FAULTS = ("rate_limit", "server_error", "hang", "slow")
CONTENT_FAULTS = ("malformed_json", "missing_fields", "steps_out_of_range", "pass_without_citation", "unknown_title")
FAULTS = TRANSPORT_FAULTS + CONTENT_FAULTS

_STAGE_LINE = re.compile(r"^Stage (\w+):", re.MULTILINE)
_STEPS = re.compile(r'<trajectory[^>]* steps="(\d+)"')


@dataclass
class JudgeRequest:
    body: dict
    stage: str | None
    schema: dict | None

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", [])

    @property
    def data(self) -> str:
        """The first user message: the task and trajectory the request is about (repair
        requests append messages after it)."""
        users = [m.get("content", "") for m in self.messages if m.get("role") == "user"]
        return users[0] if users else ""

    @property
    def is_repair(self) -> bool:
        return sum(m.get("role") == "user" for m in self.messages) > 1

    @property
    def n_steps(self) -> int:
        found = _STEPS.findall(self.data)
        return int(found[0]) if found else 0

    @property
    def titles(self) -> list[str]:
        """Criterion titles, from the schema's enum (sent in json_schema mode)."""
        try:
            key = next(iter(self.schema["properties"]))
            return list(self.schema["properties"][key]["items"]["properties"]["criterion"]["enum"])
        except (TypeError, KeyError, StopIteration):
            return []


@dataclass
class Recorded:
    stage: str | None
    fault: str | None
    status: int
    repair: bool
    at: float = field(default_factory=time.perf_counter)


Responder = Callable[[JudgeRequest], "dict | str"]


class ScriptedJudge:
    """Replays answers written in the test. ``script`` maps ``stage`` or
    ``(stage, marker)`` to an answer (a dict, sent as JSON, or raw text); the marker is any
    string found in the request's data (e.g. a token written into one rollout's steps).
    A list of answers is served in turn (cycling): the k samples of a self-judge."""

    def __init__(self, script: dict[Any, Any]) -> None:
        self.script = script
        self._turns: dict[Any, itertools.cycle] = {}
        self._lock = threading.Lock()

    def __call__(self, request: JudgeRequest) -> dict | str:
        stage = request.stage
        keys = [k for k in self.script if isinstance(k, tuple) and k[0] == stage and k[1] in request.data]
        if len(keys) > 1:
            raise LookupError(f"several markers match a {stage} request: {[k[1] for k in keys]}")
        key = keys[0] if keys else stage
        if key not in self.script:
            raise LookupError(f"no scripted answer for stage {stage!r}")
        answer = self.script[key]
        if isinstance(answer, list):
            with self._lock:
                turns = self._turns.setdefault(key, itertools.cycle(answer))
                answer = next(turns)
        return copy.deepcopy(answer)


class RuleJudge:
    """A judge that follows the protocol for any input: proposes ``criteria`` (title,
    description, instruction), adds nothing, keeps the proposal when merging, and scores a
    criterion +1 when ``passes(title, trajectory_text)``, else -1, citing the last step.
    Needs the json_schema mode (it reads the titles from the schema's enum)."""

    def __init__(self, criteria: list[str], passes: Callable[[str, str], bool]) -> None:
        self.criteria = criteria
        self.passes = passes

    def _rubric(self, origin: str | None = None) -> dict:
        rows = []
        for title in self.criteria:
            row = {"title": title, "description": f"{title}.", "evaluator_instruction": f"Check: {title}."}
            if origin:
                row["origin"] = origin
            rows.append(row)
        return {"criteria": rows}

    def __call__(self, request: JudgeRequest) -> dict:
        stage, m = request.stage, request.n_steps
        cite = [m] if m else []  # a trajectory without steps has nothing to cite
        if stage == "propose":
            return self._rubric()
        if stage == "augment":
            return {"criteria": []}
        if stage == "merge":
            return self._rubric("instruction")
        verdicts = [(t, self.passes(t, request.data)) for t in request.titles]
        if stage == "score":
            return {"verdicts": [{"criterion": t, "score": 1 if ok else -1, "evidence": "seen", "justification": "rule"} for t, ok in verdicts]}
        if stage == "attribute":
            return {"attributions": [{"criterion": t, "verdict": "PASS" if ok else "FAIL", "steps": cite, "reason": "rule"} for t, ok in verdicts]}
        if stage == "score_attribute":
            return {"verdicts": [{"criterion": t, "verdict": "PASS" if ok else "FAIL", "steps": cite, "evidence": "seen", "justification": "rule"} for t, ok in verdicts]}
        raise LookupError(f"unknown stage {stage!r}")


def _corrupt(kind: str, answer: dict | str) -> str:
    """Apply a content fault to a well-formed answer."""
    if kind == "malformed_json":
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return text[: max(len(text) // 2, 1)] + ' "oops'
    if not isinstance(answer, dict):
        return answer
    answer = copy.deepcopy(answer)
    (key,) = answer
    items = answer[key]
    if not items:
        return json.dumps(answer)
    first = items[0]
    if kind == "missing_fields":
        for name in ("score", "verdict", "description"):
            first.pop(name, None)
    elif kind == "steps_out_of_range":
        first["steps"] = [999]
    elif kind == "pass_without_citation":
        passing = [i for i in items if i.get("verdict") == "PASS"] or items
        passing[0]["verdict"], passing[0]["steps"] = "PASS", []
    elif kind == "unknown_title":
        first["criterion" if "criterion" in first else "title"] = "A criterion nobody asked about"
    return json.dumps(answer)


class JudgeServer:
    def __init__(
        self,
        responder: Responder,
        *,
        latency_s: float = 0.0,
        json_schema: bool = True,
        fault_rate: float = 0.0,
        random_faults: tuple[str, ...] = ("rate_limit", "server_error", "malformed_json", "missing_fields", "steps_out_of_range", "pass_without_citation"),
        seed: int = 0,
        slow_s: float = 0.3,
        hang_s: float = 30.0,
        retry_after_s: float = 0.05,
        model: str = "test-judge",
        reject_params: tuple[str, ...] = (),
    ) -> None:
        self.responder = responder
        self.latency_s = latency_s
        self.json_schema = json_schema
        self.fault_rate = fault_rate
        self.random_faults = random_faults
        self.slow_s, self.hang_s, self.retry_after_s = slow_s, hang_s, retry_after_s
        self.model = model
        self.reject_params = reject_params  # request fields answered with a 400, as OpenAI's reasoning models do
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self._queue: list[dict] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._served = 0
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control -----------------------------------------------------------------------

    def start(self) -> JudgeServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else delayed ACKs add ~40 ms to every call

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                server._handle(self)

            def do_GET(self):  # counts, for a server running in another process
                if self.path.rstrip("/") != "/stats":
                    return server._send(self, 404, server._error(f"no route {self.path}", "not_found"))
                server._send(self, 200, server.stats())

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default 5 drops connections when many calls start at once

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def inject(self, kind: str, *, stage: str | None = None, marker: str | None = None, times: int = 1) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {FAULTS}")
        with self._lock:
            self._queue.append({"kind": kind, "stage": stage, "marker": marker, "left": times})

    def calls(self, stage: str | None = None, status: int | None = 200) -> int:
        return sum((stage is None or r.stage == stage) and (status is None or r.status == status) for r in self.requests)

    def stats(self) -> dict:
        with self._lock:
            return {
                "requests": len(self.requests),
                "faulted": sum(r.fault is not None for r in self.requests),
                "errors": list(self.errors),
            }

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.errors.clear()

    # -- serving ---------------------------------------------------------------------------

    def _pick_fault(self, request: JudgeRequest) -> str | None:
        with self._lock:
            for entry in self._queue:
                if entry["left"] > 0 and entry["stage"] in (None, request.stage) and (
                    entry["marker"] is None or entry["marker"] in request.data
                ):
                    entry["left"] -= 1
                    return entry["kind"]
            if self.fault_rate:
                # exactly fault_rate of the calls, evenly spread; the kind is drawn at random
                k = self._served
                self._served += 1
                if int((k + 1) * self.fault_rate) > int(k * self.fault_rate):
                    return self._random.choice(self.random_faults)
        return None

    def _record(self, request: JudgeRequest | None, fault: str | None, status: int) -> None:
        with self._lock:
            self.requests.append(Recorded(request.stage if request else None, fault, status, bool(request and request.is_repair)))

    def _send(self, handler: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                handler.send_header(k, v)
            handler.end_headers()
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a hang fault): nothing to deliver

    @staticmethod
    def _error(message: str, kind: str) -> dict:
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", 0))
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._record(None, None, 400)
            return self._send(handler, 400, self._error("request body is not JSON", "invalid_request_error"))
        if handler.path.rstrip("/") != "/v1/chat/completions":
            self._record(None, None, 404)
            return self._send(handler, 404, self._error(f"no route {handler.path}", "not_found"))

        for param in self.reject_params:
            if param in body:
                self._record(None, None, 400)
                return self._send(handler, 400, self._error(
                    f"Unsupported parameter: '{param}' is not supported with this model.", "invalid_request_error"))
        response_format = body.get("response_format") or {}
        schema, stage = None, None
        if response_format.get("type") == "json_schema":
            if not self.json_schema:
                self._record(None, None, 400)
                return self._send(handler, 400, self._error("response_format json_schema is not supported", "invalid_request_error"))
            spec = response_format.get("json_schema", {})
            schema, stage = spec.get("schema"), spec.get("name")
        if stage is None:
            systems = [m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"]
            found = _STAGE_LINE.search(systems[0]) if systems else None
            stage = found.group(1) if found else None
        request = JudgeRequest(body=body, stage=stage, schema=schema)

        if self.latency_s:
            time.sleep(self.latency_s)
        fault = self._pick_fault(request)
        if fault == "rate_limit":
            self._record(request, fault, 429)
            return self._send(handler, 429, self._error("rate limited", "rate_limit_error"),
                              {"Retry-After": f"{self.retry_after_s:g}", "retry-after-ms": str(int(self.retry_after_s * 1000))})
        if fault == "server_error":
            self._record(request, fault, 500)
            return self._send(handler, 500, self._error("internal error", "server_error"))
        if fault == "hang":
            self._record(request, fault, 0)
            self._stopping.wait(self.hang_s)
            return self._send(handler, 504, self._error("hung", "server_error"))
        if fault == "slow":
            time.sleep(self.slow_s)

        try:
            answer = self.responder(request)
        except Exception as exc:  # a gap in the test's script: fail loudly, visibly
            message = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.errors.append(message)
            self._record(request, fault, 400)
            return self._send(handler, 400, self._error(message, "test_script_error"))
        text = _corrupt(fault, answer) if fault in CONTENT_FAULTS else answer if isinstance(answer, str) else json.dumps(answer)
        prompt_chars = sum(len(m.get("content") or "") for m in body.get("messages", []))
        self._record(request, fault, 200)
        self._send(handler, 200, {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt_chars // 4 + len(text) // 4},
        })


class ServerProcess:
    """A JudgeServer in a child process, so that serving (JSON parsing, the responder,
    the injected sleeps) never competes with the client for the GIL: what a bench should
    measure is the client. ``stats()`` fetches the server's counts over HTTP."""

    def __init__(self, responder: Responder, **options: Any) -> None:
        self.responder, self.options = responder, options
        self._process = None
        self.base_url = ""

    @staticmethod
    def _serve(responder, options, conn) -> None:
        server = JudgeServer(responder, **options).start()
        conn.send(server.base_url)
        conn.recv()  # block until the parent says stop
        server.stop()

    def __enter__(self) -> ServerProcess:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe()
        self._conn = parent
        self._process = context.Process(target=self._serve, args=(self.responder, self.options, child), daemon=True)
        self._process.start()
        self.base_url = parent.recv()
        return self

    def stats(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.base_url.rsplit("/v1", 1)[0] + "/stats", timeout=10) as response:
            return json.loads(response.read())

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
