"""The policy without a trainer framework: what the RLlib trainer, TRL's trainer and a plain
PyTorch loop share. Nothing here imports Ray.

    iteration.py   one iteration, step by step: score -> credit -> token batch -> update
                   (the calls every trainer makes after sampling)
    chat.py        the conversation as token chunks in the model's own chat template
    generation.py  samplers: many prompts in, one continuation with log-probs each out
                   (``TorchSampler`` with a KV-cached session; vLLM's engine host, ``vllm_host``, and its environment, ``vllm_runtime``)
    rollout.py     the multi-turn loop: many episodes in lockstep, one sampling call a turn
    tokens.py      token bookkeeping for trajectories from your own loop
    prefix.py      prefix sharing: a group's common prompt computed once; the learner's
                   micro-batches by shared prefix
    lm.py          the causal LM: loading (dropout off), LoRA, backbone and head, log-probs
    loss.py        the GRPO loss, on one screen
    models.py      where weights come from: a local directory, the SmolLM2 alias, a tiny
                   random model for tests
    sft.py         the supervised warm start on demonstrations
    self_judge.py  the policy judging its own rollouts (``judge: policy``)

torch and transformers are imported where they are used, so ``tokens`` and ``prefix``
import without them.
"""
