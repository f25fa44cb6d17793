"""Training: credit rules, the run schema, the policy code, and the trainers built on it.

Rooms, by what they import (each imports only the ones above it; ``tests/test_import_graph.py``
checks there is no cycle and that only ``rllib/`` imports Ray):

    config.py      the run schema: every knob with its default, bound and meaning, the YAML
                   loader (pydantic and yaml only; ``python -m draco_gym.algos.config``)
    evaluation.py  evaluation statistics: rates with 95% intervals, pass@k, pass^k
    memory.py      peak memory of a run's process tree (PSS), sampled while it runs
    checkpoints.py checkpoints a resume can trust: written aside, sealed, then renamed
    run_folder.py  a run's output folder, and how a resumed run continues its logs
    credit/        credit rules: a group's verdicts -> per-step advantages (numpy only)
    policy/        the policy without a trainer framework (torch, transformers, peft): chat
                   layout, samplers, the multi-turn rollout loop, token batches, prefix
                   sharing, the GRPO loss and its gradient, model loading and LoRA, the
                   supervised warm start, the policy as its own judge
    rllib/         the RLlib trainer, the only room that imports Ray: ``GRPO`` and
                   ``GRPOConfig``, the env runner, learner and RL module, result reporting,
                   the Ray session, whole runs through Tune
    trl.py         the same rollouts and credit inside TRL's ``GRPOTrainer``
    cli/           the commands: ``draco-gym train``, ``eval``, ``sft``, ``demo``, ``setup model``, ``setup vllm``

Where to start: ``rllib/grpo.py`` (``GRPO.training_step`` is one iteration: sample, score,
credit, update, sync), then ``policy/rollout.py`` (the episodes) and ``policy/loss.py`` (the
loss). The Corridor setting of the learning test and bench is ``bench/learning_setting.py``.
"""
