"""The trace, trca and prover credit rules inside the real RLlib trainer (slow): one iteration each of TRCA and
TRACE on PythonTools with a tiny random Llama, and ProVer's continuations run from a restored
PythonTools prefix on a real env runner actor and on the trainer's own runner."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from draco_gym.algos.rllib.grpo import GRPOConfig  # noqa: E402

pytestmark = pytest.mark.slow


def config(model, credit, **options) -> GRPOConfig:
    return (
        GRPOConfig()
        .environment("draco_gym/PythonTools-v0", env_config={"max_turns": 3})
        .policy(model=str(model), lora={"r": 4, "alpha": 8})
        .training(group_size=2, tasks_per_iteration=1, max_new_tokens=8, max_response_tokens=120,
                  reward="outcome" if credit in ("trace", "prover") else "rule",  # their papers' base advantage
                  credit=credit, credit_options=options, micro_batch_tokens=400)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=3, log_level="ERROR")
    )


@pytest.mark.parametrize("credit", ["trca", "trace"])
def test_one_iteration(ray_session, tiny_model, credit):
    algo = config(tiny_model, credit).build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_episodes"] == 2
    finally:
        algo.stop()


@pytest.mark.parametrize("runners", [1, 0], ids=["remote runner", "the trainer's own"])
def test_prover_continuations_on_the_env_runner(ray_session, tiny_model, runners):
    algo = config(tiny_model, "prover", judge=lambda messages: '{"start": 1, "end": 1}').env_runners(
        num_env_runners=runners).build_algo()
    try:
        continue_fn = algo.credit_options()["continue_fn"]
        # replay one real step of a PythonTools task, then let the (random) policy finish twice
        outcomes = continue_fn("order-count-1", ["```python\nc = find_customer('Ada Park')\nprint(c)\n```"], 2)
        assert outcomes == [0.0, 0.0]  # a random policy does not submit the right count
    finally:
        algo.stop()
