"""``examples/one_iteration.py``, the whole algorithm on one screen without Ray, runs and
takes a real step: the training page points readers to it, so it must keep working."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "one_iteration.py"


def test_one_iteration_runs_and_moves_the_adapter(capsys):
    main = runpy.run_path(str(EXAMPLE))["main"]
    out = main(["--tasks", "2", "--group-size", "3", "--seed", "1"])
    assert out["episodes"] == 6 and out["policy_tokens"] > 0
    assert all(len(set(r)) == 3 for r in out["rewards"]), "the random baseline gives every rollout its own reward"
    # The sampler's log-probs are the learner's (same tokens, same temperature) and the
    # adapter starts at zero: before the step the ratio is 1 and the KL to the base 0.
    assert out["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert out["kl"] == pytest.approx(0.0, abs=1e-7)
    assert out["adapter_moved"] > 1e-4, "nonzero advantages must move the LoRA weights"
    assert "adapter_moved" in capsys.readouterr().out
