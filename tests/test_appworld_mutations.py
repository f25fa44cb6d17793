"""The offline AppWorld suite's own tests fail near-miss solutions (issue 36 item 1).

Each near-miss of ``bench/appworld_mutations.py`` (untag instead of delete, a request instead
of a payment, one record more or fewer, a record the task never named changed, the
neighbouring task's solution, completing without acting, a wrong answer) is played through
``gym.make("draco_gym/AppWorld-v0")`` and must fail; the reference must pass. The default
pass plays one task of a few families; the slow one every task of every family, and the
no-op audit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import draco_gym  # noqa: F401 - registers the ids
from sandbox_marks import needs_bwrap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import appworld_mutations as am  # noqa: E402

pytestmark = needs_bwrap  # AppWorld runs only under bubblewrap


@pytest.fixture(scope="module")
def source():
    return am.offline_source()


@pytest.fixture(scope="module")
def env(source):
    environment = am.make_env(source)
    yield environment
    environment.close()


def case_of(source, task_id: str) -> am.Case:
    return next(c for c in am.cases(source, [task_id.rsplit("_", 1)[0]]) if c.task_id == task_id)


def test_untag_instead_of_delete_fails_delete_tagged_notes(env, source):
    """The issue's exploit: removing the tag from each note instead of deleting the notes,
    then ``complete_task()``, passed 3/3 ("no note with the tag is left", "nothing but Simple
    Note notes was changed"). The notes were updated, not deleted: the test that the tagged
    notes were removed fails, and so does the one that no note was edited."""
    case = case_of(source, "delete-tagged-notes_1")
    assert am.play(env, case.task_id, case.reference)["success"] is True
    metrics = am.play(env, case.task_id, case.near_misses["untagged instead of deleted"])
    assert metrics["success"] is False, metrics
    failed = " | ".join(str(f) for f in metrics["failed_requirements"])
    assert "every note with the tag was deleted" in failed and "no note was added or edited" in failed, failed


@pytest.mark.parametrize("task_id", ["delete-tagged-notes_1", "venmo-pay-contact_1", "notes-tag-count_1"])
def test_every_near_miss_of_a_task_fails(task_id, env, source):
    """One task of an action on notes, of one that moves money, and of a question: the
    reference passes, every near-miss fails."""
    case = case_of(source, task_id)
    assert am.play(env, task_id, case.reference)["success"] is True
    survived = {name: m for name, blocks in case.near_misses.items()
                if (m := am.play(env, task_id, blocks))["success"] is not False}
    assert len(case.near_misses) >= 7 and not survived, survived


@pytest.mark.slow
def test_no_near_miss_of_any_family_survives(source):
    rows = am.run("bwrap", source=source)
    broken = [r for r in rows if r["survived"] is None]
    survived = [(r["task_id"], r["mutation"], r["detail"]) for r in rows if r["survived"]]
    assert not broken, broken
    assert len({r["family"] for r in rows}) == 16 and len(rows) >= 300
    assert not survived, survived


@pytest.mark.slow
def test_no_task_is_passed_by_an_immediate_stop(source):
    assert am.noop_passing_tasks(source) == []
