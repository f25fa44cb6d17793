"""The package's import structure, read statically (ast) from every module file, imports
inside functions included: no import cycle, Ray imported only in ``draco_gym.algos.rllib``,
and test modules that share code through conftest.py or helper modules, never each other.

A lazy import inside a function hides a cycle from an import-time check; read as text
every import counts, so a cycle cannot hide there either.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
RAY_ROOM = "draco_gym.algos.rllib"


def package_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the installed package by dotted name, from setup.cfg's ``package_dir``
    (``draco_gym.algos`` lives in ``algos/``, ...)."""
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    mapping = dict(line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines())
    modules: dict[str, Path] = {}
    for package, folder in ((k.strip(), root / v.strip()) for k, v in mapping.items()):
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            if not all((folder / Path(*rel.parts[:i]) / "__init__.py").is_file() for i in range(len(rel.parts))):
                continue  # a folder of scripts or assets, not a subpackage
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported dotted name, line) for every import statement anywhere in the module,
    relative ones resolved; ``from a import b`` yields ``a.b`` (a module, or a name that
    ``a`` defines: the caller tells them apart)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out += [(module if alias.name == "*" else f"{module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            out.append((node.args[0].value, node.lineno))
    return out


def _dynamic_import(node: ast.Call) -> bool:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return (called in ("import_module", "__import__") and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module of the package its imports execute: first line}.

    Importing ``a.b.c`` executes ``a`` and ``a.b`` first, so they count too, except the
    packages the importer itself lives in: they are already being imported when it runs
    (``from draco_gym.reward import stages`` inside ``draco_gym.reward.dynamic`` needs no
    more of ``draco_gym.reward``; ``from draco_gym.reward import REWARDS`` does)."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, line in imports_of(name, path):
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if not target:
                continue
            parts = target.split(".")
            executed = [".".join(parts[:i]) for i in range(1, len(parts))]
            for module in [*(m for m in executed if m not in own and m in modules), target]:
                if module != name:
                    edges.setdefault(module, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (deep graphs, no recursion limit)
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return [_path_within(graph, set(c)) for c in components]


def _path_within(graph: dict[str, dict[str, int]], members: set[str]) -> list[str]:
    """A cycle through the component's smallest member, by breadth-first search."""
    start = min(members)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in graph[node]:
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    return " -> ".join(f"{a} ({modules[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])) \
        + f" -> {cycle[-1]}"


def ray_imports(modules: dict[str, Path]) -> list[str]:
    """``module (file:line)`` for every import of Ray outside the Ray room."""
    found = []
    for name, path in sorted(modules.items()):
        if name == RAY_ROOM or name.startswith(RAY_ROOM + "."):
            continue
        lines = {line: target for target, line in reversed(imports_of(name, path))
                 if target == "ray" or target.startswith("ray.")}  # one entry per statement
        found += [f"{name} ({path.relative_to(ROOT)}:{line}): {target}" for line, target in sorted(lines.items())]
    return found


def test_the_package_has_no_import_cycle():
    modules = package_files()
    assert {"draco_gym.algos.rllib.grpo", "draco_gym.algos.policy.rollout", "draco_gym.algos.cli.train",
            "draco_gym.envs.tau.env", "draco_gym.reward", "draco_gym.bench.scale"} <= set(modules), \
        "the walk must reach every package of setup.cfg"
    graph = import_graph(modules)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph, modules) for c in found)


def test_only_the_rllib_room_imports_ray():
    modules = package_files()
    assert any(name.startswith(RAY_ROOM + ".") for name in modules)
    assert not (found := ray_imports(modules)), "Ray imported outside draco_gym.algos.rllib:\n" + "\n".join(found)


def test_test_modules_do_not_import_each_other():
    tests = Path(__file__).parent
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for target, line in imports_of(f"tests.{path.stem}", path):
            head = target.removeprefix("tests.").split(".")[0]
            if head.startswith("test_") and (tests / f"{head}.py").is_file():
                found.append(f"{path.name}:{line} imports {head}")
    assert not found, "shared test code goes to conftest.py or a helper module:\n" + "\n".join(found)


# -- the checks themselves, on a package made up here -------------------------------------


def _fake_package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    (tmp_path / "setup.cfg").write_text("[options]\npackage_dir =\n    draco_gym = core\n    draco_gym.algos = algos\n")
    for rel, text in {"core/__init__.py": "", "algos/__init__.py": "", "algos/rllib/__init__.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return package_files(tmp_path)


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    modules = _fake_package(tmp_path, {
        "algos/a.py": "from draco_gym.algos.b import thing\n",
        "algos/b.py": "def thing():\n    from . import c\n",
        "algos/c.py": "import os\n\ndef later():\n    import draco_gym.algos.a\n",
        "algos/d.py": "from draco_gym.algos import a\n",  # into the cycle, not on it
        "algos/__init__.py": "from draco_gym.algos.e import E\n",
        "algos/e.py": "from draco_gym.algos import HELPER\nE = 1\n",  # a name of the package being imported
        "core/x.py": "import draco_gym.algos.d\n",  # runs algos/__init__ first: an edge to it
    })
    graph = import_graph(modules)
    assert graph["draco_gym.algos.b"] == {"draco_gym.algos.c": 2}, "its own package is already being imported"
    assert graph["draco_gym.x"] == {"draco_gym.algos": 1, "draco_gym.algos.d": 1}
    assert sorted(cycles(graph)) == [["draco_gym.algos", "draco_gym.algos.e", "draco_gym.algos"],
                                     ["draco_gym.algos.a", "draco_gym.algos.b", "draco_gym.algos.c", "draco_gym.algos.a"]]


def test_an_acyclic_package_passes_and_ray_is_found_outside_its_room(tmp_path, monkeypatch):
    modules = _fake_package(tmp_path, {
        "algos/rllib/grpo.py": "import ray\nfrom draco_gym.algos.policy import loss\n",
        "algos/policy/__init__.py": "",
        "algos/policy/loss.py": "def f():\n    from ray.rllib import core\n",
        "algos/cli.py": "import importlib\nimportlib.import_module('ray.tune')\n",
    })
    assert cycles(import_graph(modules)) == []
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert ray_imports(modules) == ["draco_gym.algos.cli (algos/cli.py:2): ray.tune",
                                    "draco_gym.algos.policy.loss (algos/policy/loss.py:2): ray.rllib.core"]


# -- every import of the package names a module that exists --------------------------------


def defined_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (inside ``if``/``try`` too), or None when
    it answers for any name (a module ``__getattr__``)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(), filename=str(path)).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(child for handler in getattr(node, "handlers", []) for child in handler.body)]
    return None if "__getattr__" in names else names


def missing_imports(tree: ast.AST, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, dotted name) for each import of ``draco_gym`` (statements, ``import_module`` with a
    constant, ``python -m``-style strings) that names no module, nor a name its module defines."""
    wanted: list[tuple[int, str, str | None]] = []  # (line, module, name imported from it)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            wanted += [(node.lineno, node.module, alias.name) for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            wanted.append((node.lineno, node.args[0].value, None))
    missing = []
    for line, module, name in wanted:
        if module.split(".")[0] != "draco_gym":
            continue
        if module not in modules:
            missing.append((line, module))
        elif name is not None and f"{module}.{name}" not in modules:
            names = defined_names(modules[module])
            if names is not None and name not in names:
                missing.append((line, f"{module}.{name}"))
    return missing


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """(first line, code) of each fenced ``python`` block of a Markdown page."""
    blocks, lines, start = [], markdown.splitlines(), None
    for number, line in enumerate(lines, 1):
        fence = line.strip()
        if start is None and fence.startswith("```") and fence[3:].strip() in ("python", "py"):
            start, indent = number, len(line) - len(line.lstrip())
        elif start is not None and fence == "```":
            blocks.append((start + 1, "\n".join(text[indent:] for text in lines[start:number - 1])))
            start = None
    return blocks


def repo_import_sites() -> dict[str, ast.AST]:
    """Every place the repo writes an import of the package: its modules, tests, examples,
    scripts, and the Python blocks and ``python -m`` commands of the README and docs."""
    sites: dict[str, ast.AST] = {}
    files = {*package_files().values(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("examples/**/*.py"),
             *ROOT.glob("scripts/**/*.py")}
    for path in sorted(files):
        sites[str(path.relative_to(ROOT))] = ast.parse(path.read_text(), filename=str(path))
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]:
        text = page.read_text()
        for first, code in python_blocks(text):
            try:
                tree = ast.parse(code)
            except SyntaxError:  # a fragment (``...``); its imports are read line by line
                tree = ast.parse("\n".join(line.strip() for line in code.splitlines()
                                           if re.match(r"\s*(from|import) draco_gym\S* ", line)) or "pass")
            ast.increment_lineno(tree, first - 1)
            sites[f"{page.relative_to(ROOT)} (block at line {first})"] = tree
        commands = [f"import {m}" for m in re.findall(r"python3? -m (draco_gym[\w.]*)", text)]
        sites[f"{page.relative_to(ROOT)} (python -m)"] = ast.parse("\n".join(commands) or "pass")
    return sites


def test_every_import_of_the_package_names_a_module_that_exists():
    modules = package_files()
    sites = repo_import_sites()
    assert "README.md (python -m)" in sites and any(k.startswith("tests/") for k in sites)
    found = [f"{site}:{line}: {name}" for site, tree in sites.items() for line, name in missing_imports(tree, modules)]
    assert not found, "imports of paths that do not exist:\n" + "\n".join(found)


def test_a_moved_module_and_a_missing_name_are_found(tmp_path):
    modules = _fake_package(tmp_path, {"algos/policy/__init__.py": "", "algos/policy/loss.py": "def grpo_loss(): ...\n",
                                       "algos/lazy.py": "def __getattr__(name): ...\n"})
    tree = ast.parse("import draco_gym.algos.loss\n"
                     "from draco_gym.algos.policy.loss import grpo_loss, token_loss\n"
                     "from draco_gym.algos.policy import loss\n"
                     "from draco_gym.algos.lazy import anything\n"
                     "import importlib\nimportlib.import_module('draco_gym.algos.grpo')\n")
    assert missing_imports(tree, modules) == [(1, "draco_gym.algos.loss"), (2, "draco_gym.algos.policy.loss.token_loss"),
                                              (6, "draco_gym.algos.grpo")]
    assert python_blocks("text\n```python\nimport a\n```\n  ```py\n  import b\n  ```\n```bash\nx\n```\n") == \
        [(3, "import a"), (6, "import b")]
