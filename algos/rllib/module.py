"""The policy as an RLlib ``RLModule``: a transformers causal LM with a PEFT LoRA adapter.

The base weights are loaded from a local directory by every process that needs the policy,
once per process (``lm.load_frozen_base``: the env runner and learner of one process share them),
and never move; the adapter is the whole trainable state, so ``get_state`` returns LoRA
tensors only, for weight sync and checkpoints alike (a 135M model's checkpoint is ~2 MB,
not 540 MB). The reference policy of the KL term is the same network with the adapter
switched off, so no second copy of the model is held.

Log-probs are computed only where the loss needs them: the backbone runs over the whole
sequence, but the vocabulary projection runs only on the hidden states that predict a
policy token. Prompts and observations are most of a multi-turn sequence, and the
[tokens x vocabulary] logits are the largest tensor of the step. Rows that share a prefix
(a group's prompt) can have it computed once (``encode_prefix``, ``draco_gym.algos.policy.prefix``).
"""

from __future__ import annotations

import torch
from ray.rllib.core.rl_module.torch import TorchRLModule

from draco_gym.algos.policy.iteration import LoRAPolicy
from draco_gym.algos.policy.lm import add_lora, enable_activation_checkpointing, load_frozen_base
from draco_gym.algos.policy.prefix import SharedPrefix


class HFPolicyModule(TorchRLModule):
    """``model_config`` keys: ``model`` (local directory), ``dtype``, ``lora`` (r, alpha,
    target_modules, dropout), ``seed``, ``temperature`` (the sampling temperature: the
    learner scores tokens under the same tempered distribution that drew them),
    ``gradient_checkpointing``, ``torch_threads`` (intra-op threads of this process)."""

    def setup(self) -> None:
        cfg = dict(self.model_config or {})
        if "model" not in cfg:
            raise ValueError("HFPolicyModule needs model_config['model'], a local model directory")
        self.temperature = float(cfg.get("temperature", 1.0))
        if cfg.get("torch_threads"):
            # Ray sets an actor's threads to its CPU reservation (a trial alone on the Ray
            # its command started reserves them all: runs.reserve_every_cpu). More threads
            # than the reservation can pay on an idle machine, where the actors' work takes
            # turns; on a busy one, more threads than free cores spin and run many times
            # slower (measured: 20x on 2 shared cores), hence opt-in.
            torch.set_num_threads(int(cfg["torch_threads"]))
        self.lm = add_lora(load_frozen_base(cfg["model"], cfg.get("dtype", "float32")), cfg.get("lora"), cfg.get("seed", 0))
        if cfg.get("gradient_checkpointing"):
            enable_activation_checkpointing(self.lm)
            # The learner's passes with gradient give a layer either no cache or a one-pass
            # cache (prefix.one_pass_cache), which a recomputed layer reads as the first time:
            # the cache that carries a shared prefix may stay under checkpointing.
            for m in self.lm.modules():
                if getattr(m, "gradient_checkpointing", False):
                    m._can_checkpoint_with_cache = True
        self.lm.eval()  # sampling's mode; a pass with gradient switches to training mode (LoRAPolicy)
        self.policy = LoRAPolicy(self.lm, self.temperature)

    # -- RLlib forward passes: the framework-neutral policy's (``policy.iteration.LoRAPolicy``) --

    def _forward_train(self, batch: dict, **kwargs) -> dict:
        return self.policy.forward_train(batch, **kwargs)

    def prefix_sharing(self) -> str | None:
        return self.policy.prefix_sharing()

    def encode_prefix(self, prefix_ids, *, reference: bool = False) -> SharedPrefix:
        return self.policy.encode_prefix(prefix_ids, reference=reference)

    def _forward(self, batch: dict, **kwargs) -> dict:
        raise NotImplementedError("the env runner samples with draco_gym.algos.policy.generation, not forward()")

    # -- state: the adapter only ------------------------------------------------------------

    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        return {k: v.detach().cpu() for k, v in self.state_dict().items() if "lora_" in k}

    def set_state(self, state: dict) -> None:
        own = self.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise KeyError(f"adapter state has {len(unknown)} tensors this model lacks, e.g. {unknown[:3]}")
        missing = [k for k in own if "lora_" in k and k not in state]
        if missing:
            raise KeyError(f"adapter state lacks {len(missing)} LoRA tensors, e.g. {missing[:3]}")
        self.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)

    def save_adapter(self, path: str) -> str:
        """The adapter in PEFT's own format (loadable with ``PeftModel.from_pretrained`` or
        vLLM's ``LoRARequest``)."""
        self.lm.save_pretrained(path)
        return path
