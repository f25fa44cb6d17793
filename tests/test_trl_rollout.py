"""TRL's own GRPOTrainer runs multi-turn draco-gym episodes (code executed every turn) through
``EnvRollout`` as its ``rollout_func``, scored by a draco-gym reward: one real optimizer step
on CPU, on the Corridor with a tiny policy that writes well-formed blocks with doors at chance
(so the group rewards differ). Slow: building the policy and TRL's trainer take a minute or
more on a busy 2-core machine; the step itself a few seconds."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from draco_gym.bench.learning_setting import ENV_CONFIG, ENV_ID, build_corridor_policy  # noqa: E402
from draco_gym.algos.trl import EnvRollout, task_dataset  # noqa: E402
from draco_gym.reward import TRLReward, build_reward  # noqa: E402
from draco_gym.types import GAP  # noqa: E402


@pytest.fixture(scope="module")
def corridor_policy(tmp_path_factory):
    return build_corridor_policy(tmp_path_factory.mktemp("corridor_policy"))


def trl_trainer(model_dir, out, trainer_cls=None, **kwargs):
    import os

    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    rollout = EnvRollout(ENV_ID, ENV_CONFIG, max_new_tokens=8, max_prompt_tokens=512, max_response_tokens=400)
    reward = TRLReward(build_reward("corridor"), num_generations=8)
    args = GRPOConfig(output_dir=str(out), num_generations=8, per_device_train_batch_size=8, max_steps=1,
                      learning_rate=5e-2, beta=0.0, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                      seed=0, temperature=1.0)
    trainer = (trainer_cls or GRPOTrainer)(model=str(model_dir), reward_funcs=reward, rollout_func=rollout,
                                           train_dataset=task_dataset(rollout.task_ids, repeat=4), args=args, **kwargs)
    return trainer, rollout, reward


@pytest.mark.slow
def test_trl_grpo_step_on_multi_turn_episodes(corridor_policy, tmp_path):
    trainer, rollout, reward = trl_trainer(corridor_policy, tmp_path)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()

    trajs = rollout.last_trajectories
    assert len(trajs) == 8
    # whole episodes: several turns, code ran in the env every turn
    assert min(len(t.steps) for t in trajs) >= 2
    assert all(s.code and "open_door" in s.code for t in trajs for s in t.steps)
    assert all("Room " in s.observation or "TrapError" in s.observation for t in trajs for s in t.steps[:-1])
    # the reward scored those trajectories, one group per task, with spread
    (members, score), = reward.last_groups
    assert members == trajs
    assert max(score.rewards) > min(score.rewards)
    logged = trainer.state.log_history[0]
    assert logged["reward_std"] > 0
    # observations are the env's tokens (env_mask 0), so TRL counts only the model's tokens
    model_tokens = [sum(s != GAP for s in t.token_step) for t in trajs]
    assert logged["completions/mean_length"] == pytest.approx(sum(model_tokens) / len(model_tokens))
    changed = [k for k, v in trainer.model.named_parameters() if not torch.equal(v, before[k])]
    assert changed, "the optimizer step changed no weight"


@pytest.mark.slow
def test_draco_credit_reaches_trls_loss_per_token(corridor_policy, tmp_path):
    from draco_gym.algos.trl import DracoCreditGRPOTrainer

    trainer, rollout, reward = trl_trainer(corridor_policy, tmp_path, trainer_cls=DracoCreditGRPOTrainer)
    trainer.train()
    trajs, rows = rollout.last_trajectories, trainer.last_token_advantages
    (members, score), = reward.last_groups
    rewards = torch.tensor(score.rewards)
    A = ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).tolist()  # TRL's group advantage
    moved = 0
    for traj, row, a_i in zip(trajs, rows, A):
        steps = _completion_steps(traj, len(row))
        own = [a for a, s in zip(row, steps) if s != GAP]
        # DRACO keeps each trajectory's total push: the model's tokens sum to A_i x N
        assert sum(own) == pytest.approx(a_i * len(own), abs=1e-4)
        assert all(a == 0 for a, s in zip(row, steps) if s == GAP)  # observations and padding
        moved += len({round(a, 6) for a in own}) > 1
    assert moved > 0, "DRACO credit moved no advantage between steps"
    # TRL's own log shows it: the share of the model's tokens whose advantage is not A_i
    changed = sum(abs(a - a_i) > 1e-6 * max(1.0, abs(a_i))
                  for traj, row, a_i in zip(trajs, rows, A)
                  for a, s in zip(row, _completion_steps(traj, len(row))) if s != GAP)
    tokens = sum(s != GAP for t in trajs for s in t.token_step)
    logged = trainer.state.log_history[0]
    assert logged["credit/changed_token_share"] == pytest.approx(changed / tokens, abs=1e-6)
    assert 0 < logged["credit/changed_token_share"] and logged["credit/step_advantage_spread"] > 0


def _completion_steps(traj, width):
    first = next(t for t, s in enumerate(traj.token_step) if s != GAP)
    steps = traj.token_step[first:]
    return steps + [GAP] * (width - len(steps))


def docs_trl_snippet() -> str:
    import re
    from pathlib import Path

    section = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text().split("**In TRL**", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_docs_trl_snippet_runs_on_cpu_and_logs_the_credit(corridor_policy, tmp_path):
    """The training page's TRL snippet as written, but for the model (the tiny Corridor policy)."""
    import json
    import subprocess
    import sys

    code = docs_trl_snippet()
    assert 'resolve_model("smollm2-135m-instruct")' in code and "use_cpu=True" in code
    code = code.replace('resolve_model("smollm2-135m-instruct")', repr(str(corridor_policy)))
    code += "\nimport json\nprint('LOG ' + json.dumps(trainer.state.log_history))\n"
    (tmp_path / "trl_run.py").write_text(code)
    done = subprocess.run([sys.executable, "trl_run.py"], cwd=tmp_path, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("LOG ")]
    steps = [row for row in json.loads(line[4:]) if "loss" in row]
    assert steps and all("credit/changed_token_share" in row and "credit/step_advantage_spread" in row
                         for row in steps)
