"""docs/fidelity.md and the code agree: every row with a key names a default the code has,
with the value the page gives, and every credit option of every rule is on the page with
the label its rule declares (paper / reference / ours)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import yaml

from draco_gym.algos.config import RunConfig
from draco_gym.algos.credit import CREDIT_RULES, credit_spec

PAGE = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
COLUMNS = ["Key", "Value or behaviour", "Paper", "Reference", "Default here", "Whose", "Why it differs"]


def rows() -> list[list[str]]:
    """The cells of every table row of the page (header and rule lines left out)."""
    out = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "Key":
            assert cells == COLUMNS, line
            continue
        assert len(cells) == len(COLUMNS), f"{len(cells)} cells, expected {len(COLUMNS)}: {line}"
        out.append(cells)
    return out


def keyed() -> dict[str, tuple[object, str]]:
    """key -> (the default the page gives, whose)."""
    out = {}
    for key, _, _, _, default, whose, _ in rows():
        if key == "—":
            continue
        assert whose in ("paper", "reference", "ours"), f"{key}: whose is {whose!r}"
        shown = re.match(r"`([^`]*)`", default)
        assert shown, f"{key}: the default cell must start with the value in backticks, got {default!r}"
        name = key.strip("`")
        assert name not in out, f"{name} appears twice"
        out[name] = (yaml.safe_load(shown.group(1)), whose)
    return out


def _import(dotted: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            target = getattr(target, part)
        return target
    raise ImportError(dotted)


def _run_default(path: list[str]):
    model = RunConfig
    for part in path[:-1]:  # the sections' own classes (a required section has no default)
        model = model.model_fields[part].annotation
    return model.model_fields[path[-1]].get_default(call_default_factory=True)


def code_default(key: str):
    """The default in the code that ``key`` names (see the page's "How to read the tables")."""
    kind, _, rest = key.partition(":")
    if rest and kind == "py":
        return _import(rest)
    if rest and kind == "sig":
        owner, param = rest.rsplit(".", 1)
        return inspect.signature(_import(owner)).parameters[param].default
    parts = key.split(".")
    if parts[0] == "credit" and len(parts) == 3:
        return credit_spec(parts[1]).defaults()[parts[2]][0]
    if parts[0] == "reward" and len(parts) == 3:
        from draco_gym.reward import REWARDS

        return inspect.signature(REWARDS.get(parts[1])).parameters[parts[2]].default
    if parts[0] == "env":
        from draco_gym.envs.base import CodeStepEnv

        return inspect.signature(CodeStepEnv).parameters[parts[1]].default
    return _run_default(parts)


@pytest.mark.parametrize("key", sorted(keyed()))
def test_the_default_in_the_code_is_the_one_on_the_page(key):
    shown, whose = keyed()[key]
    actual = code_default(key)
    assert actual == shown, f"{key}: the code's default is {actual!r}, docs/fidelity.md says {shown!r}"


def test_every_credit_option_is_on_the_page_with_its_rules_label():
    page = {k: v for k, v in keyed().items() if k.startswith("credit.") and k.count(".") == 2}
    declared = {f"credit.{name}.{option}": origin for name in CREDIT_RULES.names()
                for option, (_, origin, _) in credit_spec(name).defaults().items()}
    assert sorted(page) == sorted(declared), "credit options missing from docs/fidelity.md or not declared"
    for key, origin in declared.items():
        assert page[key][1] == origin, f"{key}: labelled {origin!r} in its rule, {page[key][1]!r} on the page"
