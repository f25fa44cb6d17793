"""Builds the offline AppWorld task suite. Runs INSIDE the isolated runtime (imports appworld).

Started by ``suite.py`` as ``<runtime python> suite_builder.py --out DIR --seed N``. It writes
an AppWorld data folder (``DIR/data``) with the engine's own code, exactly the layout that
``appworld download data`` produces, so the environment server cannot tell the two apart:

    api_docs/standard/<app>.json      the API docs, built from the installed apps
    base_dbs/                         one seeded world shared by every task
    tasks/<scenario>_<n>/             per task: specs.json, dbs/ (the supervisor, as changes
                                      over the base world) and ground_truth/ (answer,
                                      evaluation.py, test_data.json, metadata.json, plus our
                                      reference_solution.json and wrong_solution.json)
    datasets/{train,dev,test}.txt     splits, whole scenarios per split

The world (one user, 36 contacts with relationships, 36 notes, ~70 Venmo transactions over
five months, a home folder of receipts and photos) is drawn from ``random.Random(seed)``, so
the same seed writes the same suite. Each scenario is a task template with three variants
(different people, tags, months...), the way AppWorld groups tasks, which is what gives SGC
its meaning. Every scenario has a reference solution (code blocks that pass every test) and a
plausible wrong one (typically: no pagination) with the requirement it is meant to fail.

Each task's tests compare the start and end databases record by record, AppWorld's own way
(``changed_records``, ``changed_field_names``; ``EVALUATION_TEMPLATE``'s helpers): only the
records the task names may change, and only as it asks, so a near-miss (untag instead of
delete, one record too many, a record the task never named edited) fails.
``bench/appworld_mutations.py`` plays those near-misses against every family.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from textwrap import dedent

TASK_DATETIME = "2023-05-18T12:00:00"
MONTHS = ["January", "February", "March", "April", "May"]
SUPERVISOR = dict(
    first_name="Mara", last_name="Whitfield", email="mara.whitfield@gmail.com",
    phone_number="3125550147", birthday="1991-03-14", sex="female",
)
APPS = ["simple_note", "phone", "venmo", "file_system"]
FIRST_NAMES = [
    "Jonah", "Priya", "Elena", "Marcus", "Aiko", "Tobias", "Sofia", "Kwame", "Lena", "Diego",
    "Hannah", "Ravi", "Chloe", "Mateo", "Ingrid", "Samuel", "Yara", "Felix", "Nadia", "Omar",
    "Greta", "Luca", "Amara", "Henrik", "Zoe", "Kenji", "Maya", "Victor", "Leila", "Caleb",
    "Rosa", "Idris", "Wren", "Anton",
]
LAST_NAMES = [
    "Abernathy", "Brennan", "Castillo", "Draper", "Eklund", "Fontaine", "Garrido", "Haddad",
    "Iverson", "Jansen", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Osei", "Pereira",
    "Quinlan", "Rasmussen", "Sato", "Thorne", "Umeh", "Valdez", "Whitaker", "Xu", "Yilmaz",
    "Zamora", "Bishop", "Carver", "Dalton", "Ellison", "Foster", "Gallagher", "Holm", "Ivers",
]
# Relationship -> how many contacts hold it. Most exceed the default page size (5), and all
# of them together exceed the maximum (20): listing needs pagination.
RELATIONSHIP_COUNTS = {"friend": 11, "coworker": 9, "family": 7, "neighbor": 4, "roommate": 3}
# Two pairs of contacts share a first name, with different relationships, so "my coworker
# Jonah" needs the relationship and not just the first search hit.
SHARED_FIRST_NAMES = {"Jonah": ("friend", "coworker"), "Priya": ("family", "friend"), "Elena": ("coworker", "neighbor")}
NOTE_TAG_COUNTS = {"recipe": 8, "travel": 7, "work": 9, "books": 6, "health": 3, "finance": 3}
LIST_NOTES = {
    "Books to read": ["The Left Hand of Darkness", "Middlemarch", "Piranesi", "The Overstory", "Stoner", "Kindred"],
    "Groceries": ["oat milk", "sourdough", "eggs", "spinach", "lemons", "coffee beans", "feta"],
    "Movies to watch": ["Past Lives", "Aftersun", "Paterson", "Columbus", "Petite Maman"],
    "Weekend chores": ["clean gutters", "return library books", "repot the fern", "fix bike light"],
    "Gift ideas": ["fountain pen", "pottery class", "bird feeder", "board game", "tea sampler"],
}
RECIPES = ["Lentil soup", "Shakshuka", "Miso salmon", "Banana bread", "Pad see ew", "Ratatouille",
           "Chana masala", "Focaccia", "Gazpacho"]
PLACES = ["Lisbon", "Kyoto", "Oaxaca", "Tromso", "Marrakesh", "Hanoi", "Vancouver", "Edinburgh", "Cusco"]
WORK = ["Q2 planning", "Vendor review", "Hiring loop notes", "Offsite agenda", "Budget draft",
        "Onboarding checklist", "Retro actions", "Roadmap ideas", "1:1 topics", "Launch checklist"]
VENMO_DESCRIPTIONS = ["dinner", "concert tickets", "groceries", "rent share", "taxi", "coffee",
                      "birthday gift", "utilities", "brunch", "movie night", "gas", "book club"]
STORES = ["Green Grocer", "Corner Pharmacy", "Hardware Hub", "City Books", "Bean There Cafe", "FreshMart"]


# ----------------------------------------------------------------------------------------
# The world, as plain data (drawn once from the seed)


@dataclass
class Person:
    first_name: str
    last_name: str
    email: str
    phone_number: str
    birthday: str
    relationships: list[str]

    @property
    def full_name(self) -> str:
        return f"{self.first_name} {self.last_name}"


@dataclass
class World:
    people: list[Person]
    notes: list[dict]  # title, content, tags, created_at
    transactions: list[dict]  # person index, direction, amount, description, created_at
    files: dict[str, str]  # path under the home folder -> content
    directories: list[str]
    passwords: dict[str, str]

    @property
    def home(self) -> str:
        return f"/home/{SUPERVISOR['first_name'].lower()}/"

    def with_relationship(self, relationship: str) -> list[Person]:
        return [p for p in self.people if relationship in p.relationships]


def draw_world(rng: random.Random) -> World:
    relationships = [r for r, n in RELATIONSHIP_COUNTS.items() for _ in range(n)]
    rng.shuffle(relationships)
    firsts = [f for f in FIRST_NAMES if f not in SHARED_FIRST_NAMES]
    rng.shuffle(firsts)
    lasts = list(LAST_NAMES)
    rng.shuffle(lasts)
    people: list[Person] = []
    used_phones: set[str] = {SUPERVISOR["phone_number"]}

    def make(first: str, relation: str) -> Person:
        last = lasts.pop()
        phone = ""
        while not phone or phone in used_phones:
            phone = f"{rng.choice(['312', '773', '646', '415'])}555{rng.randrange(1000, 9999)}"
        used_phones.add(phone)
        birthday = f"{rng.randrange(1960, 2001)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        email = f"{first.lower()}.{last.lower()}@{rng.choice(['gmail.com', 'outlook.com', 'proton.me'])}"
        return Person(first, last, email, phone, birthday, [relation])

    for first, pair in SHARED_FIRST_NAMES.items():
        for relation in pair:
            relationships.remove(relation)
            people.append(make(first, relation))
    for relation in relationships:
        people.append(make(firsts.pop(), relation))
    # a few people hold a second, weaker tie (a coworker who is also a friend ...), which the
    # relationship filter must still find: counts per relationship include them
    rng.shuffle(people)
    for person in people[:2]:
        extra = "neighbor" if "neighbor" not in person.relationships else "friend"
        person.relationships.append(extra)

    notes = []
    for title, items in LIST_NOTES.items():
        notes.append(dict(title=title, content="\n".join(items), tags=["lists"]))
    pools = {"recipe": RECIPES, "travel": [f"Trip to {p}" for p in PLACES], "work": WORK,
             "books": [f"Reading notes: {b}" for b in LIST_NOTES["Books to read"]],
             "health": ["Physio exercises", "Sleep log", "Vaccination record"],
             "finance": ["Tax documents", "Savings plan", "Insurance renewal"]}
    for tag, count in NOTE_TAG_COUNTS.items():
        for title in pools[tag][:count]:
            notes.append(dict(title=title, content=f"{title}\n" + _filler(rng), tags=[tag]))
    rng.shuffle(notes)
    for note in notes:
        note["created_at"] = _date(rng, "2022-06-01", "2023-05-10")

    transactions = []
    for _ in range(72):
        index = rng.randrange(len(people))
        transactions.append(dict(
            person=index, direction=rng.choice(["sent", "received"]),
            amount=round(rng.uniform(5, 120), 2), description=rng.choice(VENMO_DESCRIPTIONS),
            created_at=_date(rng, "2023-01-02", "2023-05-17"),
        ))
    # guarantee enough history with the people the Venmo tasks ask about (pagination)
    for index in range(3):
        for k in range(8):
            transactions.append(dict(
                person=index, direction="received" if k % 2 == 0 else "sent",
                amount=round(rng.uniform(5, 60), 2), description=rng.choice(VENMO_DESCRIPTIONS),
                created_at=_date(rng, "2023-01-02", "2023-05-17"),
            ))
    transactions.sort(key=lambda t: t["created_at"])

    files, directories = {}, ["documents/", "receipts/", "photos/"]
    for k in range(24):
        day = _date(rng, "2023-01-02", "2023-05-17")[:10]
        store = rng.choice(STORES)
        total = round(rng.uniform(4, 90), 2)
        files[f"receipts/{day}_{store.lower().replace(' ', '_')}_{k}.txt"] = (
            f"Store: {store}\nDate: {day}\nItems: {rng.randrange(1, 9)}\nTotal: ${total:.2f}\n"
        )
    for year, n_photos, albums in [(2021, 7, ["hiking"]), (2022, 11, ["wedding", "lisbon"]), (2023, 9, ["spring"])]:
        directories.append(f"photos/{year}/")
        for album in albums:
            directories.append(f"photos/{year}/{album}/")
        for k in range(n_photos):
            where = f"{rng.choice(albums)}/" if k % 3 == 0 else ""
            files[f"photos/{year}/{where}IMG_{year}{k:03d}.jpg"] = f"<jpeg bytes {year}-{k}>"
    files["documents/lease.txt"] = "Lease agreement, unit 4B, renews 2023-09-01.\n"
    passwords = {app: f"{app[:4]}-{rng.randrange(10**5, 10**6)}-{rng.choice('xyzqk')}" for app in APPS}
    return World(people, notes, transactions, files, directories, passwords)


def _date(rng: random.Random, start: str, end: str) -> str:
    from datetime import datetime, timedelta

    a, b = datetime.fromisoformat(start), datetime.fromisoformat(end)
    moment = a + timedelta(seconds=rng.randrange(int((b - a).total_seconds())))
    return moment.replace(microsecond=0).isoformat()


def _filler(rng: random.Random) -> str:
    words = ["remember", "check", "call", "bring", "compare", "book", "confirm", "pack", "ask"]
    return "\n".join(f"- {rng.choice(words)} {rng.choice(words)}" for _ in range(rng.randrange(2, 5)))


# ----------------------------------------------------------------------------------------
# Tasks


@dataclass
class Variant:
    """One task: what the supervisor asks, how it is judged, and how to solve it."""

    instruction: str
    answer: object  # None for state-changing tasks
    params: dict  # what evaluation.py reads from private_data
    solution: list[str]  # reference code blocks
    wrong: list[str]  # a plausible wrong solution
    wrong_fails: str  # the requirement the wrong solution must fail


@dataclass
class Scenario:
    name: str
    kind: str  # "question" or "action"
    difficulty: int
    apps: list[str]
    requirements: list[str]
    evaluation: str  # body of evaluate(); `p` holds the task's params
    variants: list[Variant] = field(default_factory=list)


LOGIN = dedent("""
    passwords = {a["account_name"]: a["password"] for a in apis.supervisor.show_account_passwords()}
    profile = apis.supervisor.show_profile()
""").strip()


def login(app: str) -> str:
    username = 'profile["phone_number"]' if app == "phone" else 'profile["email"]'
    return f'{app}_token = apis.{app}.login(username={username}, password=passwords["{app}"])["access_token"]'


def paged(var: str, call: str, limit: int = 20) -> str:
    """Code that collects every page of ``call`` (an API call missing page arguments)."""
    head, _, tail = call.rpartition(")")
    return dedent(f"""
        {var}, page = [], 0
        while True:
            batch = {head}, page_index=page, page_limit={limit}){tail}
            if not batch:
                break
            {var} += batch
            page += 1
    """).strip()


def first_page(var: str, call: str) -> str:
    return f"{var} = {call}"


def contacts_code(relationship: str, pages: bool = True) -> str:
    call = f'apis.phone.search_contacts(access_token=phone_token, relationship="{relationship}")'
    return paged("contacts", call) if pages else first_page("contacts", call)


QUESTION_EVAL = dedent("""
    with test("the answer given matches the correct answer"):
        test.answer(predicted_answer, ground_truth_answer)
    with test("no data in any app was changed"):
        test.case(changed_models(models), "is_falsy")
""")
QUESTION_REQS = ["the answer given matches the correct answer", "no data in any app was changed"]


# The scenarios, in build order (the order also fixes the draws from the shared rng, so the
# same seed writes the same suite). Each takes the world and the rng and returns its
# Scenario with three variants.
SCENARIOS: list[Callable[[World, random.Random], Scenario]] = []


def scenario(make: Callable[[World, random.Random], Scenario]) -> Callable[[World, random.Random], Scenario]:
    SCENARIOS.append(make)
    return make


ORDINALS = ["first", "second", "third", "fourth", "fifth"]


def question(name: str, difficulty: int, apps: list[str], variants: list[Variant]) -> Scenario:
    return Scenario(name, "question", difficulty, apps, QUESTION_REQS, QUESTION_EVAL, variants)


def complete(answer_expr: str | None = None) -> str:
    return f"apis.supervisor.complete_task(answer={answer_expr})" if answer_expr else "apis.supervisor.complete_task()"


def build_scenarios(world: World, rng: random.Random) -> list[Scenario]:
    return [make(world, rng) for make in SCENARIOS]


# -- questions ------------------------------------------------------------------------------


@scenario
def notes_tag_count(world: World, rng: random.Random) -> Scenario:
    variants = []
    for tag in ["work", "recipe", "travel"]:
        n = sum(tag in note["tags"] for note in world.notes)
        search = f'apis.simple_note.search_notes(access_token=simple_note_token, tags=["{tag}"])'
        variants.append(Variant(
            f"How many notes in my Simple Note account are tagged '{tag}'?", n, {},
            [LOGIN + "\n" + login("simple_note"), paged("notes", search) + "\nprint(len(notes))", complete("len(notes)")],
            [LOGIN + "\n" + login("simple_note"), first_page("notes", search), complete("len(notes)")],
            QUESTION_REQS[0],
        ))
    return question("notes-tag-count", 1, ["simple_note"], variants)


@scenario
def note_list_item(world: World, rng: random.Random) -> Scenario:
    variants = []
    for title, k in [("Books to read", 3), ("Groceries", 5), ("Movies to watch", 2)]:
        item = LIST_NOTES[title][k - 1]
        find = dedent(f"""
            found = apis.simple_note.search_notes(access_token=simple_note_token, query="{title}", page_limit=20)
            note_id = [n for n in found if n["title"] == "{title}"][0]["note_id"]
            lines = apis.simple_note.show_note(access_token=simple_note_token, note_id=note_id)["content"].splitlines()
            print(lines)
        """).strip()
        variants.append(Variant(
            f"What is the {ORDINALS[k - 1]} item on my '{title}' list in Simple Note?", item, {},
            [LOGIN + "\n" + login("simple_note"), find, complete(f"lines[{k - 1}]")],
            [LOGIN + "\n" + login("simple_note"), find, complete(f"lines[{k}]")],
            QUESTION_REQS[0],
        ))
    return question("note-list-item", 1, ["simple_note"], variants)


@scenario
def contacts_relationship_count(world: World, rng: random.Random) -> Scenario:
    variants = []
    for relationship in ["friend", "coworker", "family"]:
        n = len(world.with_relationship(relationship))
        variants.append(Variant(
            f"How many people in my phone contacts are listed as my {relationship}?", n, {},
            [LOGIN + "\n" + login("phone"), contacts_code(relationship), complete("len(contacts)")],
            [LOGIN + "\n" + login("phone"), contacts_code(relationship, pages=False), complete("len(contacts)")],
            QUESTION_REQS[0],
        ))
    return question("contacts-relationship-count", 1, ["phone"], variants)


@scenario
def contact_phone_lookup(world: World, rng: random.Random) -> Scenario:
    people = world.people
    variants = []
    for first, (relationship, _) in SHARED_FIRST_NAMES.items():
        person = next(p for p in people if p.first_name == first and relationship in p.relationships)
        pick = f'match = [c for c in contacts if c["first_name"] == "{first}"][0]\nprint(match)'
        # the wrong one finds the namesake: same first name, not the asked-for relationship
        confuse = f'match = [c for c in contacts if c["first_name"] == "{first}" and "{relationship}" not in c["relationships"]][0]\nprint(match)'
        variants.append(Variant(
            f"What is the phone number of my {relationship} {first}?", person.phone_number, {},
            [LOGIN + "\n" + login("phone"), contacts_code(relationship) + "\n" + pick, complete('match["phone_number"]')],
            [LOGIN + "\n" + login("phone"),
             paged("contacts", f'apis.phone.search_contacts(access_token=phone_token, query="{first}")') + "\n" + confuse,
             complete('match["phone_number"]')],
            QUESTION_REQS[0],
        ))
    return question("contact-phone-lookup", 2, ["phone"], variants)


@scenario
def venmo_received_from(world: World, rng: random.Random) -> Scenario:
    people = world.people
    variants = []
    for person in people[:3]:
        received = round(sum(t["amount"] for t in world.transactions
                             if people[t["person"]] is person and t["direction"] == "received"), 2)
        base = f'apis.venmo.show_transactions(access_token=venmo_token, user_email="{person.email}"'
        variants.append(Variant(
            f"How much money in total have I received on Venmo from {person.full_name}?", received, {},
            [LOGIN + "\n" + login("venmo"), paged("transactions", base + ', direction="received")'),
             complete('round(sum(t["amount"] for t in transactions), 2)')],
            [LOGIN + "\n" + login("venmo"), paged("transactions", base + ")"),
             complete('round(sum(t["amount"] for t in transactions), 2)')],
            QUESTION_REQS[0],
        ))
    return question("venmo-received-from", 2, ["venmo"], variants)


@scenario
def venmo_sent_in_month(world: World, rng: random.Random) -> Scenario:
    variants = []
    for month in [2, 3, 4]:
        sent = round(sum(t["amount"] for t in world.transactions
                         if t["direction"] == "sent" and t["created_at"].startswith(f"2023-{month:02d}")), 2)
        call = (f'apis.venmo.show_transactions(access_token=venmo_token, direction="sent", '
                f'min_created_at="2023-{month:02d}-01", max_created_at="2023-{month + 1:02d}-01")')
        keep = f'sent = [t for t in transactions if t["created_at"].startswith("2023-{month:02d}")]\nprint(len(sent))'
        variants.append(Variant(
            f"How much money did I send on Venmo in {MONTHS[month - 1]} 2023, in total?", sent, {},
            [LOGIN + "\n" + login("venmo"), paged("transactions", call) + "\n" + keep,
             complete('round(sum(t["amount"] for t in sent), 2)')],
            [LOGIN + "\n" + login("venmo"), first_page("transactions", call) + "\n" + keep,
             complete('round(sum(t["amount"] for t in sent), 2)')],
            QUESTION_REQS[0],
        ))
    return question("venmo-sent-in-month", 2, ["venmo"], variants)


@scenario
def photo_count(world: World, rng: random.Random) -> Scenario:
    variants = []
    for year in [2021, 2022, 2023]:
        n = sum(path.startswith(f"photos/{year}/") for path in world.files)
        listing = f'apis.file_system.show_directory(access_token=file_system_token, directory_path="~/photos/{year}/", entry_type="{{}}", recursive=True)'
        variants.append(Variant(
            f"How many photo files do I have in the ~/photos/{year}/ folder of my file system, sub-folders included?", n, {},
            [LOGIN + "\n" + login("file_system"), "entries = " + listing.format("files") + "\nprint(entries)", complete("len(entries)")],
            [LOGIN + "\n" + login("file_system"), "entries = " + listing.format("all") + "\nprint(entries)", complete("len(entries)")],
            QUESTION_REQS[0],
        ))
    return question("photo-count", 1, ["file_system"], variants)


@scenario
def receipts_month_total(world: World, rng: random.Random) -> Scenario:
    variants = []
    for month in [1, 3, 5]:
        total = round(sum(float(c.split("Total: $")[1]) for path, c in world.files.items()
                          if path.startswith(f"receipts/2023-{month:02d}")), 2)
        read = dedent(f"""
            paths = apis.file_system.show_directory(access_token=file_system_token, directory_path="~/receipts/", entry_type="files")
            total = 0.0
            for path in paths:
                content = apis.file_system.show_file(access_token=file_system_token, file_path=path)["content"]
                if "Date: 2023-{month:02d}" in content:
                    total += float(content.split("Total: $")[1].split()[0])
            print(round(total, 2))
        """).strip()
        variants.append(Variant(
            f"What do my receipts in ~/receipts/ from {MONTHS[month - 1]} 2023 add up to?", total, {},
            [LOGIN + "\n" + login("file_system"), read, complete("round(total, 2)")],
            [LOGIN + "\n" + login("file_system"), read.replace(f'if "Date: 2023-{month:02d}" in content:', "if True:"),
             complete("round(total, 2)")],
            QUESTION_REQS[0],
        ))
    return question("receipts-month-total", 2, ["file_system"], variants)


# -- state-changing tasks -------------------------------------------------------------------


@scenario
def note_of_contacts(world: World, rng: random.Random) -> Scenario:
    reqs = ["exactly one note was created, with the requested title",
            "the note lists exactly the requested contacts, one per line",
            "no other note and nothing in any other app was changed"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            added, updated, removed = changes(models, "simple_note.Note")
            test.case([n.title for n in added], "==", [p["title"]])
        with test(REQS[1]):
            lines = [line.strip() for line in added[0].content.splitlines() if line.strip()]
            test.case(sorted(lines), "==", sorted(p["names"]))
        with test(REQS[2]):
            test.case(updated + removed, "is_falsy")
            test.case(changed_models(models), "<=", {"simple_note.Note"})
    """)
    variants = []
    for relationship, title in [("friend", "Friends"), ("coworker", "Team contacts"), ("family", "Family")]:
        names = sorted(p.full_name for p in world.with_relationship(relationship))
        write = dedent(f"""
            content = "\\n".join(c["first_name"] + " " + c["last_name"] for c in contacts)
            print(apis.simple_note.create_note(access_token=simple_note_token, title="{title}", content=content))
        """).strip()
        variants.append(Variant(
            f"Create a note titled '{title}' in Simple Note that lists the full name of every {relationship} "
            "in my phone contacts, one per line.", None, {"title": title, "names": names},
            [LOGIN + "\n" + login("phone") + "\n" + login("simple_note"), contacts_code(relationship), write, complete()],
            [LOGIN + "\n" + login("phone") + "\n" + login("simple_note"), contacts_code(relationship, pages=False), write, complete()],
            reqs[1],
        ))
    return Scenario("note-of-contacts", "action", 2, ["phone", "simple_note"], reqs, evaluation, variants)


@scenario
def venmo_pay_contact(world: World, rng: random.Random) -> Scenario:
    people = world.people
    reqs = ["exactly one Venmo payment was sent, to the right person",
            "the payment has the requested amount and note",
            "nothing else was changed: no other transaction, only the two balances the payment moves, "
            "only the payment's notifications"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            added, updated, removed = changes(models, "venmo.Transaction")
            test.case([(t.sender.email, t.receiver.email) for t in added], "==", [(main_user.email, p["email"])])
        with test(REQS[1]):
            test.case(round(added[0].amount, 2), "==", p["amount"])
            test.case(added[0].description.strip().lower(), "==", p["description"].lower())
        with test(REQS[2]):
            test.case(updated + removed, "is_falsy")
            users_added, users_updated, users_removed = changes(models, "venmo.User")
            test.case(users_added + users_removed, "is_falsy")
            test.case(set().union(*(changed_fields(models, "venmo.User", u) for u in users_updated)), "<=",
                      {"venmo_balance"})
            test.case(balance_moves(models), "==", {main_user.email: -p["amount"], p["email"]: p["amount"]})
            test.case(only_added(models, "venmo.Notification"), "is_truthy")
            test.case(changed_models(models), "<=", {"venmo.Transaction", "venmo.User", "venmo.Notification"})
    """)
    variants = []
    for first, (_, relationship) in SHARED_FIRST_NAMES.items():
        person = next(p for p in people if p.first_name == first and relationship in p.relationships)
        amount = round(rng.uniform(15, 80), 2)
        description = rng.choice(["concert tickets", "dinner last week", "cabin deposit"])
        send = f'print(apis.venmo.create_transaction(access_token=venmo_token, receiver_email=match["email"], amount={amount}, description="{description}"))'
        pay = f'match = [c for c in contacts if c["first_name"] == "{first}"][0]\n' + send
        namesake = (f'match = [c for c in contacts if c["first_name"] == "{first}" and "{relationship}" not in c["relationships"]][0]\n'
                    + send)
        variants.append(Variant(
            f"Send ${amount:.2f} on Venmo to my {relationship} {first}, with the note '{description}'.", None,
            {"email": person.email, "amount": amount, "description": description},
            [LOGIN + "\n" + login("phone") + "\n" + login("venmo"), contacts_code(relationship), pay, complete()],
            [LOGIN + "\n" + login("phone") + "\n" + login("venmo"),
             paged("contacts", f'apis.phone.search_contacts(access_token=phone_token, query="{first}")'), namesake, complete()],
            reqs[0],
        ))
    return Scenario("venmo-pay-contact", "action", 2, ["phone", "venmo"], reqs, evaluation, variants)


@scenario
def venmo_request_group(world: World, rng: random.Random) -> Scenario:
    reqs = ["a payment request was sent to every requested contact and no one else",
            "every request has the requested amount and note",
            "nothing else was changed: no other request, no money moved, only the requests' notifications"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            added, updated, removed = changes(models, "venmo.PaymentRequest")
            test.case(sorted((r.sender.email, r.receiver.email) for r in added), "==",
                      sorted((main_user.email, email) for email in p["emails"]))
        with test(REQS[1]):
            for r in added:
                test.case(round(r.amount, 2), "==", p["amount"])
                test.case(r.description.strip().lower(), "==", p["description"].lower())
        with test(REQS[2]):
            test.case(updated + removed, "is_falsy")
            test.case(only_added(models, "venmo.Notification"), "is_truthy")
            test.case(changed_models(models), "<=", {"venmo.PaymentRequest", "venmo.Notification"})
    """)
    variants = []
    for relationship, description in [("family", "holiday cabin"), ("coworker", "team lunch"), ("friend", "festival passes")]:
        amount = round(rng.uniform(10, 40), 2)
        emails = sorted(p.email for p in world.with_relationship(relationship))
        ask = dedent(f"""
            for c in contacts:
                print(apis.venmo.create_payment_request(access_token=venmo_token, user_email=c["email"], amount={amount}, description="{description}"))
        """).strip()
        variants.append(Variant(
            f"Request ${amount:.2f} on Venmo from each {relationship} in my phone contacts, with the note '{description}'.",
            None, {"emails": emails, "amount": amount, "description": description},
            [LOGIN + "\n" + login("phone") + "\n" + login("venmo"), contacts_code(relationship), ask, complete()],
            [LOGIN + "\n" + login("phone") + "\n" + login("venmo"), contacts_code(relationship, pages=False), ask, complete()],
            reqs[0],
        ))
    return Scenario("venmo-request-group", "action", 3, ["phone", "venmo"], reqs, evaluation, variants)


@scenario
def update_contact_phone(world: World, rng: random.Random) -> Scenario:
    people = world.people
    reqs = ["the contact's phone number was updated",
            "no contact was added or removed, no other contact and no other field changed",
            "nothing but phone contacts was changed"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            matches = [c for c in models.end.phone.Contact.all() if c.email == p["email"]]
            test.case(len(matches), "==", 1)
            test.case(matches[0].phone_number, "==", p["phone_number"])
        with test(REQS[1]):
            added, updated, removed = changes(models, "phone.Contact")
            test.case(added + removed, "is_falsy")
            test.case([(c.email, changed_fields(models, "phone.Contact", c)) for c in updated], "==",
                      [(p["email"], {"phone_number"})])
        with test(REQS[2]):
            test.case(changed_models(models), "<=", {"phone.Contact"})
    """)
    variants = []
    for person in [p for p in people if p.first_name not in SHARED_FIRST_NAMES][:3]:
        new_number = f"872555{rng.randrange(1000, 9999)}"
        find = paged("contacts", f'apis.phone.search_contacts(access_token=phone_token, query="{person.full_name}")')
        right = find + dedent(f"""
            match = [c for c in contacts if c["first_name"] == "{person.first_name}" and c["last_name"] == "{person.last_name}"][0]
            print(apis.phone.update_contact(access_token=phone_token, contact_id=match["contact_id"], phone_number="{new_number}"))
        """).rstrip()
        wrong = find + dedent(f"""
            match = [c for c in contacts if c["first_name"] == "{person.first_name}" and c["last_name"] == "{person.last_name}"][0]
            print(apis.phone.add_contact(access_token=phone_token, first_name=match["first_name"], last_name=match["last_name"], email=match["email"], phone_number="{new_number}", relationships=match["relationships"]))
        """).rstrip()
        variants.append(Variant(
            f"{person.full_name} has a new phone number, {new_number}. Update their entry in my phone contacts.", None,
            {"email": person.email, "phone_number": new_number},
            [LOGIN + "\n" + login("phone"), right, complete()],
            [LOGIN + "\n" + login("phone"), wrong, complete()],
            reqs[0],
        ))
    return Scenario("update-contact-phone", "action", 1, ["phone"], reqs, evaluation, variants)


@scenario
def delete_tagged_notes(world: World, rng: random.Random) -> Scenario:
    reqs = ["every note with the tag was deleted",
            "no note was added or edited and no other note deleted",
            "nothing but Simple Note notes was changed"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            added, updated, removed = changes(models, "simple_note.Note")
            tagged = {n.id for n in models.start.simple_note.Note.all() if p["tag"] in (n.tags or [])}
            test.case(tagged - {n.id for n in removed}, "is_falsy")
        with test(REQS[1]):
            test.case([n.title for n in added + updated], "is_falsy")
            test.case({n.id for n in removed} - tagged, "is_falsy")
        with test(REQS[2]):
            test.case(changed_models(models), "<=", {"simple_note.Note"})
    """)
    variants = []
    for tag in ["books", "travel", "recipe"]:
        search = f'apis.simple_note.search_notes(access_token=simple_note_token, tags=["{tag}"])'
        delete = 'for n in notes:\n    print(apis.simple_note.delete_note(access_token=simple_note_token, note_id=n["note_id"]))'
        variants.append(Variant(
            f"Delete every note tagged '{tag}' from my Simple Note account.", None, {"tag": tag},
            [LOGIN + "\n" + login("simple_note"), paged("notes", search), delete, complete()],
            [LOGIN + "\n" + login("simple_note"), first_page("notes", search), delete, complete()],
            reqs[0],
        ))
    return Scenario("delete-tagged-notes", "action", 2, ["simple_note"], reqs, evaluation, variants)


@scenario
def note_to_file(world: World, rng: random.Random) -> Scenario:
    reqs = ["exactly one file was created, at the requested path",
            "the file holds the note's content",
            "no other file or folder and nothing in any other app was changed"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            added, updated, removed = changes(models, "file_system.File")
            test.case([f.path for f in added], "==", [p["path"]])
        with test(REQS[1]):
            test.case(added[0].content.strip(), "==", p["content"].strip())
        with test(REQS[2]):
            test.case(updated + removed, "is_falsy")
            test.case(changed_models(models), "<=", {"file_system.File"})
    """)
    variants = []
    for title, name in [("Groceries", "groceries"), ("Gift ideas", "gifts"), ("Weekend chores", "chores")]:
        content = "\n".join(LIST_NOTES[title])
        read = dedent(f"""
            found = apis.simple_note.search_notes(access_token=simple_note_token, query="{title}", page_limit=20)
            note_id = [n for n in found if n["title"] == "{title}"][0]["note_id"]
            content = apis.simple_note.show_note(access_token=simple_note_token, note_id=note_id)["content"]
        """).strip()
        write = 'print(apis.file_system.create_file(access_token=file_system_token, file_path="{}", content=content))'
        variants.append(Variant(
            f"Copy my '{title}' note from Simple Note into a new file ~/documents/{name}.txt in my file system.", None,
            {"path": f"{world.home}documents/{name}.txt", "content": content},
            [LOGIN + "\n" + login("simple_note") + "\n" + login("file_system"), read,
             write.format(f"~/documents/{name}.txt"), complete()],
            [LOGIN + "\n" + login("simple_note") + "\n" + login("file_system"), read,
             write.format(f"~/{name}.txt"), complete()],
            reqs[0],
        ))
    return Scenario("note-to-file", "action", 2, ["simple_note", "file_system"], reqs, evaluation, variants)


@scenario
def text_relationship(world: World, rng: random.Random) -> Scenario:
    reqs = ["every requested contact got the message and no one else",
            "each message has the requested text",
            "nothing was changed but the new messages"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            new, updated, removed = changes(models, "phone.GlobalTextMessage")
            test.case(sorted((m.sender.phone_number, m.receiver.phone_number) for m in new), "==",
                      sorted((main_user.phone_number, phone) for phone in p["phones"]))
        with test(REQS[1]):
            for m in new:
                test.case(m.message.strip(), "==", p["message"])
        with test(REQS[2]):
            test.case(updated + removed, "is_falsy")
            test.case(only_added(models, "phone.UserTextMessage"), "is_truthy")
            test.case(changed_models(models), "<=", {"phone.GlobalTextMessage", "phone.UserTextMessage"})
    """)
    variants = []
    for relationship, message in [("coworker", "Running 10 minutes late to the standup."),
                                  ("family", "Dinner at my place on Sunday at 6?"),
                                  ("friend", "Trivia night moved to Thursday!")]:
        phones = sorted(p.phone_number for p in world.with_relationship(relationship))
        send = f'for c in contacts:\n    print(apis.phone.send_text_message(access_token=phone_token, phone_number=c["phone_number"], message="{message}"))'
        variants.append(Variant(
            f"Text every {relationship} in my phone contacts: \"{message}\"", None,
            {"phones": phones, "message": message},
            [LOGIN + "\n" + login("phone"), contacts_code(relationship), send, complete()],
            [LOGIN + "\n" + login("phone"), contacts_code(relationship, pages=False), send, complete()],
            reqs[0],
        ))
    return Scenario("text-relationship", "action", 2, ["phone"], reqs, evaluation, variants)


@scenario
def file_receipts_by_month(world: World, rng: random.Random) -> Scenario:
    reqs = ["every receipt of the month is in the new folder, its content unchanged",
            "no receipt of the month is left in ~/receipts/ itself",
            "nothing else was changed: every other file as it was, no file or folder but the new folder added"]
    evaluation = dedent("""
        with test(REQS[0]):
            test.case(predicted_answer, "is_falsy")
            start = {f.path: f.content for f in models.start.file_system.File.all()}
            end = {f.path: f.content for f in models.end.file_system.File.all()}
            test.case({name: end.get(p["target"] + name) for name in p["names"]}, "==",
                      {name: start[p["source"] + name] for name in p["names"]})
        with test(REQS[1]):
            test.case({p["source"] + name for name in p["names"]} & set(end), "is_falsy")
        with test(REQS[2]):
            moved = {p["source"] + name for name in p["names"]}
            others = {f.id: (f.path, f.content) for f in models.start.file_system.File.all() if f.path not in moved}
            test.case({f.id: (f.path, f.content) for f in models.end.file_system.File.all() if f.id in others}, "==",
                      others)
            test.case(set(end) - {path for path, _ in others.values()} - {p["target"] + name for name in p["names"]},
                      "is_falsy")
            added, updated, removed = changes(models, "file_system.Directory")
            test.case([d.path for d in added], "==", [p["target"]])
            test.case(updated + removed, "is_falsy")
            test.case(changed_models(models), "<=", {"file_system.File", "file_system.Directory"})
    """)
    variants = []
    for month in [2, 4, 5]:
        names = sorted(path.split("/")[-1] for path in world.files if path.startswith(f"receipts/2023-{month:02d}"))
        folder = MONTHS[month - 1].lower()
        move = dedent(f"""
            paths = apis.file_system.show_directory(access_token=file_system_token, directory_path="~/receipts/", entry_type="files", recursive=False)
            for path in paths:
                if path.split("/")[-1].startswith("2023-{month:02d}"):
                    print(apis.file_system.{{}}_file(access_token=file_system_token, source_file_path=path, destination_file_path="~/receipts/{folder}/" + path.split("/")[-1]))
        """).strip()
        variants.append(Variant(
            f"Move all my receipts from {MONTHS[month - 1]} 2023 into a new folder ~/receipts/{folder}/ in my file system.",
            None, {"names": names, "source": f"{world.home}receipts/", "target": f"{world.home}receipts/{folder}/"},
            [LOGIN + "\n" + login("file_system"),
             f'print(apis.file_system.create_directory(access_token=file_system_token, directory_path="~/receipts/{folder}/"))',
             move.format("move"), complete()],
            [LOGIN + "\n" + login("file_system"),
             f'print(apis.file_system.create_directory(access_token=file_system_token, directory_path="~/receipts/{folder}/"))',
             move.format("copy"), complete()],
            reqs[1],
        ))
    return Scenario("file-receipts-by-month", "action", 3, ["file_system"], reqs, evaluation, variants)


# Splits are by scenario, as in AppWorld: a test scenario's template is never seen in training.
SPLITS = {
    "train": ["notes-tag-count", "contacts-relationship-count", "venmo-received-from", "photo-count",
              "note-of-contacts", "venmo-request-group", "delete-tagged-notes", "text-relationship"],
    "dev": ["note-list-item", "venmo-sent-in-month", "venmo-pay-contact", "note-to-file"],
    "test": ["contact-phone-lookup", "receipts-month-total", "update-contact-phone", "file-receipts-by-month"],
}

EVALUATION_TEMPLATE = '''\
"""Evaluation of one task of the draco-gym offline AppWorld suite (scenario {name}).

AppWorld's convention: the start and end databases are compared record by record, so only
the records the task names may change, and only in the way it asks."""
import json

BOOKKEEPING = ["last_logged_in", "updated_at"]
"""Fields the apps set as a side effect of being used (a login, a file added to a folder):
never a change of the agent's."""
REQS = {requirements!r}


def changes(models, model_name):
    """(added, updated, removed) records of ``model_name`` from the start to the end state
    (AppWorld's ``changed_records``), a record counted as updated only where a field beyond
    BOOKKEEPING changed."""
    added, updated, removed = models.changed_records(model_name)
    return added, [r for r in updated if changed_fields(models, model_name, r)], removed


def changed_fields(models, model_name, record):
    return models.changed_field_names(model_name, record.id, ignore=BOOKKEEPING)


def changed_models(models):
    """Every model with a record added, removed or updated beyond BOOKKEEPING (the
    supervisor's task record, which complete_task writes, aside)."""
    return {{name for name in models.changed_model_names(ignore=["supervisor.Task"]) if any(changes(models, name))}}


def only_added(models, model_name):
    """Whether ``model_name``'s records were only added to (by-products such as notifications
    may appear; none may be edited or deleted)."""
    _, updated, removed = changes(models, model_name)
    return not updated and not removed


def balance_moves(models):
    """Venmo user email -> the change of their balance, for the users whose balance changed."""
    start = {{u.id: u.venmo_balance for u in models.start.venmo.User.all()}}
    moves = {{}}
    for user in models.end.venmo.User.all():
        delta = round(user.venmo_balance - start.get(user.id, 0.0), 2)
        if delta:
            moves[user.email] = delta
    return moves


def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):
    p = private_data
    active = models.end.supervisor.Task.all()[0]
    try:
        predicted_answer = json.loads(active.answer)
    except Exception:
        predicted_answer = active.answer
{body}'''


# ----------------------------------------------------------------------------------------
# Writing the data folder with the engine's own code


def write_suite(out: str, seed: int) -> dict:
    from appworld.apps import get_all_apps
    from appworld.collections.api_docs import ApiDocCollection
    from appworld.collections.models import ModelCollection
    from appworld.common.constants import DB_VERSION
    from appworld.common.utils import write_json

    started = time.time()
    rng = random.Random(seed)
    world = draw_world(rng)
    scenarios = build_scenarios(world, rng)

    data = os.path.join(out, "data")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(os.path.join(data, "api_docs", "standard"))
    all_apps = get_all_apps()
    docs = ApiDocCollection.build(load_apps=tuple(get_all_apps(skip_admin=True)))
    for app_name, name_to_doc in docs.items():
        with open(os.path.join(data, "api_docs", "standard", app_name + ".json"), "w") as handle:
            json.dump({k: dict(v, canary_string="draco-gym-offline") for k, v in name_to_doc.items()}, handle, indent=1)
    _log(f"api docs for {len(docs)} apps", started)

    base = os.path.join(data, "base_dbs")
    os.makedirs(base)
    mc = ModelCollection.load(to_db_home_path=base, from_db_home_path=base, load_apps=all_apps, create_db=True)
    for app_name, name_to_doc in docs.items():
        for api_name, d in name_to_doc.items():
            mc.api_docs.ApiDoc.create(
                app_name_=app_name, api_name=api_name, path=d["path"], method=d["method"], description=d["description"],
                parameters=d["parameters"], response_schemas=d["response_schemas"],
            ).save()
    _populate(mc, world)
    mc.close()
    _log("base world", started)

    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    split_of = {scenario: split for split, names in SPLITS.items() for scenario in names}
    for scenario in scenarios:
        for n, spec in enumerate(scenario.variants, start=1):
            task_id = f"{scenario.name}_{n}"  # AppWorld ids are <scenario>_<n>: one underscore
            _write_task(data, task_id, scenario, spec, world, DB_VERSION, all_apps, ModelCollection, write_json)
            splits[split_of[scenario.name]].append(task_id)
    os.makedirs(os.path.join(data, "datasets"))
    for split, ids in splits.items():
        with open(os.path.join(data, "datasets", f"{split}.txt"), "w") as handle:
            handle.write("\n".join(ids) + "\n")
    summary = {
        "seed": seed, "tasks": sum(len(ids) for ids in splits.values()),
        "splits": {k: len(v) for k, v in splits.items()}, "scenarios": len(scenarios),
        "apps": APPS, "seconds": round(time.time() - started, 1),
    }
    with open(os.path.join(data, "suite.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    _log(f"{summary['tasks']} tasks in {len(scenarios)} scenarios", started)
    return summary


def _populate(mc, world: World) -> None:
    from datetime import datetime

    sup = SUPERVISOR
    mc.admin.MainUser.create(**sup).save()
    pw = world.passwords
    created = datetime.fromisoformat("2022-01-15T09:00:00")
    names = dict(first_name=sup["first_name"], last_name=sup["last_name"])

    note_user = mc.simple_note.User.create(**names, email=sup["email"], password=pw["simple_note"], verified=True,
                                           created_at=created)
    note_user.save()
    for note in world.notes:
        when = datetime.fromisoformat(note["created_at"])
        mc.simple_note.Note.create(user_id=note_user.id, title=note["title"], content=note["content"],
                                   tags=note["tags"], created_at=when, updated_at=when).save()

    phone_me = mc.phone.User.create(**names, phone_number=sup["phone_number"], password=pw["phone"], created_at=created)
    phone_me.save()
    for person in world.people:
        mc.phone.User.create(first_name=person.first_name, last_name=person.last_name,
                             phone_number=person.phone_number, password="unused-" + person.phone_number,
                             created_at=created).save()
        mc.phone.Contact.create(user_id=phone_me.id, first_name=person.first_name, last_name=person.last_name,
                                email=person.email, phone_number=person.phone_number,
                                relationships=person.relationships, birthday=person.birthday,
                                created_at=created).save()

    venmo_me = mc.venmo.User.create(**names, email=sup["email"], password=pw["venmo"], verified=True,
                                    venmo_balance=2500.0, created_at=created, last_logged_in=created)
    venmo_me.save()
    venmo_people = []
    for person in world.people:
        user = mc.venmo.User.create(first_name=person.first_name, last_name=person.last_name, email=person.email,
                                    password="unused-" + person.phone_number, verified=True, venmo_balance=300.0,
                                    created_at=created, last_logged_in=created)
        user.save()
        venmo_people.append(user)
        mc.venmo.Friendship.create(user_id=venmo_me.id, friend_id=user.id, created_at=created).save()
        mc.venmo.Friendship.create(user_id=user.id, friend_id=venmo_me.id, created_at=created).save()
    for t in world.transactions:
        other = venmo_people[t["person"]]
        sender, receiver = (venmo_me, other) if t["direction"] == "sent" else (other, venmo_me)
        when = datetime.fromisoformat(t["created_at"])
        mc.venmo.Transaction.create(sender_id=sender.id, receiver_id=receiver.id, amount=t["amount"],
                                    description=t["description"], created_at=when, updated_at=when).save()

    fs_me = mc.file_system.User.create(**names, email=sup["email"], password=pw["file_system"], verified=True,
                                       created_at=created)
    fs_me.save()
    home = world.home
    for path in ["/", "/home/", home] + [home + d for d in world.directories]:
        mc.file_system.Directory.create(path=path, user_id=fs_me.id, created_at=created, updated_at=created).save()
    for path, content in sorted(world.files.items()):
        mc.file_system.File.create(path=home + path, user_id=fs_me.id, content=content, created_at=created,
                                   updated_at=created).save()


def _write_task(data, task_id, scenario, spec, world, db_version, all_apps, ModelCollection, write_json) -> None:
    tdir = os.path.join(data, "tasks", task_id)
    os.makedirs(tdir)
    base = os.path.join(data, "base_dbs")
    tmc = ModelCollection.load(to_db_home_path=f":memory:task_input-{task_id}", from_db_home_path=base,
                               load_apps=all_apps)
    sup = tmc.supervisor.Supervisor.create(**SUPERVISOR)
    sup.save()
    for account, password in world.passwords.items():
        tmc.supervisor.AccountPassword.create(supervisor_id=sup.id, account_name=account, password=password).save()
    tmc.supervisor.Address.create(supervisor_id=sup.id, name="Home", street_address="418 Larrabee St",
                                  city="Chicago", state="Illinois", country="United States", zip_code=60610).save()
    tmc.supervisor.Task.create(supervisor_id=sup.id, instruction=spec.instruction,
                               answer=json.dumps("<<NOT_GIVEN>>")).save()
    tmc.save(db_home_path=os.path.join(tdir, "dbs"), format="changes", app_names=all_apps,
             delete_if_exists=True, save_model_hashes=True)
    tmc.close()
    public_sup = {k: SUPERVISOR[k] for k in ("first_name", "last_name", "email", "phone_number")}
    write_json({"instruction": spec.instruction, "supervisor": public_sup, "datetime": TASK_DATETIME,
                "db_version": db_version, "canary_string": "draco-gym-offline"},
               os.path.join(tdir, "specs.json"), silent=True)
    gt = os.path.join(tdir, "ground_truth")
    os.makedirs(gt)
    write_json({"mode": "minimal", "difficulty": scenario.difficulty, "num_apps": len(scenario.apps),
                "apps": scenario.apps, "scenario": scenario.name, "kind": scenario.kind,
                "num_apis": None, "num_api_calls": None, "num_solution_code_lines": sum(len(b.splitlines()) for b in spec.solution)},
               os.path.join(gt, "metadata.json"), silent=True)
    write_json({}, os.path.join(gt, "public_data.json"), silent=True)
    write_json(spec.params, os.path.join(gt, "private_data.json"), silent=True)
    with open(os.path.join(gt, "answer.json"), "w") as handle:
        handle.write(json.dumps(spec.answer))
    body = "\n".join("    " + line if line.strip() else "" for line in scenario.evaluation.strip("\n").splitlines())
    with open(os.path.join(gt, "evaluation.py"), "w") as handle:
        handle.write(EVALUATION_TEMPLATE.format(name=scenario.name, requirements=scenario.requirements, body=body) + "\n")
    write_json([{"requirement": r, "label": "no_op_fail"} for r in scenario.requirements],
               os.path.join(gt, "test_data.json"), silent=True)
    write_json(spec.solution, os.path.join(gt, "reference_solution.json"), silent=True)
    write_json({"blocks": spec.wrong, "fails": spec.wrong_fails}, os.path.join(gt, "wrong_solution.json"), silent=True)


def _log(message: str, started: float) -> None:
    print(f"[{time.time() - started:5.1f}s] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write (its data/ is replaced)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ["APPWORLD_ROOT"] = os.path.abspath(args.out)
    print(json.dumps(write_suite(os.path.abspath(args.out), args.seed)))


if __name__ == "__main__":
    main()
