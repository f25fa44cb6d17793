"""GRPO with step credit on RLlib: the only room of ``draco_gym`` that imports Ray.

    grpo.py        ``GRPO`` (the ``Algorithm``: one ``training_step`` is sample, score,
                   credit, update, sync) and ``GRPOConfig`` (its knobs: the run schema's)
    env_runner.py  the rollout actor: G episodes per task with its policy copy, scored there
    learner.py     the ``TorchLearner``: an optimizer step per minibatch, across learners
    module.py      the policy as an ``RLModule``: LoRA state only, for sync and checkpoints
    reporting.py   what a run shows and leaves: result metrics, progress lines,
                   metrics.jsonl, rollouts.jsonl, plots, W&B and MLflow
    session.py     the Ray session: a named cluster or a local one
    runs.py        whole runs from a ``RunConfig``: training through Tune, checkpoint rollouts

Importing this package imports nothing; each module imports Ray itself.
"""
