"""Judge-free rewards: TRCA transition items, the rule rubric, the outcome reward, and the
TRL adapter's grouping (no TRL needed), all against numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from draco_gym.reward import (
    FAMILIES,
    FallbackKind,
    OutcomeReward,
    RuleRubricReward,
    TRLReward,
    build_reward,
    count_fallbacks,
    fallback_kind,
    foundational_rewards,
    item_score,
    transition_items,
)
from draco_gym.reward.rules import RULE_CRITERIA, rule_library, rule_verdicts
from draco_gym.algos.credit import get_credit_rule, group_advantages
from draco_gym.envs.shop import purchase_tasks
from draco_gym.types import TOOL_CALLS, Step, Task, Trajectory

TASK = Task(id="music-1", instruction="Like every song in my playlist.", metadata={"api_docs": True})


def call(name, ok=True, **extra):
    return {"name": name, "ok": ok, **extra}


def step(j, text, code=None, observation="", *, parse_error=None, exec_error=None, submitted=False, calls=None):
    """A step as the environment records it: ``calls`` are the tool calls the block made
    (``Step.info["tool_calls"]``; None: the environment records none)."""
    info = {"parse": {"n_blocks": int(code is not None), "error": parse_error, "warning": None}, "exec_error": exec_error}
    if submitted:
        info["submitted"] = True
    if calls is not None:
        info[TOOL_CALLS] = calls
    return Step(index=j, text=text, code=code, observation=observation, info=info, n_tokens=5)


SEARCH = "x = apis.spotify.search(q='a')"
MESSY = Trajectory(task=TASK, termination="no_code", steps=[
    step(1, "look", "print(apis.api_docs.show_api_descriptions('spotify'))", "login, search",
         calls=[call("apis.api_docs.show_api_descriptions")]),
    step(2, "try", SEARCH, "Traceback (most recent call last):\nKeyError: 'q'", exec_error="KeyError",
         calls=[call("apis.spotify.search", ok=False)]),
    step(3, "again", SEARCH, "Traceback (most recent call last):\nKeyError: 'q'", exec_error="KeyError",
         calls=[call("apis.spotify.search", ok=False)]),
    step(4, "two blocks", None, "Error: found 2 code blocks.", parse_error="found 2 code blocks"),
    step(5, "fix", "print(apis.spotify.search(query='a', page=1))", "song list", calls=[call("apis.spotify.search")]),
    step(6, "finish", "apis.supervisor.complete_task()", "done", submitted=True,
         calls=[call("apis.supervisor.complete_task")]),
    step(7, "All done."),
])
CLEAN = Trajectory(task=TASK, termination="no_code", steps=[
    step(1, "finish", "apis.supervisor.complete_task()", "done", submitted=True,
         calls=[call("apis.supervisor.complete_task")]),
    step(2, "Done."),
])


def test_transition_items_by_hand():
    hits = transition_items(MESSY)
    assert hits[0] == {"evidence": ["reads_documentation"], "execution": ["runs_cleanly"], "invalidity": []}
    # a call that raised: the block's error and the tool's failure are both invalid
    assert hits[1] == {"evidence": [], "execution": [], "invalidity": ["execution_error", "tool_error"]}
    # the same failing call again: the error counts, the repetition is not an item (it earns
    # no breakthrough in TRCA instead)
    assert hits[2] == {"evidence": [], "execution": [], "invalidity": ["execution_error", "tool_error"]}
    assert hits[3] == {"evidence": [], "execution": [], "invalidity": ["malformed_block"]}
    assert hits[4] == {"evidence": ["gets_tool_result"], "execution": ["runs_cleanly", "recovers_from_error"],
                       "invalidity": []}
    # submitting is not evidence, even though complete_task returned
    assert hits[5] == {"evidence": [], "execution": ["runs_cleanly", "submits"], "invalidity": []}
    assert hits[6] == {"evidence": [], "execution": [], "invalidity": []}  # the closing turn is normal


def test_item_scores_and_foundational_rewards():
    # generic library: evidence 1 item (1), execution 3 (1/3), invalidity 4 (-1/4)
    assert {f: (s.sign, s.budget, s.items) for f, s in FAMILIES.items()} == {
        "evidence": (1, 1.0, ("gets_tool_result",)),
        "execution": (1, 1.0, ("runs_cleanly", "recovers_from_error", "submits")),
        "invalidity": (-1, 1.0, ("malformed_block", "execution_error", "tool_error", "missing_block"))}
    assert item_score("evidence", "gets_tool_result") == pytest.approx(1.0)
    assert item_score("invalidity", "execution_error") == pytest.approx(-1 / 4)
    # a task with API docs has a second evidence item: 1/2 each
    assert item_score("evidence", "gets_tool_result", TASK) == pytest.approx(1 / 2)
    with pytest.raises(KeyError, match="reads_documentation"):
        item_score("evidence", "reads_documentation")  # no docs declared: not an item
    # step 1: docs (1/2) + runs (1/3); 2, 3: error + tool error (-1/2); 4: malformed (-1/4);
    # 5: tool result (1/2) + runs, recovers (2/3); 6: runs, submits (2/3); 7: nothing
    expected = [5 / 6, -1 / 2, -1 / 2, -1 / 4, 7 / 6, 2 / 3, 0.0]
    assert foundational_rewards(MESSY) == pytest.approx(expected)


def test_rule_verdicts_cite_steps():
    verdicts = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(MESSY)}
    titles = {c.title for c in rule_library(TASK).criteria}
    assert set(verdicts) == titles and len(titles) == 9
    assert verdicts["Reads the API documentation"] == (1, [1])
    assert verdicts["Gets a result from a tool"] == (1, [5])
    assert verdicts["After a failed step, takes one that works"] == (1, [5])
    assert verdicts["Writes no code that raises an error"] == (-1, [2, 3])
    assert verdicts["Makes no tool call that fails"] == (-1, [2, 3])
    assert verdicts["Writes no malformed code block"] == (-1, [4])
    assert verdicts["Leaves no turn without code before the end"] == (1, [1, 2, 3, 5, 6])  # passed: the steps with code
    clean = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(CLEAN)}
    assert clean["Reads the API documentation"] == (-1, [])  # an omission: no step is cited
    assert clean["Gets a result from a tool"] == (-1, [])  # it only submitted
    assert clean["After a failed step, takes one that works"] == (0, [])  # nothing failed: not applicable
    # a title says what passing means: the clean rollout raised nothing and PASSes it
    assert clean["Writes no code that raises an error"] == (1, [1])


def test_generic_criteria_read_as_what_passing_means():
    assert [c.title for c in RULE_CRITERIA] == [
        "Gets a result from a tool", "Has code that runs without errors", "After a failed step, takes one that works",
        "Submits the task", "Writes no malformed code block", "Writes no code that raises an error",
        "Makes no tool call that fails", "Leaves no turn without code before the end"]
    assert all("recorded" in c.evaluator_instruction for c in RULE_CRITERIA)


def test_api_doc_item_only_where_the_env_declares_docs():
    """A calculator env has no API documentation: no rollout of it can fail "Reads the API
    documentation", because the item does not exist there."""
    calc = Task(id="calc-1", instruction="What is 6 * 7?")
    rollout = Trajectory(task=calc, termination="no_code", steps=[
        step(1, "compute", "print(mul(6, 7))", "42", calls=[call("mul")]),
        step(2, "compute", "submit(42)", "", submitted=True, calls=[call("submit")]), step(3, "42")])
    group = RuleRubricReward(dropout=False).score_group(calc, [rollout])
    titles = [c.title for c in group.criteria]
    assert not any("documentation" in t for t in titles) and len(titles) == 8
    assert group.scores[0].f == 0 and group.rewards == [1.0]  # nothing failed, so R = 1
    documented = calc.model_copy(update={"metadata": {"api_docs": True}})
    group = RuleRubricReward(dropout=False).score_group(documented, [rollout.model_copy(update={"task": documented})])
    assert "Reads the API documentation" in [c.title for c in group.criteria] and group.scores[0].f == 1


def test_rule_reward_with_dropout_by_hand():
    group = RuleRubricReward().score_group(TASK, [MESSY, CLEAN])
    # nobody failed: runs_cleanly, recovers_from_error (MESSY passed it, CLEAN had no
    # error), submits, missing_block
    assert len(group.dropped) == 4
    kept = [c.title for c in group.criteria]
    assert kept == ["Reads the API documentation", "Gets a result from a tool", "Writes no malformed code block",
                    "Writes no code that raises an error", "Makes no tool call that fails"]
    # MESSY: P P F F F -> -1/5;  CLEAN: F F P P P -> +1/5
    assert group.rewards == pytest.approx([-1 / 5, 1 / 5])
    assert group.scores[0].step_counts(7) == ([1, 0, 0, 0, 1, 0, 0], [0, 2, 2, 1, 0, 0, 0])
    assert group.scores[1].step_counts(2) == ([3, 0], [0, 0])  # its two FAILs are omissions
    assert group.fallbacks == [] and group.usage == {}


# -- an omission: a criterion failed because something never happened ------------------------

AUTHOR = Task(id="author-1", instruction='Who wrote "Salt Harbour"? Submit the name.',
              metadata={"operators": {"evidence": ["find_book", "get_author"], "execution": ["submit"]}})


def sized(j, n_tokens, code, *, exec_error=None, calls=()):
    return step(j, f"```python\n{code}\n```", code, "", exec_error=exec_error, calls=list(calls)).model_copy(
        update={"n_tokens": n_tokens})


# The winner: a short step (8 tokens) that raised, then a long one (60) that found the book
# and was cut off before it asked for the author or submitted. The loser: two steps that raised
# (the first in a get_author call that failed).
OMITS = Trajectory(task=AUTHOR, termination="length", steps=[
    sized(1, 8, "bok", exec_error="NameError"),
    sized(2, 60, 'book = find_book("Salt Harbour")', calls=[call("find_book")])])
RAISES = Trajectory(task=AUTHOR, termination="length", steps=[
    sized(1, 40, "get_author(7)", exec_error="KeyError", calls=[call("get_author", ok=False)]),
    sized(2, 40, "bok", exec_error="NameError")])


def test_an_omission_fails_without_citing_a_step():
    verdicts = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(OMITS)}
    assert verdicts["Gets data from get_author"] == (-1, [])  # never called: no step did it
    assert verdicts["Calls submit"] == (-1, [])
    assert verdicts["Gets data from find_book"] == (1, [2])
    assert verdicts["Writes no code that raises an error"] == (-1, [1])  # a step did raise: cited


def test_an_omission_moves_no_step_credit():
    """Surviving criteria: find_book, get_author, submit, no raise, no failing tool call.
    R = (2 - 3) / 5 = -0.2 for the winner, -1 for the loser: A = [+1, -1].

    Winner, uncited omissions: step 1 PASS (no failing tool call) and FAIL (raised), Q_1 = 1/2;
    step 2 PASS (find_book, no failing tool call), Q_2 = 1. N = 68, w = [1/2, 1], sum 3/2:
    a_1 = 68 * 0.5 / (8 * 1.5) = 2.8333, a_2 = 68 / (60 * 1.5) = 0.7556 (totals 22.67 + 45.33 = 68).
    With both omissions cited at the last code step, Q_2 = 2/4 and a_1 = 68 * 0.5 / 8 = 4.25
    per token (4.25 A_i) for the step that raised: step 2 took the blame for what no step did."""
    group = RuleRubricReward().score_group(AUTHOR, [OMITS, RAISES])
    assert [c.title for c in group.criteria] == [
        "Gets data from find_book", "Gets data from get_author", "Calls submit",
        "Writes no code that raises an error", "Makes no tool call that fails"]
    assert group.rewards == pytest.approx([-0.2, -1.0])
    advantages = group_advantages(group.rewards)
    assert advantages == pytest.approx([1.0, -1.0], rel=1e-5)
    winner, loser = get_credit_rule("draco")([OMITS, RAISES], group, advantages)
    assert winner == pytest.approx([68 * 0.5 / (8 * 1.5), 68 / (60 * 1.5)], rel=1e-5)
    assert 8 * winner[0] + 60 * winner[1] == pytest.approx(68 * advantages[0])
    # the loser's steps both raised (Q = 0): uniform suppression, omissions or not
    assert loser == pytest.approx([-1.0, -1.0], rel=1e-5)
    # the same credit as if the omitted criteria had no verdict at all: they reach R_i only
    witnessed = [s.model_copy(update={"verdicts": [v for v in s.verdicts if v.cited_steps or v.score == 0]})
                 for s in group.scores]
    again = get_credit_rule("draco")([OMITS, RAISES], group.model_copy(update={"scores": witnessed}), advantages)
    assert again[0] == pytest.approx(winner) and again[1] == pytest.approx(loser)


# -- the red team's group: a comment naming a tool calls nothing ------------------------------

PURCHASE_1 = next(t for t in purchase_tasks() if t["id"] == "purchase-1")
PURCHASE = Task(id="purchase-1", instruction=PURCHASE_1["instruction"], metadata=PURCHASE_1["metadata"])


def one_block(code, observation, calls, *, submitted=True):
    return Trajectory(task=PURCHASE, termination="submitted" if submitted else "max_turns",
                      steps=[step(1, f"```python\n{code}\n```", code, observation, submitted=submitted, calls=calls)])


@pytest.mark.parametrize("submit_recorded", [True, False], ids=["submit-recorded", "submit-not-recorded"])
def test_reference_outranks_comment_and_print_attempts(submit_recorded):
    """purchase-1 as the env records it: the reference looks the product up and submits
    without printing; the other two submit 0, one after a comment naming the tool, one after
    print('hi'). Under source-text matching and output items the rubric gave [-1, -1, +1]."""
    submit = [call("submit")] if submit_recorded else []
    lookup = call("get_product", arguments={"product_id": "P101"})
    reference = one_block(PURCHASE_1["metadata"]["reference"][0], "", [lookup] + submit)
    comment = one_block("# get_product('P101')\nsubmit(0)", "", list(submit))
    printer = one_block("print('hi')\nsubmit(0)", "hi", list(submit))
    group = RuleRubricReward().score_group(PURCHASE, [reference, comment, printer])
    # every other item is passed by all three (or not applicable) and dropped
    assert [c.title for c in group.criteria] == ["Gets data from get_product(product_id='P101')"]
    assert group.rewards == [1.0, -1.0, -1.0]
    # with a no-op beside them (a block that does nothing, twice, no submission), "Calls
    # submit" survives dropout too: reference P P -> 1; comment, print F P -> 0; no-op F F -> -1
    noop = Trajectory(task=PURCHASE, termination="max_turns",
                      steps=[step(k, "```python\npass\n```", "pass", "", calls=[]) for k in (1, 2)])
    group = RuleRubricReward().score_group(PURCHASE, [reference, comment, printer, noop])
    assert [c.title for c in group.criteria] == ["Gets data from get_product(product_id='P101')", "Calls submit"]
    assert group.rewards == [1.0, 0.0, 0.0, -1.0]


# -- a checkable result: the rubric never pays a wrong answer as much as the right one ---------

def submitted(code, calls, *, success):
    """A one-block purchase-1 rollout that submitted, as the env records it, with its check."""
    return one_block(code, "", calls + [call("submit")]).model_copy(
        update={"metrics": {"submitted": True, "success": success}})


LOOKUP = call("get_product", arguments={"product_id": "P101"})


def test_wrong_answers_rank_below_the_reference_under_the_rule_rubric_alone():
    """The red team's four near-misses on purchase-1 (issue 36): the right call then a wrong
    submission, a wrong id then submit(0), list_products() then submit(0), every product
    then submit(0). Before the outcome criterion and the argument-checked lookup, each got
    rule reward 1.0, equal to the reference."""
    reference = submitted(PURCHASE_1["metadata"]["reference"][0], [LOOKUP], success=True)
    wrong_submit = submitted('p = get_product("P101")\nsubmit(p["price"] * 7)', [LOOKUP], success=False)
    wrong_id = submitted('get_product("P140")\nsubmit(0)', [call("get_product", arguments={"product_id": "P140"})],
                         success=False)
    listing = submitted("list_products()\nsubmit(0)", [call("list_products", arguments={"category": None, "page": 1})],
                        success=False)
    every = submitted("...", [call("get_product", arguments={"product_id": f"P{101 + k}"}) for k in range(40)],
                      success=False)
    near_misses = [wrong_submit, wrong_id, listing, every]
    for miss in near_misses:  # each alone beside the reference, and all together
        group = RuleRubricReward().score_group(PURCHASE, [reference, miss])
        assert group.rewards[0] == 1.0 and group.rewards[1] < 1.0, (miss.steps[0].code, group.rewards)
    group = RuleRubricReward().score_group(PURCHASE, [reference, *near_misses])
    assert group.criteria[0].title == "Submits the right answer"  # the outcome criterion comes first
    assert group.rewards[0] == 1.0 and max(group.rewards[1:]) < 1.0
    verdicts = {name: {v.criterion: (v.score, v.cited_steps) for v in s.verdicts}
                for name, s in zip(["ref", "submit", "id", "list", "every"], group.scores)}
    assert verdicts["ref"]["Submits the right answer"] == (1, [1])  # cited at the step that handed it in
    assert verdicts["submit"]["Submits the right answer"] == (-1, [1])
    # the wrong lookup is cited at the step that made it, not left as an omission
    assert verdicts["id"]["Gets data from get_product(product_id='P101')"] == (-1, [1])
    assert verdicts["list"]["Gets data from get_product(product_id='P101')"] == (-1, [])  # never looked a product up
    # looking up every product includes the right one: the lookup passes, the answer does not
    assert verdicts["every"]["Gets data from get_product(product_id='P101')"] == (1, [1])


def test_outcome_criterion_only_where_the_env_checked_the_result():
    """No boolean ``metrics["success"]`` in the group: no outcome criterion (the rubric
    cannot see correctness); a rollout of a checked group without the check: not applicable;
    one that never handed anything in: an omission."""
    plain = [one_block("submit(1)", "", [call("submit")]), one_block("pass", "", [], submitted=False)]
    group = RuleRubricReward(dropout=False).score_group(PURCHASE, plain)
    assert "Submits the right answer" not in [c.title for c in group.criteria]
    unchecked = plain[0].model_copy(update={"metrics": {"success": 1.0}})  # not a boolean: no check recorded
    never = plain[1].model_copy(update={"metrics": {"submitted": False, "success": False}})
    group = RuleRubricReward(dropout=False).score_group(PURCHASE, [unchecked, never])
    first = [(s.verdicts[0].criterion, s.verdicts[0].score, s.verdicts[0].cited_steps) for s in group.scores]
    assert first == [("Submits the right answer", 0, []), ("Submits the right answer", -1, [])]


def test_operator_with_arguments_is_hit_only_by_that_call():
    task = Task(id="t", instruction="x", metadata={"operators": {
        "evidence": ["find_customer(name='Ada Park')", "list_orders(customer_id='C01')"], "execution": ["submit"]}})
    library = rule_library(task)
    assert [c.title for c in library.criteria][:3] == [
        "Gets data from find_customer(name='Ada Park')", "Gets data from list_orders(customer_id='C01')", "Calls submit"]
    rollout = Trajectory(task=task, termination="max_turns", steps=[
        # text compared case- and space-insensitively; extra recorded arguments (page) do not matter
        step(1, "t", "...", "", calls=[call("find_customer", arguments={"name": " ada  PARK"})]),
        step(2, "t", "...", "", calls=[call("list_orders", arguments={"customer_id": "C02", "page": 1})]),
        step(3, "t", "...", "", calls=[call("list_orders", ok=False, arguments={"customer_id": "C01", "page": 9})]),
        step(4, "t", "...", "", calls=[call("list_orders")]),  # no arguments recorded: matches no declared one
    ])
    hits = library.transition_items(rollout)
    assert [h["evidence"] for h in hits] == [["calls:find_customer(name='Ada Park')"], [], [], []]
    verdicts = {v.criterion: (v.score, v.cited_steps) for v in rule_verdicts(rollout)}
    # the steps that called list_orders and missed (other id; raised; arguments unknown) are cited
    assert verdicts["Gets data from list_orders(customer_id='C01')"] == (-1, [2, 3, 4])
    assert verdicts["Gets data from find_customer(name='Ada Park')"] == (1, [1])


@pytest.mark.parametrize("declared", ["get_product('P101')", "get_product(product_id=pid)", "get_product(**kw)",
                                      "get_product(product_id=['P101'])", "1 + 1", "get_product(product_id='P101'"])
def test_an_operator_declaration_that_is_not_a_keyword_call_of_plain_values_is_refused(declared):
    task = Task(id="t9", instruction="x", metadata={"operators": {"evidence": [declared]}})
    with pytest.raises(ValueError, match=r"task 't9': metadata\['operators'\]\['evidence'\]: .*neither a callable name"):
        rule_library(task)


def test_no_tool_item_is_read_from_code_text():
    """Code that names tools, with the environment recording that none was called (or
    recording no calls at all): no tool item is hit, the docs and operator items included."""
    task = Task(id="t", instruction="x", metadata={"api_docs": True, "operators": {
        "evidence": ["apis.spotify.search"], "execution": ["apis.supervisor.complete_task"]}})
    code = ("# apis.api_docs.show_api_doc(app_name='spotify')\n"
            "s = 'apis.spotify.search(query=1)'\nprint('apis.supervisor.complete_task()')")
    for calls in ([], None):
        traj = Trajectory(task=task, termination="no_code", steps=[step(1, "t", code, "ok", calls=calls)])
        hits = rule_library(task).transition_items(traj)[0]
        assert hits == {"evidence": [], "execution": [], "invalidity": []}, calls


def test_operator_items_are_hit_by_recorded_calls_with_or_without_the_apis_prefix():
    task = Task(id="t", instruction="x", metadata={"operators": {
        "evidence": ["apis.spotify.search"], "execution": ["apis.supervisor.complete_task"]}})
    library = rule_library(task)
    made = step(1, "t", "...", "", calls=[call("spotify.search"), call("apis.supervisor.complete_task", ok=False)])
    hits = library.transition_items(Trajectory(task=task, steps=[made]))[0]
    # the search returned; complete_task raised, so that subgoal was not reached
    assert hits == {"evidence": ["calls:apis.spotify.search"], "execution": [], "invalidity": ["tool_error"]}


def test_a_call_the_env_marks_as_submitting_is_not_evidence():
    task = Task(id="t", instruction="x")
    hand_in = step(1, "t", "...", "", submitted=True, calls=[call("finish_episode", submits=True)])
    assert transition_items(Trajectory(task=task, steps=[hand_in]))[0]["evidence"] == []
    lookup = step(1, "t", "...", "", calls=[call("finish_episode")])
    assert transition_items(Trajectory(task=task, steps=[lookup]))[0]["evidence"] == ["gets_tool_result"]


def test_a_malformed_tool_call_record_names_the_step():
    fine, bad = step(1, "t", "x()", "", calls=[]), step(2, "t", "x()", "", calls=[{"name": "x"}])
    with pytest.raises(ValueError, match=r"step 2: info\['tool_calls'\] must be a list of \{'name': str, 'ok': bool\}"):
        transition_items(Trajectory(task=TASK, steps=[fine, bad]))


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


def test_an_outcome_fallback_is_the_environments_not_the_judges():
    """An env result without ``success`` is counted as an outcome fallback, alone or inside
    a weighted reward; a judge stage that got no usable answer is a judge fallback."""
    scored = [Trajectory(task=TASK, metrics=m) for m in ({"success": True}, {})]
    alone = OutcomeReward().score_group(TASK, scored)
    assert alone.fallbacks == ["outcome[2]: metric 'success' missing or not a number; reward set to 0"]
    assert count_fallbacks([alone]) == {FallbackKind.JUDGE: 0, FallbackKind.OUTCOME: 1}
    mixed = build_reward("weighted", parts=[{"name": "outcome", "weight": 1.0}, {"name": "rule", "weight": 0.25}])
    in_weighted = mixed.score_group(TASK, [MESSY.model_copy(update={"metrics": {}}), CLEAN])
    assert in_weighted.fallbacks[0].startswith("outcome: outcome[1]: ")
    assert count_fallbacks([in_weighted]) == {FallbackKind.JUDGE: 0, FallbackKind.OUTCOME: 2}
    # a judge that answers prose: every stage falls back, each counted as the judge's
    judged = build_reward("weighted", parts=[
        {"name": "dynamic", "weight": 1.0, "options": {"judge": {"name": "function", "target": lambda m: "no idea"},
                                                       "retries": 0, "max_repairs": 0}},
        {"name": "outcome", "weight": 1.0}]).score_group(TASK, [MESSY, CLEAN])
    kinds = [fallback_kind(f) for f in judged.fallbacks]
    assert kinds.count(FallbackKind.OUTCOME) == 2 and kinds.count(FallbackKind.JUDGE) >= 1
    assert all(f.startswith("dynamic: ") for f, k in zip(judged.fallbacks, kinds) if k is FallbackKind.JUDGE)
    counts = count_fallbacks([alone, judged])
    assert counts == {FallbackKind.JUDGE: kinds.count(FallbackKind.JUDGE), FallbackKind.OUTCOME: 3}


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
