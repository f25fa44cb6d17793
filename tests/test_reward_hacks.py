"""The reward-hack catalogue's judge family (``bench/reward_hacks.py``) holds, and it can tell:
with the boundary it probes taken away (a parser that reads the first ``{`` to the last
``}``, a renderer that does not escape), it reports the forgery. The environment and rubric
families run in the slow tests of their own (tests/test_sandbox_hacks.py,
tests/test_appworld_hacks.py, tests/test_reward_rules_sweep.py)."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import reward_hacks  # noqa: E402


def forged(family=reward_hacks.judge) -> list[str]:
    return [t.name for t in family("bwrap") if t.forged]


def test_judge_family_holds():
    tried = list(reward_hacks.judge("bwrap"))
    assert len(tried) == 6 and not [t.name for t in tried if t.forged]


def test_judge_family_sees_a_brace_span_parser(monkeypatch):
    from draco_gym.reward import answers

    def brace_span(text):
        try:
            return json.loads(text[text.index("{"):text.rindex("}") + 1])
        except ValueError:
            raise answers.InvalidAnswer(["not JSON"]) from None

    monkeypatch.setattr(answers, "extract_json", brace_span)
    assert "judge reply: quoted_in_prose" in forged()


def test_judge_family_sees_unescaped_agent_text(monkeypatch):
    from draco_gym.reward import render

    monkeypatch.setattr(render, "escape", str)
    assert "agent text: element_close" in forged()
