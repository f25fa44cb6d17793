"""The performance benches' own arithmetic, on worked numbers: bench/vs_trl.py's per-iteration
figures and its command for draco-gym's run, bench/learner.py's counting of the path's
parameters. The benches themselves run through ``heavy`` (see their docstrings); the small
comparison is the slow test at the end."""

from __future__ import annotations

import sys

import pytest

from draco_gym.bench import vs_trl


def test_wall_is_the_median_of_iterations_after_the_first_and_rates_use_the_same_iterations():
    run = {"wall": [90.0, 30.0, 50.0, 40.0], "rollout_s": [40.0, 10.0, 20.0, 10.0],
           "generated_tokens": [999, 600, 800, 1000]}
    f = vs_trl.per_iteration(run)
    assert f["wall"] == 40.0  # median of 30, 50, 40: the first iteration's start-up left out
    assert f["generated_per_s"] == pytest.approx(2400 / 40)
    assert f["trained_per_s"] == pytest.approx(2400 / 120)


def test_mean_and_its_interval():
    mean, half = vs_trl.mean_ci([0.0, 1.0, 1.0, 0.0])
    assert mean == 0.5
    assert half == pytest.approx(1.96 * 0.5 / 2)
    assert vs_trl.mean_ci([]) == (0.0, 0.0)


def test_small_is_two_iterations_of_the_uniform_pair_and_one_iteration_is_refused(capsys):
    args = vs_trl.parse(["--small"])
    assert (args.iterations, args.pairs) == (2, ["uniform"])
    with pytest.raises(SystemExit):
        vs_trl.parse(["--iterations", "1"])


def test_draco_gym_runs_the_configs_grpo_phase_from_the_warm_start(tmp_path):
    args = vs_trl.parse(["--config", "configs/quickstart.yaml", "--iterations", "3"])
    uniform = vs_trl.draco_gym_command(args, "uniform", "/models/warm", tmp_path)
    assert uniform[1:3] == ["train", "configs/quickstart.yaml"]
    sets = [uniform[i + 1] for i, a in enumerate(uniform) if a == "--set"]
    assert sets == ["rollout.dynamic_sampling_rounds=0", "policy.model=/models/warm", "warm_start.epochs=0",
                    "credit.name=uniform"]
    assert uniform[uniform.index("--iterations") + 1] == "3"
    draco = vs_trl.draco_gym_command(args, "draco", "/models/warm", tmp_path)
    assert "credit.name=draco" in draco  # the config's own credit
    args = vs_trl.parse(["--set", "optim.micro_batch_tokens=512"])
    command = vs_trl.draco_gym_command(args, "uniform", "/m", tmp_path)
    assert [command[i + 1] for i, a in enumerate(command) if a == "--set"][1] == "optim.micro_batch_tokens=512"


def test_learner_counts_the_decoders_linear_weights():
    torch = pytest.importorskip("torch")
    from draco_gym.bench.learner import linear_shapes

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 4, bias=False)
            self.up = torch.nn.ModuleList([torch.nn.Linear(8, 16, bias=False) for _ in range(2)])

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.lm_head = Decoder(), torch.nn.Linear(8, 50, bias=False)

        def get_decoder(self):
            return self.model

        def get_output_embeddings(self):
            return self.lm_head

    assert linear_shapes(LM()) == {(8, 8): 1, (8, 4): 1, (8, 16): 2}  # the head is counted on its own


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_small_comparison_runs_and_ends_with_the_ratio(tmp_path):
    """Both trainers, 2 iterations each, from the quickstart's warm start: the warm start
    (~75 s), then per trainer its start-up and two iterations of the quickstart's multi-step
    episodes (~130 s each on 2 quiet cores): ~12 minutes quiet, more on a busy machine, so it
    has a timeout of its own above the suite's 600 s."""
    import subprocess

    out = subprocess.run([sys.executable, "bench/vs_trl.py", "--small", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("draco-gym / TRL: wall ") and ", memory " in last
