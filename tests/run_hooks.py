"""Hooks for the kill-and-resume tests (not a test module), installed where the trainer runs:
a run config lists this module under ``env.modules``, so the driver, the Tune trial and every
env runner import it (the test puts ``tests/`` on ``PYTHONPATH``, which Ray's processes inherit).

    DRACO_TEST_HOLD=checkpoint:K   the save of iteration K's checkpoint stops halfway (RLlib's
                                   files written, the adapter and the seal not yet) and waits
                                   to be killed
    DRACO_TEST_HOLD=iteration:K    the trainer stops before its iteration K + 1 (K done)
    DRACO_TEST_HOLD_FLAG=PATH      written when it stops there
    DRACO_TEST_RECORD=PATH         one JSON line per restore (the learner's weights digest
                                   after it) and per iteration (the digests the env runners
                                   sampled with)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from draco_gym.algos.rllib.env_runner import weights_digest
from draco_gym.algos.rllib.grpo import GRPO

HOLD = os.environ.get("DRACO_TEST_HOLD", "")
FLAG = os.environ.get("DRACO_TEST_HOLD_FLAG")
RECORD = os.environ.get("DRACO_TEST_RECORD")


def _hold(where: str) -> None:
    if HOLD and HOLD == where:
        Path(FLAG).write_text(where)
        time.sleep(3600)


def _record(**entry) -> None:
    if RECORD:
        with open(RECORD, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def learner_digest(algo) -> str:
    state = algo.learner_group.get_state(components="learner/rl_module", inference_only=True)
    return weights_digest(state["learner"]["rl_module"]["default_policy"])


def _install() -> None:
    export, restore, step = GRPO.export_adapter, GRPO.restore_from_path, GRPO.training_step

    def export_adapter(self, path):
        _hold(f"checkpoint:{self.iteration}")
        return export(self, path)

    def restore_from_path(self, path, *args, **kwargs):
        restore(self, path, *args, **kwargs)
        _record(event="restored", path=str(path), iteration=self.iteration, digest=learner_digest(self))

    def training_step(self):
        _hold(f"iteration:{self.iteration}")
        step(self)
        _record(event="sampled", iteration=self.iteration,
                digests=sorted({w["digest"] for w in self.sampled_weights.values()}))

    GRPO.export_adapter, GRPO.restore_from_path, GRPO.training_step = export_adapter, restore_from_path, training_step
    GRPO._run_hooks = True


# Only a process the test started with hooks asked for is patched. The test's own process
# imports this module too (its in-process ``main(["train", ...])`` calls read ``env.modules``),
# and a GRPO patched there would make every later Tune trial in the session pickle methods of
# a module Ray's workers cannot import.
if (HOLD or RECORD) and not getattr(GRPO, "_run_hooks", False):
    _install()
