"""The skip mark of tests that need bubblewrap. CI (.ci/run) sets DRACO_GYM_REQUIRE_BWRAP=1:
there the boundary's tests run or fail, never skip."""

import os

import pytest

from draco_gym.envs import os_sandbox

needs_bwrap = pytest.mark.skipif(os_sandbox.bwrap_problem() is not None and not os.environ.get("DRACO_GYM_REQUIRE_BWRAP"),
                                 reason=f"bubblewrap cannot run here: {os_sandbox.bwrap_problem()}")
