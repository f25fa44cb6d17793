"""The GRPO learner: RLlib's ``TorchLearner`` with gradient accumulation over micro-batches.

RLlib calls ``_update`` once per minibatch (one optimizer step). Multi-turn sequences are
long, so a minibatch is cut into micro-batches of at most ``micro_batch_tokens`` padded
tokens; each adds its share of the token-mean loss to the gradient, then the gradient is
clipped (``grad_clip``, global norm) and AdamW steps once. The result equals one pass over
the whole minibatch, at the memory cost of one micro-batch.
"""

from __future__ import annotations

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from draco_gym.algos.batch import micro_batches
from draco_gym.algos.config import LossConfig
from draco_gym.algos.loss import grpo_loss


def loss_config(config) -> LossConfig:
    return LossConfig(**{key: getattr(config, key) for key in LossConfig.model_fields})


class GRPOTorchLearner(TorchLearner):
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
        for module_id, mb in batch.items():
            config = self.config.get_config_for_module(module_id)
            module = self.module[module_id]
            cfg = loss_config(config)
            n_tokens = int(mb["policy_mask"][:, 1:].sum())
            totals: dict[str, float] = {}
            total_loss = torch.zeros(())
            for micro in micro_batches(mb, config.micro_batch_tokens):
                mask = micro["policy_mask"][:, 1:].bool()
                if not bool(mask.any()):
                    continue
                fwd = module.forward_train(micro, with_reference=cfg.kl_coeff > 0)
                loss, stats = grpo_loss(fwd["logp"], micro["old_logp"][:, 1:][mask], fwd.get("ref_logp"),
                                        micro["advantages"][:, 1:][mask], n_tokens, cfg)
                loss.backward()
                total_loss = total_loss + loss.detach()
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + float(v)
                fwd_last = fwd
            losses[module_id] = total_loss
            for k, v in totals.items():
                self.metrics.log_value((module_id, k), v, window=1)
            self.metrics.log_value((module_id, "policy_tokens"), n_tokens, reduce="sum")
        grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        if grads:
            self.apply_gradients(self.postprocess_gradients(grads))
        return fwd_last, losses, {}

    @torch.no_grad()
    def policy_logprobs(self, batch: dict, module_id: str):
        """log pi_theta of every policy token of ``batch`` (numpy arrays) under the current
        weights: the old log-probs when the sampler's own cannot be trusted (vLLM)."""
        module = self.module[module_id]
        tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
        out = torch.zeros_like(tensors["old_logp"])
        for i in range(len(out)):  # one row at a time: no padding, memory of one sequence
            one = {k: tensors[k][i : i + 1] for k in ("input_ids", "attention_mask", "policy_mask")}
            width = int(one["attention_mask"].sum())
            one = {k: v[:, :width] for k, v in one.items()}
            mask = one["policy_mask"][:, 1:].bool()
            if bool(mask.any()):
                lp = module.forward_train(one, with_reference=False)["logp"]
                target = out[i : i + 1, 1:width]
                target[mask] = lp.to(out.dtype)
        return out.numpy()
