"""A pytest plugin: with ``DRACO_GYM_STRICT_IMPORTS=1`` (``scripts/test.sh`` sets it), an
``importorskip`` of a module that CI installs fails instead of skipping.

CI installs every extra (``.ci/run``: ``pip install -e ".[all]"``), so a module of that set
that cannot be imported there is a broken install; a skip would turn it into a green run
that tested nothing. Other modules (vLLM, which wants a GPU) still skip.
"""

from __future__ import annotations

import importlib
import os

import pytest

CI_INSTALLED = frozenset({"draco_gym", "ray", "torch", "transformers", "peft", "datasets", "trl", "tau2",
                          "pettingzoo", "hypothesis", "gymnasium", "openai", "matplotlib", "yaml", "playwright",
                          "mkdocs", "mkdocstrings", "material"})

_importorskip = pytest.importorskip


def _strict_importorskip(modname: str, minversion: str | None = None, reason: str | None = None, **kwargs):
    if modname.split(".")[0] not in CI_INSTALLED:
        return _importorskip(modname, minversion=minversion, reason=reason, **kwargs)
    try:
        return importlib.import_module(modname)
    except ImportError as exc:
        raise ImportError(f"{modname} is installed by CI but cannot be imported ({exc}); "
                          "DRACO_GYM_STRICT_IMPORTS=1 makes this a failure, not a skip") from exc


def pytest_configure(config) -> None:
    if os.environ.get("DRACO_GYM_STRICT_IMPORTS") == "1":
        pytest.importorskip = _strict_importorskip
