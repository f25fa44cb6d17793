"""The causal LM behind the policy: loaded with every dropout off, wrapped in its LoRA
adapter, taken apart into backbone and vocabulary head, and scored token by token.

The learner (RLlib's, TRL's or a plain loop's), the sampler and prefix sharing all call
these; none of them needs Ray. torch and transformers are imported when a function runs,
so importing this module (through ``prefix``, ``batch``, ``tokens``) stays light.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any


def decoder_and_head(lm):
    """(backbone, vocabulary projection) of a causal LM, PEFT-wrapped or not; (None, None)
    for a model without a separable head."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    backbone = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if backbone is None or head is None:
        return None, None
    return backbone, head


def cache_argument(model) -> str:
    """The name of a forward's KV-cache argument: transformers 5.x renamed
    ``past_key_values`` to ``cache``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def load_causal_lm(path: str, dtype: str = "float32"):
    """The base model with every dropout off: with dropout the ratio is not 1 and the KL
    not 0 on the very first update, and the sampled log-probs are not the trained ones."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
            setattr(config, name, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=getattr(torch, dtype))
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


# The frozen base weights this process holds, by (directory, dtype, parameter name): alive as
# long as a model holding them is.
_FROZEN_WEIGHTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def load_frozen_base(path: str, dtype: str = "float32"):
    """``load_causal_lm`` for a policy whose base weights never change (LoRA trains the
    adapter only): where this process already holds the same weights (another policy module
    loaded from the same directory in the same dtype), the new model's parameters are those
    very tensors. With ``num_env_runners: 0`` the trainer's process builds two policy modules,
    the env runner's and the learner's. A file already in the policy's dtype is mapped by
    transformers, so its pages are one copy anyway; a load that converts (a bfloat16
    checkpoint trained in float32, or the reverse) holds a converted copy per load, which this
    avoids (SmolLM2-135M to bfloat16: a second module adds 27 MiB instead of 257). Never for a
    model whose base is merged into or trained: every holder would see the change."""
    import os

    model = load_causal_lm(path, dtype)
    key = (os.path.realpath(path), dtype)
    shared = False
    for name, param in model.named_parameters(remove_duplicate=False):
        held = _FROZEN_WEIGHTS.get((*key, name))
        if held is not None and held.shape == param.shape and held.dtype == param.dtype:
            param.data = held.data
            shared = True
        else:
            _FROZEN_WEIGHTS[(*key, name)] = param
    if shared:
        from draco_gym.algos.memory import release_freed_memory

        release_freed_memory()  # the copy just loaded, now unreferenced
    return model


def add_lora(model, lora: dict[str, Any], seed: int = 0):
    """Wrap ``model`` with a LoRA adapter. Seeded, so every copy starts from the same A."""
    import torch
    from peft import LoraConfig, get_peft_model

    from draco_gym.algos.config import LoraSection

    opts = LoraSection(**(lora or {}))
    torch.manual_seed(seed)
    return get_peft_model(
        model,
        LoraConfig(r=opts.r, lora_alpha=opts.alpha, target_modules=opts.target_modules,
                   lora_dropout=opts.dropout, bias="none", task_type="CAUSAL_LM"),
    )


def enable_activation_checkpointing(lm) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them: one
    more forward per step for activation memory that no longer grows with the tokens of a
    micro-batch (~2 MB per token for SmolLM2-135M in fp32 with LoRA on every linear layer).
    The gradient is the plain one (tests/test_prefix.py)."""
    if hasattr(lm, "activation_checkpointing_enable"):  # the name in newer transformers
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.enable_input_require_grads()


# Policy tokens whose logits exist at once: [chunk x vocabulary] floats (SmolLM2's 49,152-word
# vocabulary: 48 MiB per copy at 256 tokens), whatever the micro-batch's size.
LOGPROB_CHUNK_TOKENS = 256


def token_logprobs(lm, input_ids, attention_mask, policy_mask, temperature: float = 1.0, prefix=None,
                   chunk_tokens: int = LOGPROB_CHUNK_TOKENS):
    """log pi(y_t | y_<t) for every position with ``policy_mask[:, t]`` (t >= 1), flattened
    in row-major order. Runs the vocabulary projection on those positions only, ``chunk_tokens``
    at a time (``chosen_logprobs``). With a ``prefix`` (``SharedPrefix``), every row begins with
    it and only the rows' continuations run through the backbone."""
    import torch

    targets = policy_mask[:, 1:].bool()
    chosen = input_ids[:, 1:][targets]
    backbone, head = decoder_and_head(lm)
    if prefix is not None:
        hidden = prefix.row_hidden(input_ids, attention_mask)
        return chosen_logprobs(hidden[:, :-1][targets], prefix.head, chosen, temperature, chunk_tokens)
    if backbone is not None:
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return chosen_logprobs(hidden[:, :-1][targets], head, chosen, temperature, chunk_tokens)
    # a model without a separable head: its full logits, then the same log-softmax
    logits = lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1][targets]
    return chosen_logprobs(logits, torch.nn.Identity(), chosen, temperature, chunk_tokens)


def chosen_logprobs(hidden, head, chosen, temperature: float = 1.0, chunk_tokens: int = LOGPROB_CHUNK_TOKENS):
    """log softmax(head(hidden) / T)[chosen] for rows of ``hidden`` [n, width] (T <= 0: the
    untempered softmax, as the sampler's greedy mode), ``chunk_tokens`` rows at a time.

    The vocabulary projection is the largest tensor of a training step: [n x vocabulary]
    floats, kept for the backward and as large again in its gradient. Here at most one
    chunk's logits exist at a time. Without gradient, each chunk's are dropped once its
    log-probs are taken. With gradient through a frozen linear head (LoRA leaves it frozen),
    each chunk's gradient with respect to its hidden rows is taken while its logits exist
    (``_FrozenHeadLogprobs``): no logits are kept and none recomputed. Any other head (one
    with trainable weights) runs each chunk under activation checkpointing, which keeps the
    chunk's ``hidden`` rows and recomputes its logits in the backward."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    params = list(head.parameters())
    if not (torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in params))):
        with torch.no_grad():
            return _chunked(hidden, head, chosen, temperature, chunk_tokens)
    if type(head) is torch.nn.Linear and not any(p.requires_grad for p in params):
        return _FrozenHeadLogprobs.apply(hidden, head, chosen, temperature, chunk_tokens)
    parts = [checkpoint(_chunk_logprobs, hidden[i : i + chunk_tokens], head, chosen[i : i + chunk_tokens],
                        temperature, use_reentrant=False)
             for i in range(0, hidden.shape[0], chunk_tokens)]
    return torch.cat(parts) if parts else hidden.new_zeros((0,), dtype=torch.float32)


def _tempered_logits(h, head, temperature: float):
    logits = head(h).float()
    return logits / temperature if temperature > 0 else logits


def _chunk_logprobs(h, head, y, temperature: float):
    import torch

    logits = _tempered_logits(h, head, temperature)
    return logits.gather(-1, y[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _chunked(hidden, head, chosen, temperature: float, chunk_tokens: int):
    import torch

    parts = [_chunk_logprobs(hidden[i : i + chunk_tokens], head, chosen[i : i + chunk_tokens], temperature)
             for i in range(0, hidden.shape[0], chunk_tokens)]
    return torch.cat(parts) if parts else hidden.new_zeros((0,), dtype=torch.float32)


def _frozen_head_function():
    import torch

    class FrozenHeadLogprobs(torch.autograd.Function):
        """log p_t = (h_t W^T / T)[y_t] - logsumexp(h_t W^T / T), with W frozen. Its gradient
        with respect to h_t is (W[y_t] - softmax_t W) / T, a [width] vector known as soon
        as the chunk's softmax is: the forward keeps that ([n x width], the size of the
        hidden rows) instead of the [n x vocabulary] logits, and the backward scales it by
        the incoming gradient. The softmax-times-W matmul is the one a plain backward runs,
        so the FLOPs are those of the unchunked expression."""

        @staticmethod
        def forward(ctx, hidden, head, chosen, temperature, chunk_tokens):
            weight = head.weight
            scale = 1.0 / temperature if temperature > 0 else 1.0
            logps, grads = [], []
            for i in range(0, hidden.shape[0], chunk_tokens):
                h, y = hidden[i : i + chunk_tokens], chosen[i : i + chunk_tokens]
                logits = _tempered_logits(h, head, temperature)
                lse = torch.logsumexp(logits, dim=-1)
                logps.append(logits.gather(-1, y[:, None]).squeeze(-1) - lse)
                probs = logits.sub_(lse[:, None]).exp_()  # the logits' own memory becomes the softmax
                grads.append((weight[y].float() - (probs.to(weight.dtype) @ weight).float()) * scale)
                del logits, probs
            ctx.save_for_backward(torch.cat(grads) if grads else hidden.new_zeros((0, hidden.shape[1])))
            ctx.hidden_dtype = hidden.dtype
            return torch.cat(logps) if logps else hidden.new_zeros((0,), dtype=torch.float32)

        @staticmethod
        def backward(ctx, grad_logp):
            (d_hidden,) = ctx.saved_tensors
            return (grad_logp[:, None] * d_hidden).to(ctx.hidden_dtype), None, None, None, None

    return FrozenHeadLogprobs


class _LazyFunction:
    """The autograd function, built on first use: importing this module does not import torch."""

    def __init__(self, build) -> None:
        self.build, self.function = build, None

    def apply(self, *args):
        if self.function is None:
            self.function = self.build()
        return self.function.apply(*args)


_FrozenHeadLogprobs = _LazyFunction(_frozen_head_function)
