"""One minibatch's gradient, micro-batch by micro-batch, through shared prefixes.

Multi-turn sequences are long, so a minibatch is cut into micro-batches of at most
``micro_batch_tokens`` padded tokens; each adds its share of the token-mean loss to
``.grad``. Rows that begin with the same tokens (the G rollouts of a task share their
prompt) share their prefix (``policy.prefix``): it runs forward and backward once per group,
for the policy, the reference and the old-log-prob recomputation alike, and the
micro-batches hold only the continuations. The result equals one pass over the whole
minibatch, at the memory cost of one micro-batch.

``module`` is the policy as the learner holds it: ``forward_train(batch, with_reference=,
prefix=, ref_prefix=)`` returning ``logp`` (and ``ref_logp``), ``encode_prefix(ids,
reference=)`` and ``prefix_sharing()`` (None, or why the model cannot share a prefix);
``rllib.module.HFPolicyModule`` is one. The optimizer step is the caller's.
"""

from __future__ import annotations

import logging

import torch

from draco_gym.algos.config import LossConfig
from draco_gym.algos.policy.batch import prefix_micro_batches
from draco_gym.algos.policy.loss import grpo_loss

logger = logging.getLogger(__name__)

# The loss statistics ``accumulate_gradients`` sums (``grpo_loss``'s).
STAT_KEYS = ("policy_loss", "kl", "ratio", "ratio_abs_dev", "clip_fraction")


def use_prefix_sharing(module, wanted: bool = True) -> bool:
    """Whether to share prefixes with this module; a model that cannot says why, once."""
    if not wanted:
        return False
    reason = module.prefix_sharing()
    if reason is not None and not getattr(module, "_sharing_reason_logged", False):
        logger.warning("prefix sharing off, every row computes its whole prompt: %s", reason)
        module._sharing_reason_logged = True
    return reason is None


def accumulate_gradients(module, batch: dict, cfg: LossConfig, micro_batch_tokens: int, share_prefix: bool = True,
                         n_tokens: int | None = None):
    """Forward and backward over one minibatch (tensors [rows, width]), micro-batch by
    micro-batch, accumulating the gradient of the minibatch's token-mean loss in ``.grad``.
    ``n_tokens`` is the mean's denominator (default: this batch's policy tokens; a learner
    holding one shard passes the whole minibatch's). Returns (loss, stat sums, policy
    tokens of this batch, the last micro-batch's forward output)."""
    own_tokens = int(batch["policy_mask"][:, 1:].sum())
    n_tokens = own_tokens if n_tokens is None else n_tokens
    with_reference = cfg.kl_coeff > 0
    total_loss, totals, fwd_last = torch.zeros(()), {}, {}
    for unit in prefix_micro_batches(batch, micro_batch_tokens, use_prefix_sharing(module, share_prefix)):
        if not any(bool(m["policy_mask"][:, 1:].any()) for m in unit.micro):
            continue
        prefix = ref_prefix = None
        if unit.prefix is not None:
            prefix = module.encode_prefix(unit.prefix)
            ref_prefix = module.encode_prefix(unit.prefix, reference=True) if with_reference else None
        for micro in unit.micro:
            mask = micro["policy_mask"][:, 1:].bool()
            if not bool(mask.any()):
                continue
            fwd = module.forward_train(micro, with_reference=with_reference, prefix=prefix, ref_prefix=ref_prefix)
            loss, stats = grpo_loss(fwd["logp"], micro["old_logp"][:, 1:][mask], fwd.get("ref_logp"),
                                    micro["advantages"][:, 1:][mask], n_tokens, cfg)
            loss.backward()
            total_loss = total_loss + loss.detach().cpu()
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + float(v)
            fwd_last = fwd
        if prefix is not None:
            prefix.backward()
    return total_loss, totals, own_tokens, fwd_last


@torch.no_grad()
def recompute_logprobs(module, batch: dict, micro_batch_tokens: int, share_prefix: bool = True):
    """log pi_theta of every policy token of ``batch`` (tensors [rows, width]) under the
    current weights, in a [rows, width] tensor like ``old_logp`` (0 elsewhere)."""
    out = torch.zeros(batch["old_logp"].shape, dtype=torch.float32)
    for unit in prefix_micro_batches(batch, micro_batch_tokens, use_prefix_sharing(module, share_prefix)):
        prefix = module.encode_prefix(unit.prefix) if unit.prefix is not None else None
        for rows, micro in zip(unit.rows, unit.micro):
            mask = micro["policy_mask"][:, 1:].bool()
            if not bool(mask.any()):
                continue
            lp = module.forward_train(micro, with_reference=False, prefix=prefix)["logp"]
            width = micro["input_ids"].shape[1]
            block = out[rows, 1:width]
            block[mask.cpu()] = lp.float().cpu()
            out[rows, 1:width] = block
    return out
