"""The GRPO learner: RLlib's ``TorchLearner`` with gradient accumulation over micro-batches.

RLlib calls ``_update`` once per minibatch (one optimizer step). Multi-turn sequences are
long, so a minibatch is cut into micro-batches of at most ``micro_batch_tokens`` padded
tokens; each adds its share of the token-mean loss to the gradient, then the gradient is
clipped (``grad_clip``, global norm) and AdamW steps once. The result equals one pass over
the whole minibatch, at the memory cost of one micro-batch.

Rows that begin with the same tokens (the G rollouts of a task share their prompt) share
their prefix (``draco_gym.algos.prefix``): it runs forward and backward once per group, for
the policy, the reference and the old-log-prob recomputation alike, and the micro-batches
hold only the continuations. On by default; the ``optim.share_prefix`` knob (``.training(share_prefix=False)``)
turns it off, and a model whose attention cannot take a shared prefix falls back to the
unshared path with a logged reason.

With ``num_learners > 1`` each remote learner gets its own rows of every minibatch
(``batch.shard_rows``) and the learners form a torch.distributed group (gloo on CPU, NCCL on
GPU; Ray Train sets it up). The loss is normalized by the minibatch's policy tokens over all
learners and the gradients are summed with one all-reduce, so every learner takes the very
step one learner would take on the whole minibatch. The reduction is explicit rather than
torch's ``DistributedDataParallel`` hooks: learners run different numbers of micro-batches
and backward passes (shared prefixes, uneven rows), which DDP's per-backward bucketing
cannot pair up across ranks.
"""

from __future__ import annotations

import logging

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from draco_gym.algos.batch import prefix_micro_batches
from draco_gym.algos.config import LossConfig
from draco_gym.algos.loss import grpo_loss

logger = logging.getLogger(__name__)


def loss_config(config) -> LossConfig:
    return LossConfig(**{key: getattr(config, key) for key in LossConfig.model_fields})


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


STAT_KEYS = ("policy_loss", "kl", "ratio", "clip_fraction")


def _world():
    """The torch.distributed group of the remote learners, or None for a single learner."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


class GRPOTorchLearner(TorchLearner):
    def _make_modules_ddp_if_necessary(self) -> None:
        # No DDP wrapper: ``_update`` reduces the gradients itself (see the module docstring),
        # and the policy module keeps its own methods (prefix encoding, adapters).
        pass

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        # Only the adapter trains; RLlib's default would hand every base weight to the optimizer.
        params = [p for p in self._module[module_id].parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params, lr_or_lr_schedule=config.lr)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        """The loss of one (micro-)batch on its own, token-mean over its policy tokens."""
        mask = batch["policy_mask"][:, 1:].bool()
        loss, _ = grpo_loss(fwd_out["logp"], batch["old_logp"][:, 1:][mask], fwd_out.get("ref_logp"),
                            batch["advantages"][:, 1:][mask], int(mask.sum()), loss_config(config))
        return loss

    def _update(self, batch, **kwargs):
        """One optimizer step on one minibatch, accumulated over micro-batches."""
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        losses, fwd_last = {}, {}
        world = _world()
        for module_id, mb in batch.items():
            config = self.config.get_config_for_module(module_id)
            own = int(mb["policy_mask"][:, 1:].sum())
            # (on the learner's device: NCCL reduces only GPU tensors)
            total = own if world is None else int(_all_sum(world, torch.tensor([own], dtype=torch.float64,
                                                                               device=self._device))[0])
            losses[module_id], totals, n_tokens, fwd_last = accumulate_gradients(
                self.module[module_id], mb, loss_config(config), config.micro_batch_tokens,
                config.share_prefix, n_tokens=total)
            if world is not None:  # every learner logs the whole minibatch's loss and stats
                summed = _all_sum(world, torch.tensor([float(losses[module_id])] + [totals.get(k, 0.0) for k in STAT_KEYS],
                                                      dtype=torch.float64, device=self._device)).cpu()
                losses[module_id] = summed[0].float()
                totals = dict(zip(STAT_KEYS, summed[1:].tolist()))
            for k, v in totals.items():
                self.metrics.log_value((module_id, k), v, window=1)
            self.metrics.log_value((module_id, "policy_tokens"), n_tokens, reduce="sum")
        if world is not None and total > 0:  # (no policy token anywhere: no step, as with one learner)
            self._all_reduce_gradients(world)
        grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        if grads:
            self.apply_gradients(self.postprocess_gradients(grads))
        return fwd_last, losses, {}

    def _all_reduce_gradients(self, world) -> None:
        """Sum every trained parameter's gradient over the learners, in one flat all-reduce
        (a learner whose shard had no policy token contributes zeros)."""
        params = [p for p in self._params.values() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        world.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def policy_logprobs(self, batch: dict, module_id: str):
        """log pi_theta of every policy token of ``batch`` (numpy arrays) under the current
        weights: the old log-probs when the sampler's own cannot be trusted (vLLM)."""
        module = self.module[module_id]
        config = self.config.get_config_for_module(module_id)
        device = next(module.parameters()).device
        tensors = {k: torch.as_tensor(v).to(device) for k, v in batch.items()}
        out = recompute_logprobs(module, tensors, config.micro_batch_tokens, config.share_prefix)
        return out.to(tensors["old_logp"].dtype).numpy()


def _all_sum(world, tensor: torch.Tensor) -> torch.Tensor:
    world.all_reduce(tensor)
    return tensor
