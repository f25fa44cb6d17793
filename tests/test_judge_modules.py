"""The judge modules' shape: each idea in its own file, no import cycle inside the reward
layer (imports inside functions count), the HTTP judge free of the in-process judge, and the
public ``draco_gym.reward.judges`` path still naming everything it named."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REWARD = Path(__file__).resolve().parents[1] / "reward"
PACKAGE = "draco_gym.reward"


def import_graph() -> dict[str, set[str]]:
    """Module -> the reward modules it imports anywhere in its text (top level or inside a
    function), by name: "__init__" stands for the package itself."""
    modules = {path.stem for path in REWARD.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in REWARD.glob("*.py"):
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == PACKAGE:
                    # a submodule by name, or a name the package's __init__ re-exports
                    edges |= {a.name if a.name in modules else "__init__" for a in node.names}
                    continue
                targets = [node.module]
            else:
                continue
            for target in targets:
                if target.startswith(PACKAGE + "."):
                    edges.add(target.removeprefix(PACKAGE + ".").split(".")[0])
        edges.discard(path.stem)
        graph[path.stem] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_find_cycle_reports_a_lazy_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_reward_layer_has_no_import_cycle_lazy_imports_included():
    graph = import_graph()
    assert {"judges", "judge_protocol", "judge_servers", "grammar", "openai_judge", "transformers_judge",
            "function_judge", "local_judge"} <= set(graph)
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_http_judge_does_not_import_the_in_process_judge():
    graph = import_graph()
    for http_side in ("openai_judge", "judge_servers"):
        assert not reachable(graph, http_side) & {"local_judge", "transformers_judge", "judges", "__init__"}, \
            (http_side, reachable(graph, http_side))


OLD_PUBLIC_NAMES = ["JudgeReply", "Judge", "JudgeUnavailable", "JUDGES", "build_judge", "StructuredOutput",
                    "STRUCTURED_OUTPUTS", "ServerProfile", "server_profile", "forget_servers", "grammar_ready",
                    "FormatRefused", "JudgeTimedOut", "OpenAIJudge", "TransformersJudge", "FunctionJudge", "as_judge"]


def test_the_judges_module_still_names_every_public_judge_name_in_a_fresh_process():
    """Configs and users import from ``draco_gym.reward.judges``; a fresh interpreter imports
    it first (no package warmed up by another test) and finds every registered judge by name,
    without loading torch."""
    probe = ("import sys; from draco_gym.reward.judges import " + ", ".join(OLD_PUBLIC_NAMES) + "; "
             "print(JUDGES.names(), type(build_judge('openai', model='m')).__name__, "
             "type(as_judge(lambda m: '{}')).__name__, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['function',", "'openai',", "'transformers']", "OpenAIJudge", "FunctionJudge",
                                     "False"]
