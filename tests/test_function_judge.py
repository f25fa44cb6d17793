"""A judge of the user's own code, named in YAML: ``judge: {name: function, target:
"module:callable"}``, a function ``fn(messages) -> text`` or a Judge class built with the
other options."""

from __future__ import annotations

import json
import sys

import pytest

from draco_gym.reward import build_reward
from draco_gym.reward.judges import FunctionJudge, as_judge
from draco_gym.types import Step, Task, Trajectory

USER_MODULE = '''
import json

SEEN = []

def passes_everything(messages):
    """Answers every stage with the same object (a scripted judge), keeping what it was sent."""
    SEEN.append(messages)
    return json.dumps({"criteria": [], "verdicts": []})

class Strict:
    def __init__(self, verdict="FAIL"):
        self.verdict = verdict
    async def complete(self, messages, *, schema=None, schema_name="", temperature=0.1, max_tokens=1024, sample=0):
        from draco_gym.reward.judge_protocol import JudgeReply
        return JudgeReply(json.dumps({"verdict": self.verdict}))
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_judges.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_judges"
    sys.modules.pop("my_judges", None)


def test_a_function_named_in_yaml_is_the_judge(user_module):
    judge = as_judge({"name": "function", "target": f"{user_module}:passes_everything"})
    assert isinstance(judge, FunctionJudge) and judge.model == f"{user_module}:passes_everything"


def test_a_class_named_in_yaml_is_built_with_the_other_options(user_module):
    import asyncio

    judge = as_judge({"name": "function", "target": f"{user_module}:Strict", "verdict": "PASS"})
    reply = asyncio.run(judge.complete([{"role": "user", "content": "?"}]))
    assert json.loads(reply.text) == {"verdict": "PASS"}


def test_the_rubric_asks_the_users_function(user_module):
    """The whole path from a config dict: the dynamic rubric's stages reach the user's
    function, with the fenced trajectory in their prompts."""
    import my_judges

    task = Task(id="t", instruction="Submit 3.")
    group = [Trajectory(task=task, termination="no_code", steps=[
        Step(index=1, text=f"```python\nsubmit({n})\n```", code=f"submit({n})", observation="ok")]) for n in (3, 4)]
    reward = build_reward("dynamic", judge={"name": "function", "target": f"{user_module}:passes_everything"},
                          retries=0, max_repairs=0)
    scored = reward.score_group(task, group)
    assert len(scored.rewards) == 2
    prompts = ["\n".join(m["content"] for m in messages) for messages in my_judges.SEEN]
    assert prompts and any("<trajectory" in p and "submit(4)" in p for p in prompts)


@pytest.mark.parametrize("target, message", [
    ("no_colon", "must be written 'module:name'"),
    ("my_judges:missing", "has no attribute 'missing'"),
    ("no_such_module_anywhere:f", "No module named"),
])
def test_a_bad_target_names_the_key(user_module, target, message):
    with pytest.raises(ValueError, match="judge.target") as err:
        as_judge({"name": "function", "target": target})
    assert message in str(err.value)


def test_options_for_a_function_are_refused(user_module):
    with pytest.raises(ValueError, match="takes no options"):
        as_judge({"name": "function", "target": f"{user_module}:passes_everything", "verdict": "PASS"})
