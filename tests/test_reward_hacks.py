"""The reward-hack catalogue's judge, hostile and near-miss families (``bench/reward_hacks.py``)
hold, and they can tell: with the boundary each probes taken away (a parser that reads the
first ``{`` to the last ``}``, a renderer that does not escape, lone surrogates left in the
text, a shop check that passes any value), they report the forgery. The environment, rubric
and no-op families run in tests of their own (tests/test_sandbox_hacks.py,
tests/test_appworld_hacks.py, tests/test_reward_rules_sweep.py, tests/test_noop_tasks.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest

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


def test_hostile_family_holds():
    """A lone surrogate, invalid bytes and values nested 1200 deep go through env.step, the
    rollout log, the renderer and the rule rubric (guard: AppWorld's row is bwrap's)."""
    tried = list(reward_hacks.hostile("guard"))
    assert len(tried) == len(reward_hacks.HOSTILE) and not [t.name for t in tried if t.forged]


def test_hostile_family_sees_lone_surrogates_kept(monkeypatch):
    import re

    from draco_gym import text

    monkeypatch.setattr(text, "_SURROGATE", re.compile("(?!)"))  # valid_text finds no surrogate to replace
    assert "a lone surrogate printed" in forged(lambda sandbox: reward_hacks.hostile("guard"))


@pytest.mark.slow
def test_nearmiss_family_holds_and_sees_a_check_that_ignores_the_value(monkeypatch):
    """The first task of each family's near-misses all fail their check (guard: AppWorld's
    rows are bwrap's); with the shop's answer check passing any submitted value, they pass."""
    tried = list(reward_hacks.nearmiss("guard"))
    assert len(tried) > 50 and not [t.name for t in tried if t.forged]
    from draco_gym.envs import python_tools

    monkeypatch.setattr(python_tools, "answers_match", lambda answer, expected: True)
    assert "shop purchase purchase-1: the right lookup, then submit(0)" in forged(
        lambda sandbox: reward_hacks.nearmiss("guard"))
