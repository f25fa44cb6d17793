"""The commands of the training layer (``draco_gym/cli.py`` dispatches to them by name).

    train.py         ``draco-gym train CONFIG`` (``--check``, ``--resume``, ``--before-after``)
    eval.py          ``draco-gym eval CONFIG --checkpoint ...``: success, pass@k, pass^k
    sft.py           ``draco-gym sft CONFIG``: a LoRA warm start on reference solutions
    demo.py          ``draco-gym demo``: one scripted group scored and credited, no model
    setup_model.py   ``draco-gym setup model``: the quickstart policy's weights
    before_after.py  the held-out evaluation ``train --before-after`` runs around training
    prepare.py       the model and environment prepared before Ray starts

The commands talk (messages, exit codes); what touches Ray is in ``algos/rllib``.
"""
