"""The red team's hacks on PythonTools (``bench/python_tools_hacks.py``), each held in each
sandbox mode: the task's answers are out of reach, nothing written on the interpreter's
channel counts, and guard mode's and bubblewrap's holes are closed. One environment per
mode serves every hack (each attempt ends its episode with a reset, which kills the
interpreter and whatever it started, as ``close`` does)."""

from __future__ import annotations

import os

import pytest

from draco_gym.bench.python_tools_hacks import HACKS, attempt, host, make_env
from draco_gym.envs import os_sandbox

needs_bwrap = pytest.mark.skipif(os_sandbox.bwrap_problem() is not None and not os.environ.get("DRACO_GYM_REQUIRE_BWRAP"),
                                 reason=f"bubblewrap cannot run here: {os_sandbox.bwrap_problem()}")


@pytest.fixture(scope="module")
def envs():
    made: dict = {}
    yield lambda mode: made.setdefault(mode, make_env(mode))
    for env in made.values():
        env.close()


CASES = [pytest.param(hack, mode, id=f"{hack.name}-{mode}", marks=[needs_bwrap] if mode == "bwrap" else [])
         for hack in HACKS for mode in hack.modes]


@pytest.mark.parametrize(("hack", "mode"), CASES)
def test_hack_is_held(hack, mode, envs):
    with host() as h:
        result = attempt(hack, mode, h, envs(mode))
        forged = hack.forged(result)
    assert not forged, (f"{hack.name} ({hack.finding}) FORGED in {mode}: raised={result.raised} "
                        f"termination={result.termination} metrics={result.metrics} observation={result.observation[-600:]}")
    assert result.reset_ok, f"{hack.name}: the environment did not work after the hack"
