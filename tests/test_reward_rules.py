"""Judge-free rewards: TRCA transition items, the rule rubric, the outcome reward, and the
TRL adapter's grouping (no TRL needed), all against numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from draco_gym.reward import (
    FAMILIES,
    OutcomeReward,
    RuleRubricReward,
    TRLReward,
    foundational_rewards,
    item_score,
    transition_items,
)
from draco_gym.reward.rules import RULE_CRITERIA, rule_library, rule_verdicts
from draco_gym.types import Step, Task, Trajectory

TASK = Task(id="music-1", instruction="Like every song in my playlist.", metadata={"api_docs": True})


def step(j, text, code=None, observation="", *, parse_error=None, exec_error=None, submitted=False):
    info = {"parse": {"n_blocks": int(code is not None), "error": parse_error, "warning": None}, "exec_error": exec_error}
    if submitted:
        info["submitted"] = True
    return Step(index=j, text=text, code=code, observation=observation, info=info, n_tokens=5)


SEARCH = "x = apis.spotify.search(q='a')"
MESSY = Trajectory(task=TASK, termination="no_code", steps=[
    step(1, "look", "print(apis.api_docs.show_api_descriptions('spotify'))", "login, search"),
    step(2, "try", SEARCH, "Traceback (most recent call last):\nKeyError: 'q'", exec_error="KeyError"),
    step(3, "again", SEARCH, "Traceback (most recent call last):\nKeyError: 'q'", exec_error="KeyError"),
    step(4, "two blocks", None, "Error: found 2 code blocks.", parse_error="found 2 code blocks"),
    step(5, "fix", "print(apis.spotify.search(query='a', page=1))", "song list"),
    step(6, "finish", "apis.supervisor.complete_task()", "done", submitted=True),
    step(7, "All done."),
])
CLEAN = Trajectory(task=TASK, termination="no_code", steps=[
    step(1, "finish", "apis.supervisor.complete_task()", "done", submitted=True),
    step(2, "Done."),
])


def test_transition_items_by_hand():
    hits = transition_items(MESSY)
    assert hits[0] == {"evidence": ["reads_documentation", "observes_output", "novel_observation"],
                       "execution": ["runs_cleanly"], "invalidity": []}
    assert hits[1] == {"evidence": [], "execution": [], "invalidity": ["execution_error"]}
    # the same failing call again: the error counts, the repetition is not an item (it earns
    # no breakthrough in TRCA instead)
    assert hits[2] == {"evidence": [], "execution": [], "invalidity": ["execution_error"]}
    assert hits[3] == {"evidence": [], "execution": [], "invalidity": ["malformed_block"]}
    assert hits[4] == {"evidence": ["observes_output", "novel_observation"],
                       "execution": ["runs_cleanly", "recovers_from_error"], "invalidity": []}
    assert hits[5] == {"evidence": ["observes_output", "novel_observation"],
                       "execution": ["runs_cleanly", "submits"], "invalidity": []}
    assert hits[6] == {"evidence": [], "execution": [], "invalidity": []}  # the closing turn is normal


def test_item_scores_and_foundational_rewards():
    # generic library: evidence 2 items (1/2 each), execution 3 (1/3), invalidity 3 (-1/3)
    assert {f: (s.sign, s.budget, s.items) for f, s in FAMILIES.items()} == {
        "evidence": (1, 1.0, ("observes_output", "novel_observation")),
        "execution": (1, 1.0, ("runs_cleanly", "recovers_from_error", "submits")),
        "invalidity": (-1, 1.0, ("malformed_block", "execution_error", "missing_block"))}
    assert item_score("evidence", "observes_output") == pytest.approx(1 / 2)
    assert item_score("invalidity", "execution_error") == pytest.approx(-1 / 3)
    # a task with API docs has a third evidence item: 1/3 each
    assert item_score("evidence", "observes_output", TASK) == pytest.approx(1 / 3)
    with pytest.raises(KeyError, match="reads_documentation"):
        item_score("evidence", "reads_documentation")  # no docs declared: not an item
    # step 1: 3 evidence (1) + runs (1/3); 2, 3: one error (-1/3); 4: malformed (-1/3);
    # 5: 2 evidence (2/3) + runs, recovers (2/3); 6: 2 evidence + runs, submits; 7: nothing
    expected = [4 / 3, -1 / 3, -1 / 3, -1 / 3, 4 / 3, 4 / 3, 0.0]
    assert foundational_rewards(MESSY) == pytest.approx(expected)


def test_rule_verdicts_cite_steps():
    verdicts = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(MESSY)}
    titles = {c.title for c in rule_library(TASK).criteria}
    assert set(verdicts) == titles and len(titles) == 9
    assert verdicts["Reads the API documentation"] == (1, [1])
    assert verdicts["Changes approach after an error"] == (1, [5])
    assert verdicts["Writes no code that raises an error"] == (-1, [2, 3])
    assert verdicts["Writes no malformed code block"] == (-1, [4])
    assert verdicts["Leaves no turn without code before the end"] == (1, [1, 2, 3, 5, 6])  # passed: the steps with code
    clean = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(CLEAN)}
    assert clean["Reads the API documentation"] == (-1, [1])  # omission: cited at the last action
    assert clean["Changes approach after an error"] == (0, [])  # nothing failed: not applicable
    # a title says what passing means: the clean rollout raised nothing and PASSes it
    assert clean["Writes no code that raises an error"] == (1, [1])


def test_generic_criteria_read_as_what_passing_means():
    assert [c.title for c in RULE_CRITERIA] == [
        "Gets output from its code", "Obtains information not seen before", "Has code that runs without errors",
        "Changes approach after an error", "Signals that the task is complete", "Writes no malformed code block",
        "Writes no code that raises an error", "Leaves no turn without code before the end"]


def test_api_doc_item_only_where_the_env_declares_docs():
    """A calculator env has no API documentation: no rollout of it can fail "Reads the API
    documentation", because the item does not exist there."""
    calc = Task(id="calc-1", instruction="What is 6 * 7?")
    rollout = Trajectory(task=calc, termination="no_code", steps=[
        step(1, "compute", "print(6 * 7)", "42"), step(2, "compute", "submit(42)", "", submitted=True), step(3, "42")])
    group = RuleRubricReward(dropout=False).score_group(calc, [rollout])
    titles = [c.title for c in group.criteria]
    assert not any("documentation" in t for t in titles) and len(titles) == 8
    assert group.scores[0].f == 0 and group.rewards == [1.0]  # nothing failed, so R = 1
    documented = calc.model_copy(update={"metadata": {"api_docs": True}})
    group = RuleRubricReward(dropout=False).score_group(documented, [rollout.model_copy(update={"task": documented})])
    assert "Reads the API documentation" in [c.title for c in group.criteria] and group.scores[0].f == 1


def test_rule_reward_with_dropout_by_hand():
    group = RuleRubricReward().score_group(TASK, [MESSY, CLEAN])
    # nobody failed: observes_output, novel_observation, runs_cleanly, recovers_from_error
    # (MESSY passed it, CLEAN had no error), submits, missing_block
    assert len(group.dropped) == 6
    kept = [c.title for c in group.criteria]
    assert kept == ["Reads the API documentation", "Writes no malformed code block", "Writes no code that raises an error"]
    # MESSY: P F F -> -1/3;  CLEAN: F P P -> +1/3
    assert group.rewards == pytest.approx([-1 / 3, 1 / 3])
    assert group.scores[0].step_counts(7) == ([1, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0])
    assert group.scores[1].step_counts(2) == ([2, 0], [1, 0])
    assert group.fallbacks == [] and group.usage == {}


def test_rules_read_text_when_info_is_missing():
    bare = Trajectory(task=TASK, steps=[
        Step(index=1, text="t", code="1/0", observation="Traceback (most recent call last):\nZeroDivisionError: division by zero"),
        Step(index=2, text="t", code="print(2)", observation="2"),
    ])
    hits = transition_items(bare)
    assert hits[0]["invalidity"] == ["execution_error"]
    assert hits[1]["execution"] == ["runs_cleanly", "recovers_from_error"]
    # an unfinished episode: a turn with no code in the middle is a wasted turn
    middle = Trajectory(task=TASK, termination="max_turns", steps=[Step(index=1, text="hmm"), Step(index=2, text="x", code="1", observation="1")])
    assert transition_items(middle)[0]["invalidity"] == ["missing_block"]


def test_empty_trajectory_is_scored_not_crashed():
    empty = Trajectory(task=TASK, steps=[])
    group = RuleRubricReward().score_group(TASK, [empty, CLEAN])
    assert len(group.scores) == 2 and all(math.isfinite(r) for r in group.rewards)


def test_outcome_reward():
    trajs = [Trajectory(task=TASK, metrics=m) for m in ({"success": True}, {"success": 0.25}, {}, {"success": float("nan")})]
    group = OutcomeReward().score_group(TASK, trajs)
    assert group.rewards == [1.0, 0.25, 0.0, 0.0]
    assert [f.split(":")[0] for f in group.fallbacks] == ["outcome[3]", "outcome[4]"]
    assert group.criteria == [] and all(not s.verdicts for s in group.scores)
    ratio = OutcomeReward(ratio=("tests_passed", "tests_total")).score_group(
        TASK, [Trajectory(task=TASK, metrics={"tests_passed": 3, "tests_total": 4})])
    assert ratio.rewards == [0.75]


def test_trl_adapter_groups_adjacent_completions():
    reward = TRLReward(RuleRubricReward(), num_generations=2)
    prompts = ["Like every song."] * 2 + [[{"role": "system", "content": "sys"}, {"role": "user", "content": "Delete the alarm."}]] * 2
    completions = [
        "```python\nprint(apis.api_docs.show_api_descriptions('x'))\n```",
        "```python\n1/0\n```",
        [{"role": "assistant", "content": "```python\nprint(1)\n```"}, {"role": "tool", "content": "1"},
         {"role": "assistant", "content": "done"}],
        [{"role": "assistant", "content": "no code at all"}],
    ]
    rewards = reward(prompts=prompts, completions=completions, task_id=["a", "a", "b", "b"])
    assert len(rewards) == 4 and reward.__name__ == "draco_rule"
    assert [len(m) for m, _ in reward.last_groups] == [2, 2]
    (first, g1), (second, g2) = reward.last_groups
    assert first[0].task.id == "a" and second[0].task.agent_prompt == "sys" and second[0].task.instruction == "Delete the alarm."
    assert [len(t.steps) for t in second] == [2, 1] and second[0].steps[0].observation == "1"
    assert rewards == g1.rewards + g2.rewards
    # completions that never ran look alike when the task declares no API docs
    assert rewards[0] == rewards[1]
    # the completion that ran code and saw its output beats the one with no code at all
    assert rewards[2] > rewards[3]
