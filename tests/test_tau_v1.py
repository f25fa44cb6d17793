"""The original τ-bench (v1) adapter.

The real ``tau_bench`` package installs only from git and cannot be installed here, so this
test builds a small fake of it on ``sys.modules``. The fake mimics only the interface the
adapter uses, copied in shape from sierra-research/tau-bench: ``tau_bench.envs.get_env``,
``Env.reset/step/calculate_reward`` with ``tools_map``, ``tools_info``, ``wiki``, ``actions``
and ``user``, ``tau_bench.types.Action`` and ``RESPOND_ACTION_NAME``, and an LLM user class
whose constructor calls the model (here: raises), so the test also proves that building an
environment never touches a user model.
"""

from __future__ import annotations

import copy
import hashlib
import sys
import types
from dataclasses import dataclass, field

import pytest


@dataclass
class Action:
    name: str
    kwargs: dict = field(default_factory=dict)


@dataclass
class Task:
    user_id: str
    instruction: str
    actions: list
    outputs: list = field(default_factory=list)


@dataclass
class RewardResult:
    reward: float
    info: dict
    actions: list

    def model_dump(self, mode="python"):
        return {"reward": self.reward, "info": self.info, "actions": [vars(a) for a in self.actions]}


@dataclass
class EnvResponse:
    observation: str
    reward: float
    done: bool
    info: dict


class ModelCalled(AssertionError):
    pass


class LLMUserSimulationEnv:
    def __init__(self, model, provider):
        raise ModelCalled("the LLM user was constructed: that calls a model in τ-bench")

    def build_system_prompt(self, instruction):
        return f"You are a user interacting with an agent.\n\nInstruction: {instruction}\n"


class HumanUserSimulationEnv:
    def reset(self, instruction=None):
        raise ModelCalled("the human user was asked for input")

    def step(self, content):
        raise ModelCalled("the human user was asked for input")

    def get_total_cost(self):
        return 0


def load_user(user_strategy, model=None, provider=None):
    if user_strategy == "human":
        return HumanUserSimulationEnv()
    return LLMUserSimulationEnv(model=model, provider=provider)


DATA = {"orders": {"#1": {"status": "pending", "total": 42}, "#2": {"status": "delivered", "total": 7}}}


class GetOrder:
    @staticmethod
    def invoke(data, order_id):
        if order_id not in data["orders"]:
            return "Error: order not found"
        return str(data["orders"][order_id])

    @staticmethod
    def get_info():
        return {"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}


class CancelOrder:
    @staticmethod
    def invoke(data, order_id, reason):
        order = data["orders"].get(order_id)
        if order is None or order["status"] != "pending":
            return "Error: cannot cancel"
        order["status"] = "cancelled"
        return "cancelled"

    @staticmethod
    def get_info():
        return {"type": "function", "function": {"name": "cancel_order", "description": "Cancel a pending order.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                               "required": ["order_id", "reason"]}}}


class Env:
    """Shaped like tau_bench.envs.base.Env (reset, step, calculate_reward)."""

    def __init__(self, tasks, user_strategy, user_model, user_provider=None):
        self.data_load_func = lambda: copy.deepcopy(DATA)
        self.data = self.data_load_func()
        tools = [GetOrder, CancelOrder]
        self.tools_map = {t.get_info()["function"]["name"]: t for t in tools}
        self.tools_info = [t.get_info() for t in tools]
        self.terminate_tools = []
        self.tasks = tasks
        self.task = tasks[0]
        self.wiki = "# Retail policy\nCancel only pending orders."
        self.rules = ["Confirm before cancelling."]
        self.user = load_user(user_strategy, model=user_model, provider=user_provider)
        self.actions = []

    def reset(self, task_index=None):
        self.data = self.data_load_func()
        self.task = self.tasks[task_index]
        self.actions = []
        return self.user.reset(instruction=self.task.instruction)

    def step(self, action):
        self.actions.append(action)
        done, reward = False, 0
        if action.name == "respond":
            observation = self.user.step(action.kwargs["content"])
            done = "###STOP###" in observation
        elif action.name in self.tools_map:
            try:
                observation = self.tools_map[action.name].invoke(data=self.data, **action.kwargs)
            except Exception as e:  # noqa: BLE001 - as τ-bench does
                observation = f"Error: {e}"
        else:
            observation = f"Unknown action {action.name}"
        return EnvResponse(observation=observation, reward=reward, done=done, info={})

    def _hash(self):
        return hashlib.sha256(repr(sorted(self.data["orders"].items())).encode()).hexdigest()

    def calculate_reward(self):
        data_hash, reward = self._hash(), 1.0
        if self.task.outputs:
            said = " ".join(a.kwargs["content"].lower() for a in self.actions if a.name == "respond")
            outputs = {o: o.lower() in said for o in self.task.outputs}
            reward = float(all(outputs.values()))
            info = {"r_outputs": reward, "outputs": outputs}
        else:
            self.data = self.data_load_func()
            for action in self.task.actions:
                self.step(action)
            info = {"r_actions": data_hash == self._hash()}
            reward = float(info["r_actions"])
        return RewardResult(reward=reward, info=info, actions=self.task.actions)


TASKS = [
    Task("u1", "Cancel order #1 because you no longer need it.", [Action("cancel_order", {"order_id": "#1", "reason": "no longer needed"})]),
    Task("u2", "Ask for the total of order #1.", [Action("get_order", {"order_id": "#1"})], outputs=["42"]),
]


def get_env(env_name, user_strategy, user_model, task_split, user_provider=None):
    if env_name not in ("retail", "airline"):
        raise ValueError(f"Unknown environment: {env_name}")
    return Env(TASKS, user_strategy=user_strategy, user_model=user_model, user_provider=user_provider)


@pytest.fixture
def fake_tau_bench(monkeypatch):
    package = types.ModuleType("tau_bench")
    package.__path__ = []
    envs = types.ModuleType("tau_bench.envs")
    envs.__path__ = []
    envs.get_env = get_env
    user = types.ModuleType("tau_bench.envs.user")
    user.LLMUserSimulationEnv = LLMUserSimulationEnv
    tb_types = types.ModuleType("tau_bench.types")
    tb_types.Action = Action
    tb_types.RESPOND_ACTION_NAME = "respond"
    for name, module in {"tau_bench": package, "tau_bench.envs": envs, "tau_bench.envs.user": user, "tau_bench.types": tb_types}.items():
        monkeypatch.setitem(sys.modules, name, module)


CANCEL = '```python\ncancel_order(order_id="#1", reason="no longer needed")\n```'


def test_correct_actions_score_one_and_the_user_model_is_never_built(fake_tau_bench):
    from draco_gym.envs.tau.env import TauBenchEnv

    env = TauBenchEnv("tau_bench", "retail", task_id=0)
    obs, _ = env.reset(seed=0)
    assert "# Retail policy" in obs and "- Confirm before cancelling." in obs
    assert "cancel_order(order_id: string, reason: string)" in obs
    assert obs.rstrip().endswith("User: Cancel order #1 because you no longer need it.")
    obs, *_ = env.step(CANCEL)
    assert obs == "Tool result (cancel_order):\ncancelled"
    _, _, terminated, _, info = env.step("Your order #1 is cancelled.")
    assert terminated and info["metrics"]["reward"] == 1.0 and info["metrics"]["success"]
    assert info["metrics"]["evaluation"]["info"] == {"r_actions": True}


def test_wrong_actions_and_output_checks(fake_tau_bench):
    from draco_gym.envs.tau.env import TauBenchEnv

    env = TauBenchEnv("tau_bench", "retail", task_id="0")
    env.reset(seed=0)
    env.step('```python\ncancel_order(order_id="#2", reason="x")\n```')  # delivered: refused, DB unchanged
    _, _, _, _, info = env.step("Done.")
    assert info["metrics"]["reward"] == 0.0

    env = TauBenchEnv("tau_bench", "retail", task_id="1")
    env.reset(seed=0)
    env.step('```json\n{"name": "get_order", "arguments": {"order_id": "#1"}}\n```')
    _, _, _, _, info = env.step("The total of order #1 is 42 dollars.")
    assert info["metrics"]["reward"] == 1.0 and info["metrics"]["evaluation"]["info"]["outputs"] == {"42": True}
    env.reset(seed=0)
    _, _, _, _, info = env.step("I don't know the total.")
    assert info["metrics"]["reward"] == 0.0


def test_malformed_action_and_unknown_task(fake_tau_bench):
    from draco_gym.envs.tau.env import TauBenchEnv

    env = TauBenchEnv("tau_bench", "retail", task_id=0)
    env.reset(seed=0)
    obs, _, terminated, _, _ = env.step("```python\ncancel_order('#1')\n```")
    assert obs.startswith("Error: ") and not terminated
    assert env.backend._env.actions == []  # nothing reached τ-bench
    with pytest.raises(ValueError, match="unknown task_id '7'"):
        TauBenchEnv("tau_bench", "retail", task_id=7)
    with pytest.raises(ValueError, match="rejected domain 'shop'"):
        TauBenchEnv("tau_bench", "shop")


def test_truncated_episode_scores_zero_without_grading(fake_tau_bench):
    from draco_gym.envs.tau.env import TauBenchEnv

    env = TauBenchEnv("tau_bench", "retail", task_id=0, max_turns=1)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(CANCEL)
    assert truncated and info["metrics"]["reward"] == 0.0 and "scores it 0" in info["metrics"]["evaluation"]["note"]


def test_missing_tau_bench_gives_an_install_hint(monkeypatch):
    from draco_gym.envs.tau.backends import BackendError, load_tau_bench

    monkeypatch.setitem(sys.modules, "tau_bench", None)
    with pytest.raises(BackendError, match="sierra-research/tau-bench"):
        load_tau_bench()
