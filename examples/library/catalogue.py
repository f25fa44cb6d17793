"""A library catalogue as a tool-use environment: four lookups, three kinds of question."""

import gymnasium as gym

BOOKS = {"B1": ("Salt Harbour", "A1"), "B2": ("The Glass Orchard", "A2"), "B3": ("Nine Lanterns", "A3"),
         "B4": ("Winter Cartography", "A4"), "B5": ("The Quiet Engine", "A1"), "B6": ("Paper Moons", "A2"),
         "B7": ("River of Keys", "A3"), "B8": ("A Field of Bells", "A4"), "B9": ("The Copper Gate", "A1"),
         "B10": ("Small Hours", "A2"), "B11": ("The Tin Lighthouse", "A3"), "B12": ("Seven Harbours", "A4")}
AUTHORS = {"A1": ("Mira Okafor", 1961), "A2": ("Tomas Brandt", 1974), "A3": ("Lena Duarte", 1958),
           "A4": ("Kenji Arden", 1983)}
MEMBERS = {"M1": ("Ivo Lenz", "ivo.lenz@lib.example"), "M2": ("Ruth Osei", "ruth.osei@lib.example"),
           "M3": ("Pablo Ferri", "pablo.ferri@lib.example"), "M4": ("Anna Kask", "anna.kask@lib.example")}
LOANS = {"B1": ["M2", "M4"], "B2": ["M1"], "B3": ["M3", "M1", "M2"], "B4": ["M4"], "B5": ["M1", "M3"],
         "B6": ["M2"], "B7": ["M4", "M2"], "B8": ["M3"], "B9": ["M2", "M1", "M4"], "B10": ["M3", "M4"],
         "B11": ["M1"], "B12": ["M4", "M3"]}


def find_book(title: str) -> dict:
    """Look up a book by its exact title. Returns {"id", "title", "author_id"}."""
    for book_id, (name, author_id) in BOOKS.items():
        if name.lower() == title.strip().lower():
            return {"id": book_id, "title": name, "author_id": author_id}
    raise LookupError(f"no book titled {title!r}")


def get_author(author_id: str) -> dict:
    """An author by id, e.g. "A1". Returns {"id", "name", "born"}."""
    name, born = AUTHORS[author_id]
    return {"id": author_id, "name": name, "born": born}


def list_loans(book_id: str) -> list:
    """The copies of a book on loan, by book id, e.g. "B1", oldest loan first. Returns [{"member_id"}]."""
    return [{"member_id": member} for member in LOANS[book_id]]


def get_member(member_id: str) -> dict:
    """A library member by id, e.g. "M1". Returns {"id", "name", "email"}."""
    name, email = MEMBERS[member_id]
    return {"id": member_id, "name": name, "email": email}


def tasks() -> list:
    """Three questions per book, each with its answer, the tools it needs (for the rule
    rubric) and a reference solution (for the warm start)."""
    out = []
    for n, (book_id, (title, author_id)) in enumerate(BOOKS.items(), start=1):
        find = f'book = find_book("{title}")\n'
        out += [
            {"id": f"author-{n}", "instruction": f'Who wrote "{title}"? Submit the author\'s name.',
             "answer": AUTHORS[author_id][0],
             "metadata": {"operators": {"evidence": ["find_book", "get_author"], "execution": ["submit"]},
                          "reference": [find + 'submit(get_author(book["author_id"])["name"])']}},
            {"id": f"loans-{n}", "instruction": f'How many copies of "{title}" are on loan? Submit the number.',
             "answer": len(LOANS[book_id]),
             "metadata": {"operators": {"evidence": ["find_book", "list_loans"], "execution": ["submit"]},
                          "reference": [find + 'submit(len(list_loans(book["id"])))']}},
            {"id": f"borrower-{n}", "instruction": f'What is the email of the member who has held "{title}" '
                                                   "the longest? Submit the email.",
             "answer": MEMBERS[LOANS[book_id][0]][1],
             "metadata": {"operators": {"evidence": ["find_book", "list_loans", "get_member"],
                                        "execution": ["submit"]},
                          "reference": [find + 'loan = list_loans(book["id"])[0]\n'
                                               'submit(get_member(loan["member_id"])["email"])']}},
        ]
    return out


gym.register(
    id="library/Catalogue-v0",
    entry_point="draco_gym.envs.python_tools:PythonToolsEnv",
    kwargs={"tools": ["catalogue:find_book", "catalogue:get_author", "catalogue:list_loans", "catalogue:get_member"],
            "tasks": "catalogue:tasks", "end_rule": "task_completed", "max_turns": 2,
            "max_observation_chars": 400},
)
