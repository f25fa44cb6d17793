"""A local server that speaks OpenAI's chat-completions protocol, for judge tests and benches.

It listens on 127.0.0.1 (a real socket, real HTTP), answers ``POST /v1/chat/completions``
from a *responder* (scripted answers per stage and rollout, or a generic rule-following
judge), adds a configurable latency per call, and injects faults on demand:

    transport  rate_limit (429 + Retry-After), server_error (500), hang (no answer until
               the client gives up), slow (answers after ``slow_s``), stream_error (a
               streamed answer broken off by vLLM's error event for a failed generation),
               html (status 200 with a proxy's HTML error page, streamed or not),
               html_as_json (the same page labelled application/json)
    content    malformed_json, missing_fields, steps_out_of_range, pass_without_citation,
               unknown_title

``dialect`` makes the server behave as one real server family does towards structured
output, with that server's own error bodies (read from their sources): what it answers at
GET /v1/models (``owned_by``) and /props, which ``response_format`` forms it takes, how it
refuses the others, how many requests it computes at once (``slots``; the rest queue), and
for llama-cpp-python that a new request arriving cuts a streaming answer short. The vLLM
dialect also refuses a ``json_schema`` its grammar compiler cannot take (``grammar_error``;
by default a look-around ``pattern``, as llguidance does): unstreamed with a 400, streamed
with a 200 whose stream is that error as one event, then ``[DONE]``, as vLLM 0.32 does.
Streaming (``"stream": true``) sends the answer in pieces, ``token_s`` apart; a client that
closes the connection stops the computation (``Recorded.aborted``), as the real servers do.
A non-streamed answer is computed to its end whatever the client does.

Faults are queued with ``inject(kind, stage=..., marker=..., times=...)``, or spread
evenly over ``fault_rate`` of all calls with the kind drawn at random (seeded). Every
request is recorded (``requests``) with the stage it was for and the fault it got. The
stage is read from the response_format's schema name or, when the client sends none, from
the judge prompt's last "Stage <name>:" line.

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

TRANSPORT_FAULTS = ("rate_limit", "server_error", "hang", "slow", "stream_error", "html", "html_as_json")
CONTENT_FAULTS = ("malformed_json", "missing_fields", "steps_out_of_range", "pass_without_citation", "unknown_title")
FAULTS = TRANSPORT_FAULTS + CONTENT_FAULTS

HTML_PAGE = ("<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
             "</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
"""What the ``html`` fault answers: nginx's page for an upstream that is down."""

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
        """Criterion titles, from the schema (sent in json_schema and json_object + schema modes)."""
        try:
            key = next(iter(self.schema["properties"]))
            array = self.schema["properties"][key]
            if "prefixItems" in array:  # one item per title, in rubric order (llama.cpp's grammar form)
                return [(item.get("anyOf") or [item])[0]["properties"]["criterion"]["const"] for item in array["prefixItems"]]
            return list(array["items"]["properties"]["criterion"]["enum"])
        except (TypeError, KeyError, StopIteration):
            return []


@dataclass
class Recorded:
    stage: str | None
    fault: str | None
    status: int
    repair: bool
    at: float = field(default_factory=time.perf_counter)
    start: float = 0.0  # when the server began computing the answer (0: never began)
    end: float = 0.0  # when it stopped (finished, aborted or interrupted)
    aborted: bool = False  # the client closed the connection mid-answer
    interrupted: bool = False  # another request cut the answer short (llama-cpp-python)
    response_format: dict | None = None
    messages: list = field(default_factory=list)
    error_event: dict | None = None  # the error event a 200 stream carried instead of (or after) an answer


# -- server families ---------------------------------------------------------------------------
# owned_by at GET /v1/models, as each server writes it
OWNED_BY = {"openai": "system", "vllm": "vllm", "sglang": "sglang", "ollama": "library",
            "llama_cpp_python": "me", "llama_server": "llamacpp", "plain": "organization-owner"}
DIALECTS = tuple(OWNED_BY)


def _strict_ready(schema) -> bool:
    if isinstance(schema, dict):
        if "properties" in schema and (schema.get("additionalProperties") is not False
                                       or set(schema.get("required", [])) != set(schema["properties"])):
            return False
        return all(_strict_ready(v) for v in schema.values())
    if isinstance(schema, list):
        return all(_strict_ready(v) for v in schema)
    return True


def format_refusal(dialect: str, response_format: dict) -> tuple[int, dict] | None:
    """How a server family refuses a response_format it does not take: (status, body), or
    None when it takes it."""
    kind = response_format.get("type", "text")
    if dialect == "llama_cpp_python":
        # llama-cpp-python 0.3.36: ResponseFormat.type is Literal["text", "json_object"]; its
        # route handler turns the request's validation error into a 500 internal_server_error
        # (the body below is the real server's, the path shortened)
        if kind not in ("text", "json_object"):
            message = ("1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
                       "'msg': \"Input should be 'text' or 'json_object'\", "
                       f"'input': '{kind}', 'ctx': {{'expected': \"'text' or 'json_object'\"}}}}\n\n"
                       '  File ".../llama_cpp/server/app.py", line 376, in create_chat_completion\n'
                       "    POST /v1/chat/completions")
            return 500, {"error": {"message": message, "type": "internal_server_error", "param": None, "code": None}}
    elif dialect == "llama_server":
        # llama.cpp's C++ server before json_schema support
        if kind not in ("text", "json_object"):
            message = f'response_format type must be one of "text" or "json_object", but got: {kind}'
            return 400, {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
    elif dialect in ("vllm", "sglang"):
        if kind not in ("text", "json_object", "json_schema", "structural_tag"):
            message = "1 validation error: response_format.type: Input should be 'text', 'json_object' or 'json_schema'"
            return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    elif dialect == "openai":
        spec = response_format.get("json_schema") or {}
        if kind == "json_object" and "schema" in response_format:
            return 400, {"error": {"message": "Additional properties are not allowed ('schema' was unexpected) - "
                                              "'response_format'", "type": "invalid_request_error",
                                   "param": "response_format", "code": None}}
        if kind == "json_schema" and spec.get("strict") and not _strict_ready(spec.get("schema")):
            return 400, {"error": {"message": f"Invalid schema for response_format '{spec.get('name')}': In context=(), "
                                              "'additionalProperties' is required to be supplied and to be false.",
                                   "type": "invalid_request_error", "param": "response_format", "code": None}}
    elif dialect == "plain":
        if response_format:
            return 400, {"error": {"message": "Unrecognized request argument supplied: response_format",
                                   "type": "invalid_request_error", "param": None, "code": None}}
    return None


_LOOK_AROUND = re.compile(r"\(\?<?[=!]")


def look_around_error(schema: Any) -> str | None:
    """llguidance's error for a schema whose ``pattern`` has a look-ahead or look-behind (the
    text vLLM 0.32's guidance backend gave for ``(?<=a)b``), or None when it has none: vLLM
    compiles a schema xgrammar cannot take with llguidance, and llguidance refuses look-around."""
    if isinstance(schema, list):
        return next((e for e in map(look_around_error, schema) if e), None)
    if not isinstance(schema, dict):
        return None
    pattern = schema.get("pattern")
    found = _LOOK_AROUND.search(pattern) if isinstance(pattern, str) else None
    if found:
        marks = " " * found.start() + "^" * len(found.group())
        return (f"regex parse error:\n    {pattern}\n    {marks}\n"
                "error: look-around, including look-ahead and look-behind, is not supported")
    return next((e for e in map(look_around_error, schema.values()) if e), None)


def vllm_error(message: str, err_type: str, code: int) -> dict:
    """vLLM's ErrorResponse as it serialises it (``create_error_response(...).model_dump()``):
    the body of an error status, and the data of an error event inside a stream."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


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
        dialect: str | None = None,
        slots: int | None = None,
        token_s: float = 0.0,
        models_endpoint: bool = True,
        grammar_error: Callable[[dict], str | None] = look_around_error,
    ) -> None:
        if dialect is not None and dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; known: {DIALECTS}")
        self.responder = responder
        self.latency_s = latency_s
        self.json_schema = json_schema
        self.fault_rate = fault_rate
        self.random_faults = random_faults
        self.slow_s, self.hang_s, self.retry_after_s = slow_s, hang_s, retry_after_s
        self.model = model
        self.reject_params = reject_params  # request fields answered with a 400, as OpenAI's reasoning models do
        self.dialect = dialect
        self.slots = 1 if dialect == "llama_cpp_python" else slots
        self.token_s = token_s
        self.models_endpoint = models_endpoint  # False: the probe learns nothing, only refusals teach
        self.grammar_error = grammar_error  # the vLLM dialect's grammar compiler: why it refuses a json_schema
        self._slot = threading.Semaphore(self.slots) if self.slots else None
        self._waiting = 0  # requests queued for a slot
        self._open = 0  # requests received and not yet answered
        self.max_open = 0  # the most requests the clients had open at once
        self.probes: list[str] = []  # GET paths asked
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
        from draco_gym.reward.judge_servers import forget_servers

        forget_servers()  # a new server may reuse an old one's port: nothing remembered carries over
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else delayed ACKs add ~40 ms to every call

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                server._handle(self)

            def do_GET(self):
                path = self.path.rstrip("/")
                server.probes.append(path)
                if path == "/stats":  # counts, for a server running in another process
                    return server._send(self, 200, server.stats())
                if path == "/v1/models" and server.dialect and server.models_endpoint:
                    return server._send(self, 200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": OWNED_BY[server.dialect]}]})
                if path == "/props" and server.dialect == "llama_server":
                    return server._send(self, 200, {"total_slots": server.slots or 1, "model_path": server.model})
                server._send(self, 404, server._error(f"no route {self.path}", "not_found"))

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

    def _record(self, request: JudgeRequest | None, fault: str | None, status: int) -> Recorded:
        with self._lock:
            record = Recorded(request.stage if request else None, fault, status, bool(request and request.is_repair),
                              response_format=(request.body.get("response_format") if request else None),
                              messages=(request.messages if request else []))
            self.requests.append(record)
            return record

    def _send(self, handler: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send_raw(handler, status, json.dumps(payload).encode(), "application/json", headers)

    def _send_raw(self, handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str,
                  headers: dict | None = None) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
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
        with self._lock:
            self._open += 1
            self.max_open = max(self.max_open, self._open)
        try:
            self._handle_open(handler)
        finally:
            with self._lock:
                self._open -= 1

    def _handle_open(self, handler: BaseHTTPRequestHandler) -> None:
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
        elif response_format.get("type") == "json_object":
            schema = response_format.get("schema")  # llama.cpp's grammar-constrained json_object
        if stage is None:  # the prompt's last "Stage <name>:" line: data before it may quote one
            found = _STAGE_LINE.findall("\n".join(m.get("content") or "" for m in body.get("messages", [])[:2]))
            stage = found[-1] if found else None
        request = JudgeRequest(body=body, stage=stage, schema=schema)
        if self.dialect is not None:
            refusal = format_refusal(self.dialect, response_format)
            if refusal is not None:
                self._record(request, None, refusal[0])
                return self._send(handler, *refusal)
        if self.dialect == "vllm" and response_format.get("type") == "json_schema":
            error = self.grammar_error(schema or {})
            if error is not None:
                return self._refuse_grammar(handler, request, f"Grammar error: {error}")
        if self._slot is None:
            return self._answer(handler, request)
        with self._lock:
            self._waiting += 1
        self._slot.acquire()
        with self._lock:
            self._waiting -= 1
        try:
            return self._answer(handler, request)
        finally:
            self._slot.release()

    def _refuse_grammar(self, handler: BaseHTTPRequestHandler, request: JudgeRequest, message: str) -> None:
        """vLLM validates the grammar when the request reaches its engine: unstreamed, before
        it answers (a 400); streamed, after the 200 and the stream's headers are sent, so the
        refusal is the stream's one event (``chat_completion_stream_generator``)."""
        payload = vllm_error(message, "BadRequestError", 400)
        if not request.body.get("stream"):
            self._record(request, None, 400)
            return self._send(handler, 400, payload)
        record = self._record(request, None, 200)
        record.error_event = payload
        try:
            _start_stream(handler)
            handler.wfile.write(f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode())
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            record.aborted = True

    def _answer(self, handler: BaseHTTPRequestHandler, request: JudgeRequest) -> None:
        body = request.body
        started = time.perf_counter()

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
        if fault == "html":  # a proxy in front of a judge that is down: its error page, with a 200
            self._record(request, fault, 200)
            return self._send_raw(handler, 200, HTML_PAGE.encode(), "text/html; charset=utf-8")
        if fault == "html_as_json":  # the same page under a JSON content type (a misconfigured proxy)
            self._record(request, fault, 200)
            return self._send_raw(handler, 200, HTML_PAGE.encode(), "application/json")
        if fault == "stream_error" and not body.get("stream"):
            self._record(request, fault, 500)  # unstreamed, vLLM answers a failed generation with a 500
            return self._send(handler, 500, vllm_error("Internal server error", "InternalServerError", 500))

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
        record = self._record(request, fault, 200)
        record.start = started
        if body.get("stream"):
            return self._stream(handler, body, text, prompt_chars, record)
        if self.token_s:
            time.sleep(self.token_s * len(_pieces(text)))  # computed to the end: no one checks the client
        record.end = time.perf_counter()
        self._send(handler, 200, {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt_chars // 4 + len(text) // 4},
        })


    def _stream(self, handler: BaseHTTPRequestHandler, body: dict, text: str, prompt_chars: int,
                record: Recorded) -> None:
        """Server-sent events, one piece of the answer each; a closed connection stops the work."""
        def event(payload) -> bytes:
            return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> dict:
            out = {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": body.get("model", self.model),
                   "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                out["usage"] = usage
            return out

        try:
            _start_stream(handler)
            handler.wfile.write(event(chunk({"role": "assistant", "content": ""})))
            pieces = _pieces(text)
            for k, piece in enumerate(pieces):
                if record.fault == "stream_error" and k == len(pieces) // 2:
                    # vLLM's GenerationError mid-answer: one error event, then [DONE]
                    record.error_event = vllm_error("Internal server error", "InternalServerError", 500)
                    handler.wfile.write(event(record.error_event) + event("[DONE]"))
                    handler.wfile.flush()
                    return
                if self.token_s:
                    time.sleep(self.token_s)
                if self.dialect == "llama_cpp_python" and self._waiting:
                    # llama-cpp-python's interrupt_requests (on by default): a queued request
                    # ends the stream here, the answer cut short
                    record.interrupted = True
                    handler.wfile.write(event("[DONE]"))
                    handler.wfile.flush()
                    return
                handler.wfile.write(event(chunk({"content": piece})))
                handler.wfile.flush()
            handler.wfile.write(event(chunk({}, "stop")))
            if (body.get("stream_options") or {}).get("include_usage") and self.dialect != "llama_cpp_python":
                handler.wfile.write(event(chunk({}, usage={"prompt_tokens": prompt_chars // 4, "completion_tokens": len(text) // 4,
                                                           "total_tokens": prompt_chars // 4 + len(text) // 4})))
            handler.wfile.write(event("[DONE]"))
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            record.aborted = True  # the client gave up: the server stops computing
        finally:
            record.end = time.perf_counter()


def _start_stream(handler: BaseHTTPRequestHandler) -> None:
    """A 200 whose body is server-sent events until the connection closes."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True


def _pieces(text: str, size: int = 8) -> list[str]:
    """The answer as a server streams it (here: 8 characters a piece, about two tokens)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


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
