"""Near-miss solutions of every task family of the offline AppWorld suite, each played
through ``draco_gym/AppWorld-v0``: the suite's own tests must fail every one.

Each near-miss is the task's reference solution (its code blocks, ``ground_truth/
reference_solution.json``) changed the way a policy under RL pressure would find cheaper:

    the same effect by a wrong operation   untag instead of delete, request instead of pay,
                                           an existing note or file overwritten instead of a
                                           new one created, delete and re-add instead of update
    one record too many or too few         a note, contact, payment, message or receipt
                                           more or fewer; one made twice
    a change to records never named        the account renamed (the apps' User tables), an
                                           unrelated record written, another record edited
                                           or deleted
    the right answer to a neighbouring task the next variant of the same scenario solved
    completing without acting              ``complete_task()`` at once
    a wrong answer                         off by one, none given (question families)

plus the suite's own wrong solution (``wrong_solution.json``). A near-miss that passes
*survived*: a weakness of that task's tests (fix it in ``envs/appworld/suite_builder.py``).

    python bench/appworld_mutations.py [--families delete-tagged-notes ...] [--sandbox bwrap]

Prints per family near-misses killed / tried and each survivor; last line
``evaluator mutations survived: N of M``. ``bench/evaluator_mutations.py`` runs the same
families (``run(sandbox)``) beside the shop's. AppWorld runs only under ``sandbox="bwrap"``
(guard mode is refused for it), so that is the one mode.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

COMPLETE = "apis.supervisor.complete_task()"
FAST_FAMILIES = ("delete-tagged-notes", "venmo-pay-contact", "notes-tag-count")
"""The default test pass's families: an action on notes, one that moves money, a question."""


@dataclass(frozen=True)
class Case:
    """One task's reference and its near-misses, each a list of code blocks."""

    family: str
    task_id: str
    reference: list[str]
    near_misses: dict[str, list[str]]


def replaced(block: str, old: str, new: str) -> str:
    """``block`` with ``old`` replaced; raises when ``old`` is not in it, so a change of the
    suite's reference solutions breaks the near-miss loudly instead of making it equal the
    reference."""
    if old not in block:
        raise AssertionError(f"near-miss: {old!r} is not in the reference block {block[:200]!r}")
    return block.replace(old, new)


def tokens(blocks: list[str]) -> list[str]:
    """The apps the reference logs into, in order (``<app>_token = apis.<app>.login(...)``)."""
    return re.findall(r"(\w+)_token = apis\.\1\.login", "\n".join(blocks))


COLLATERAL = {
    "simple_note": 'print(apis.simple_note.create_note(access_token=simple_note_token, title="Scratch", content="x"))',
    "phone": 'print(apis.phone.create_alarm(access_token=phone_token, time="07:00", label="gym"))',
    "venmo": ('t = apis.venmo.show_transactions(access_token=venmo_token)[0]\n'
              'print(apis.venmo.like_transaction(access_token=venmo_token, transaction_id=t["transaction_id"]))'),
    "file_system": ('print(apis.file_system.create_file(access_token=file_system_token, '
                    'file_path="~/documents/scratch.txt", content="x"))'),
}
"""Per app, a write to a record no task of the suite names."""


def answer_expression(block: str) -> str | None:
    found = re.fullmatch(r"apis\.supervisor\.complete_task\(answer=(.+)\)", block.strip(), re.S)
    return found.group(1) if found else None


def common(reference: list[str], neighbour: list[str], wrong: list[str]) -> dict[str, list[str]]:
    """The near-misses every family gets."""
    *acted, done = reference
    app = tokens(reference)[0]
    out = {
        "completing without acting": [COMPLETE],
        "the neighbouring task's solution": neighbour,
        "the account renamed as well": [*acted, f'print(apis.{app}.update_account_name(access_token={app}_token, '
                                                f'last_name="Whitfield-Ross"))', done],
        "an unrelated record written as well": [*acted, COLLATERAL[app], done],
    }
    if wrong:
        out["the suite's wrong solution"] = wrong
    expression = answer_expression(done)
    if expression is not None:
        out["no answer given"] = [*acted, COMPLETE]
        if re.match(r"(len|round)\(", expression):  # a number
            out["the answer off by one"] = [*acted, f"apis.supervisor.complete_task(answer=({expression}) + 1)"]
    return out


# -- per family: the same effect by a wrong operation, one record more or fewer ---------------

def delete_tagged_notes(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, search, delete, done = ref
    untag = replaced(delete, "apis.simple_note.delete_note(access_token=simple_note_token, note_id=n[\"note_id\"])",
                     "apis.simple_note.update_note(access_token=simple_note_token, note_id=n[\"note_id\"], tags=[])")
    recreate = delete + ('\n    print(apis.simple_note.create_note(access_token=simple_note_token, title=n["title"], '
                         'content="(moved)"))')
    other = ('other = apis.simple_note.search_notes(access_token=simple_note_token, tags=["health"])[0]\n'
             'print(apis.simple_note.delete_note(access_token=simple_note_token, note_id=other["note_id"]))')
    return {
        "untagged instead of deleted": [login, search, untag, done],
        "deleted and re-created without the tag": [login, search, recreate, done],
        "one note too few": [login, search, replaced(delete, "for n in notes:", "for n in notes[:-1]:"), done],
        "one note too many": [login, search, delete, other, done],
        "a wrong note deleted instead of a tagged one": [
            login, search, replaced(delete, "for n in notes:", "for n in notes[:-1]:"), other, done],
    }


def note_of_contacts(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, contacts, write, done = ref
    overwrite = ('found = apis.simple_note.search_notes(access_token=simple_note_token, query="Groceries")\n'
                 'note_id = [n for n in found if n["title"] == "Groceries"][0]["note_id"]\n'
                 + replaced(write, f'apis.simple_note.create_note(access_token=simple_note_token, title="{p["title"]}", '
                                   'content=content)',
                            f'apis.simple_note.update_note(access_token=simple_note_token, note_id=note_id, '
                            f'title="{p["title"]}", content=content)'))
    return {
        "an existing note overwritten instead of one created": [login, contacts, overwrite, done],
        "one contact too few": [login, contacts, replaced(write, "for c in contacts)", "for c in contacts[:-1])"), done],
        "one contact listed twice": [login, contacts, replaced(write, "for c in contacts)", "for c in contacts + contacts[:1])"),
                                     done],
        "one name too many": [login, contacts, replaced(write, "for c in contacts)", 'for c in contacts) + "\\nAda Lovelace"'),
                              done],
        "a second note too": [login, contacts, write, replaced(write, f'title="{p["title"]}"', f'title="{p["title"]} (2)"'),
                              done],
    }


def venmo_pay_contact(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, contacts, pay, done = ref
    amount = f"amount={p['amount']}"
    return {
        "a request instead of a payment": [login, contacts, replaced(
            pay, "apis.venmo.create_transaction(access_token=venmo_token, receiver_email=",
            "apis.venmo.create_payment_request(access_token=venmo_token, user_email="), done],
        "paid twice": [login, contacts, pay, pay.split("\n", 1)[1], done],
        "one dollar more": [login, contacts, replaced(pay, amount, f"amount={round(p['amount'] + 1, 2)}"), done],
        "paid, and an earlier payment's note edited": [login, contacts, pay, (
            'old = apis.venmo.show_transactions(access_token=venmo_token, direction="sent")[-1]\n'
            'print(apis.venmo.update_transaction(access_token=venmo_token, transaction_id=old["transaction_id"], '
            'description="settled"))'), done],
    }


def venmo_request_group(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, contacts, ask, done = ref
    amount = f"amount={p['amount']}"
    return {
        "payments instead of requests": [login, contacts, replaced(
            ask, "apis.venmo.create_payment_request(access_token=venmo_token, user_email=",
            "apis.venmo.create_transaction(access_token=venmo_token, receiver_email="), done],
        "one contact too few": [login, contacts, replaced(ask, "for c in contacts:", "for c in contacts[:-1]:"), done],
        "one contact asked twice": [login, contacts, replaced(ask, "for c in contacts:", "for c in contacts + contacts[:1]:"),
                                    done],
        "one contact too many": [login, contacts, ask, replaced(
            ask, "for c in contacts:",
            'for c in apis.phone.search_contacts(access_token=phone_token, relationship="roommate")[:1]:'), done],
        "one dollar more": [login, contacts, replaced(ask, amount, f"amount={round(p['amount'] + 1, 2)}"), done],
    }


def update_contact_phone(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, update, done = ref
    number = f'phone_number="{p["phone_number"]}"'
    call = update.rsplit("\n", 1)[1]
    readd = replaced(update, call, 'print(apis.phone.delete_contact(access_token=phone_token, contact_id=match["contact_id"]))\n'
                     'print(apis.phone.add_contact(access_token=phone_token, first_name=match["first_name"], '
                     'last_name=match["last_name"], email=match["email"], relationships=match["relationships"], '
                     f'{number}))')
    other = ('other = [c for c in apis.phone.search_contacts(access_token=phone_token, relationship="roommate")]\n'
             f'print(apis.phone.update_contact(access_token=phone_token, contact_id=other[0]["contact_id"], {number}))')
    return {
        "deleted and re-added instead of updated": [login, readd, done],
        "another field changed too": [login, replaced(update, number, number + ', birthday="2000-01-01"'), done],
        "another contact updated too": [login, update, other, done],
        "one digit wrong": [login, replaced(update, number, f'phone_number="{p["phone_number"][:-1]}0"'
                                            if not p["phone_number"].endswith("0") else
                                            f'phone_number="{p["phone_number"][:-1]}1"'), done],
    }


def note_to_file(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, read, write, done = ref
    path = "~/" + p["path"].split("/", 3)[3]
    overwrite = (f'print(apis.file_system.move_file(access_token=file_system_token, source_file_path="~/documents/lease.txt", '
                 f'destination_file_path="{path}"))\n'
                 f'print(apis.file_system.update_file(access_token=file_system_token, file_path="{path}", content=content))')
    return {
        "an existing file moved and overwritten instead of one created": [login, read, overwrite, done],
        "an extra file too": [login, read, write, replaced(write, f'file_path="{path}"', 'file_path="~/documents/copy.txt"'),
                              done],
        "the first line only": [login, read, replaced(write, "content=content", 'content=content.splitlines()[0]'), done],
        "another file deleted too": [login, read, write, 'print(apis.file_system.delete_file(access_token=file_system_token, '
                                     'file_path="~/documents/lease.txt"))', done],
    }


def text_relationship(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, contacts, send, done = ref
    return {
        "one contact too few": [login, contacts, replaced(send, "for c in contacts:", "for c in contacts[:-1]:"), done],
        "one contact texted twice": [login, contacts, replaced(send, "for c in contacts:", "for c in contacts + contacts[:1]:"),
                                     done],
        "one contact too many": [login, contacts, send, replaced(
            send, "for c in contacts:",
            'for c in apis.phone.search_contacts(access_token=phone_token, relationship="roommate")[:1]:'), done],
        "a different message": [login, contacts, replaced(send, f'message="{p["message"]}"', 'message="See you soon."'), done],
    }


def file_receipts_by_month(ref: list[str], p: dict) -> dict[str, list[str]]:
    login, mkdir, move, done = ref
    month = re.search(r'startswith\("(2023-\d\d)"\)', move).group(1)
    other = "2023-03" if month != "2023-03" else "2023-01"
    folder = p["target"].replace(p["source"], "~/receipts/")
    mine = f'path.split("/")[-1].startswith("{month}")'
    last = f'[q for q in paths if q.split("/")[-1].startswith("{month}")][-1]'
    receipts = ('paths = apis.file_system.show_directory(access_token=file_system_token, directory_path="~/receipts/", '
                'entry_type="files", recursive=False)\n')
    return {
        "one receipt left behind": [login, mkdir, replaced(move, mine, f"{mine} and path != {last}"), done],
        "a receipt of another month moved too": [login, mkdir, move, receipts + (
            f'other = [q for q in paths if q.split("/")[-1].startswith("{other}")][0]\n'
            'print(apis.file_system.move_file(access_token=file_system_token, source_file_path=other, '
            f'destination_file_path="{folder}" + other.split("/")[-1]))'), done],
        "another file deleted too": [login, mkdir, move, 'print(apis.file_system.delete_file(access_token=file_system_token, '
                                     'file_path="~/documents/lease.txt"))', done],
        "a moved receipt's content changed": [login, mkdir, move, (
            'moved = apis.file_system.show_directory(access_token=file_system_token, '
            f'directory_path="{folder}", entry_type="files")[0]\n'
            'print(apis.file_system.update_file(access_token=file_system_token, file_path=moved, content="Total: $0.00"))'),
            done],
    }


FAMILIES: dict[str, Callable[[list[str], dict], dict[str, list[str]]]] = {
    "delete-tagged-notes": delete_tagged_notes,
    "note-of-contacts": note_of_contacts,
    "venmo-pay-contact": venmo_pay_contact,
    "venmo-request-group": venmo_request_group,
    "update-contact-phone": update_contact_phone,
    "note-to-file": note_to_file,
    "text-relationship": text_relationship,
    "file-receipts-by-month": file_receipts_by_month,
}
"""The action families' own near-misses; the question families get the common ones."""


def task_ids(source) -> list[str]:
    """Every task of the suite, split by split."""
    return [t for split in source.splits for t in source.task_ids(split)]


def cases(source, families: list[str] | None = None) -> Iterator[Case]:
    """Every task of the suite (or of ``families``) with its near-misses."""
    ids = task_ids(source)
    by_family: dict[str, list[str]] = defaultdict(list)
    for task_id in ids:
        by_family[task_id.rsplit("_", 1)[0]].append(task_id)
    for family, tasks in sorted(by_family.items()):
        if families and family not in families:
            continue
        for n, task_id in enumerate(tasks):
            truth = source.ground_truth(task_id)
            neighbour = source.ground_truth(tasks[(n + 1) % len(tasks)]).reference_blocks
            params = source.ground_truth_file(task_id, "private_data.json")
            misses = common(truth.reference_blocks, neighbour, truth.wrong_blocks)
            if family in FAMILIES:
                misses.update(FAMILIES[family](list(truth.reference_blocks), params))
            yield Case(family, task_id, list(truth.reference_blocks), misses)


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def messages(blocks: list[str]) -> list[str]:
    """The assistant messages that run ``blocks``, then one without code (which ends the
    episode: ``end_rule="no_code"``)."""
    return [*map(fence, blocks), "Done."]


def play(env, task_id: str, blocks: list[str]) -> dict:
    """The metrics of an episode of ``task_id`` that runs ``blocks``, then ends."""
    from draco_gym.envs import play_messages

    return play_messages(env, task_id, messages(blocks)).metrics


def make_env(source, sandbox: str = "bwrap"):
    import gymnasium as gym

    import draco_gym  # noqa: F401 - registers the ids

    return gym.make("draco_gym/AppWorld-v0", data_root=str(source.data_dir), sandbox=sandbox, end_rule="no_code",
                    max_turns=12, step_timeout_s=20, show_progress=False)


def offline_source():
    from draco_gym.envs.appworld import AppWorldRuntime, ensure_offline_suite

    return ensure_offline_suite(AppWorldRuntime())


def run(sandbox: str = "bwrap", families: list[str] | None = None, source=None,
        on_row: Callable[[dict], None] = lambda row: None) -> list[dict]:
    """Every near-miss of every task played: rows ``{family, task_id, mutation, survived,
    detail}``. A task whose reference fails gives one row with mutation ``"(reference)"``
    and ``survived`` None, and no near-miss of it is tried."""
    source = source or offline_source()
    env = make_env(source, sandbox)
    rows = []
    try:
        for case in cases(source, families):
            metrics = play(env, case.task_id, case.reference)
            if not metrics.get("success"):
                row = dict(family=case.family, task_id=case.task_id, mutation="(reference)", survived=None,
                           detail=f"the reference fails: {metrics.get('failed_requirements')}")
                rows.append(row)
                on_row(row)
                continue
            for name, blocks in case.near_misses.items():
                metrics = play(env, case.task_id, blocks)
                row = dict(family=case.family, task_id=case.task_id, mutation=name, survived=bool(metrics.get("success")),
                           detail=f"{metrics.get('tests_passed')}/{metrics.get('tests_total')}")
                rows.append(row)
                on_row(row)
    finally:
        env.close()
    return rows


def noop_passing_tasks(source=None, sandbox: str = "bwrap") -> list[str]:
    """The tasks of the suite an immediate stop (a message without code) passes."""
    source = source or offline_source()
    env = make_env(source, sandbox)
    try:
        return [t for t in task_ids(source) if play(env, t, []).get("success")]
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=sorted({*FAMILIES, "notes-tag-count", "note-list-item",
                                                                  "contacts-relationship-count", "contact-phone-lookup",
                                                                  "venmo-received-from", "venmo-sent-in-month",
                                                                  "photo-count", "receipts-month-total"}))
    parser.add_argument("--sandbox", choices=("bwrap",), default="bwrap")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def show(row: dict) -> None:
        if row["survived"] is None:
            print(f"REFERENCE FAILS  {row['task_id']}: {row['detail']}", flush=True)
        elif row["survived"]:
            print(f"SURVIVED  {row['task_id']}: {row['mutation']} ({row['detail']})", flush=True)

    rows = run(args.sandbox, args.families, on_row=show)
    print(summary(rows), flush=True)
    print(f"   ({time.perf_counter() - started:.0f} s)", flush=True)
    tried = [r for r in rows if r["survived"] is not None]
    survived = sum(r["survived"] for r in tried)
    print(f"evaluator mutations survived: {survived} of {len(tried)}", flush=True)
    return 1 if survived or len(tried) < len(rows) else 0


def summary(rows: list[dict]) -> str:
    """Per family: near-misses killed / tried."""
    lines = []
    by_family: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_family[row["family"]].append(row)
    for family, group in by_family.items():
        tried = [r for r in group if r["survived"] is not None]
        broken = len(group) - len(tried)
        lines.append(f"appworld  {family:28s} killed {sum(not r['survived'] for r in tried):4d} of {len(tried):4d}"
                     + (f"  ({broken} reference(s) FAIL)" if broken else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
