"""The GRPO learner: RLlib's ``TorchLearner`` with gradient accumulation over micro-batches.

RLlib calls ``_update`` once per minibatch (one optimizer step). The minibatch's gradient is
the iteration's own step (``draco_gym.algos.policy.iteration.accumulate_gradients``:
micro-batch by micro-batch, each shared prefix computed once); RLlib's learner then clips it
(``grad_clip``, global norm) and AdamW steps once. Prefix sharing is on by default; the ``optim.share_prefix`` knob
(``.training(share_prefix=False)``) turns it off, and a model whose attention cannot take a
shared prefix falls back to the unshared path with a logged reason.

With ``num_learners > 1`` each remote learner gets its own rows of every minibatch
(``grpo.shard_rows``) and the learners form a torch.distributed group (gloo on CPU, NCCL on
GPU; Ray Train sets it up). The loss is normalized by the minibatch's policy tokens over all
learners and the gradients are summed with one all-reduce, so every learner takes the very
step one learner would take on the whole minibatch. The reduction is explicit rather than
torch's ``DistributedDataParallel`` hooks: learners run different numbers of micro-batches
and backward passes (shared prefixes, uneven rows), which DDP's per-backward bucketing
cannot pair up across ranks.
"""

from __future__ import annotations

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from draco_gym.algos.memory import release_freed_memory
from draco_gym.algos.policy import iteration


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
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.run.optim.weight_decay)
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params, lr_or_lr_schedule=config.lr)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        # RLlib's abstract hook, called only by the ``_update`` replaced below: the loss is
        # taken inside the iteration's gradient step (``iteration.accumulate_gradients``).
        raise NotImplementedError("GRPOTorchLearner takes its loss in draco_gym.algos.policy.iteration."
                                  "accumulate_gradients, called from _update")

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
            step = iteration.accumulate_gradients(self.module[module_id], mb, config.run.optim,
                                                  config.run.optim.micro_batch_tokens, config.run.optim.share_prefix,
                                                  n_tokens=total)
            losses[module_id], totals, n_tokens, fwd_last = step.loss, step.stats, step.policy_tokens, step.last_forward
            if world is not None:  # every learner logs the whole minibatch's loss and stats
                sums = [float(losses[module_id])] + [totals.get(k, 0.0) for k in iteration.STAT_KEYS]
                summed = _all_sum(world, torch.tensor(sums, dtype=torch.float64, device=self._device)).cpu()
                losses[module_id] = summed[0].float()
                totals = dict(zip(iteration.STAT_KEYS, summed[1:].tolist()))
            for k, v in totals.items():
                self.metrics.log_value((module_id, k), v, window=1)
            self.metrics.log_value((module_id, "policy_tokens"), n_tokens, reduce="sum")
        if world is not None and total > 0:  # (no policy token anywhere: no step, as with one learner)
            self._all_reduce_gradients(world)
        grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        if grads:
            self.apply_gradients(self.postprocess_gradients(grads))
        release_freed_memory()  # the step's activations, before the env runners' turn to peak
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
        optim = config.run.optim
        out = iteration.recompute_logprobs(module, tensors, optim.micro_batch_tokens, optim.share_prefix)
        return out.to(tensors["old_logp"].dtype).numpy()


def _all_sum(world, tensor: torch.Tensor) -> torch.Tensor:
    world.all_reduce(tensor)
    return tensor
