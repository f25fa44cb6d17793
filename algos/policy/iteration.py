"""One GRPO iteration with step credit, the same calls whichever trainer runs it:

    groups   = <sample>                        G episodes per task (the trainer's: env runners, rollout_func, run_episodes)
    groups   = score(groups, reward)           one reward call per group: rewards and the verdicts' cited steps
    credited = credit(groups, rule)            A_i per rollout, a_j per step, a_j on step j's tokens (credit/apply.py)
    batch    = to_batch(credited, pad_id)      one right-padded row per trajectory the loss takes
    stats    = update(policy, batch, optimizer, loss_cfg)   grpo_loss per micro-batch, backward, clip, step

Sampling is the trainer's own (RLlib samples on env runners, TRL in its ``rollout_func``,
``examples/one_iteration.py`` with ``rollout.run_episodes``). After it, each trainer calls
these steps: the RLlib env runners ``score``, its ``training_step`` ``credit``, its
``update`` ``to_batch`` and its learner ``accumulate_gradients`` (RLlib's learner owns the
optimizer: it all-reduces the gradient over learners, clips and steps itself); TRL's
``DracoCreditGRPOTrainer`` ``credit`` (TRL's reward function scores, TRL's loss updates).
``update`` is ``accumulate_gradients`` plus the clip and the optimizer step, for a loop that
owns its optimizer.

The gradient is accumulated micro-batch by micro-batch: a multi-turn minibatch is cut into
micro-batches of at most ``micro_batch_tokens`` padded tokens, each adding its share of the
token-mean loss to ``.grad``. Rows that begin with the same tokens (the G rollouts of a task
share their prompt) share their prefix (``policy.prefix``): it runs forward and backward once
per group, for the policy, the reference and the old-log-prob recomputation alike, and the
micro-batches hold only the continuations. The result equals one pass over the whole
minibatch, at the memory cost of one micro-batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import torch

from draco_gym.algos.config import LossConfig
from draco_gym.algos.credit.apply import CreditedBatch, apply_credit
from draco_gym.algos.credit.core import CreditRule
from draco_gym.algos.policy.lm import token_logprobs
from draco_gym.algos.policy.loss import grpo_loss
from draco_gym.algos.policy.prefix import SharedPrefix, prefix_micro_batches, sharing_unsupported
from draco_gym.metrics import learned_episodes
from draco_gym.types import GAP, RolloutGroup, Trajectory

logger = logging.getLogger(__name__)

# The loss statistics ``accumulate_gradients`` sums (``grpo_loss``'s).
STAT_KEYS = ("policy_loss", "kl", "ratio", "ratio_abs_dev", "clip_fraction")

_UNCHECKED = object()  # whether a model can share a prefix, before anyone asked


# -- score ---------------------------------------------------------------------------------

def score(groups: Sequence[RolloutGroup], reward) -> list[RolloutGroup]:
    """Each group with its ``GroupScore``: one ``reward.score_group`` call per group (a rubric
    judges the G rollouts together, against one shared set of criteria)."""
    return [group.with_score(reward.score_group(group.task, group.trajectories)) for group in groups]


def teaches(group: RolloutGroup, success_metric: str = "success") -> bool:
    """Whether GRPO can learn the task from this scored group, DAPO's dynamic-sampling test
    (Yu et al., 2025, section 3.2): its episodes differ in the environment's outcome
    (``success_metric``), or, for an environment that reports none, in reward. A group whose
    episodes all succeeded, or all failed, gives the outcome nothing to push on (a rubric may
    still spread its rewards, over what the outcome does not decide). ``env_error`` episodes
    do not count."""
    kept = learned_episodes(traj.termination for traj in group.trajectories)
    outcomes = [group.trajectories[i].metrics.get(success_metric) for i in kept]
    if outcomes and None not in outcomes:
        return len({bool(o) for o in outcomes}) > 1
    return len({group.score.rewards[i] for i in kept}) > 1


# -- credit --------------------------------------------------------------------------------

def credit(groups: Sequence[RolloutGroup], rule: CreditRule,
           advantages: Sequence[Sequence[float]] | None = None) -> CreditedBatch:
    """``credit.apply.apply_credit``: A_i = the group-normalised reward (or the trainer's own
    ``advantages``, TRL's), turned by ``rule`` into a_j per step (DRACO: towards the steps the
    verdicts cite), a_j on step j's tokens and 0 on gap tokens; ``env_error`` episodes left
    out. Its ``CreditedBatch`` carries the only statistics of credit."""
    return apply_credit(groups, rule, advantages)


# -- batch ---------------------------------------------------------------------------------

class TokenBatch(TypedDict):
    """Numpy arrays [rows, longest], one right-padded row per trajectory (``token_batch``)."""

    input_ids: np.ndarray       # the tokens the policy saw and sampled
    attention_mask: np.ndarray  # 1 on tokens, 0 on padding
    policy_mask: np.ndarray     # 1 on step tokens (the loss is taken there), 0 on gap tokens and padding
    advantages: np.ndarray      # a_j of the token's step, 0 on gap tokens
    old_logp: np.ndarray        # the sampling log-probs


def token_batch(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]], pad_id: int,
                require_logprobs: bool = True) -> TokenBatch:
    """Numpy arrays [rows, longest]. ``advantages[i]`` is per token of trajectory i. Without
    ``require_logprobs`` a trajectory without sampling log-probs gets zeros in ``old_logp``."""
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantage rows")
    if not trajectories:
        raise ValueError("no trajectories to train on")
    width = max(len(t.token_ids) for t in trajectories)
    rows = len(trajectories)
    out = {
        "input_ids": np.full((rows, width), pad_id, np.int64),
        "attention_mask": np.zeros((rows, width), np.int64),
        "policy_mask": np.zeros((rows, width), np.float32),
        "advantages": np.zeros((rows, width), np.float32),
        "old_logp": np.zeros((rows, width), np.float32),
    }
    for i, (traj, adv) in enumerate(zip(trajectories, advantages)):
        n = len(traj.token_ids)
        if len(adv) != n:
            raise ValueError(f"trajectory {i}: {len(adv)} token advantages for {n} tokens")
        if len(traj.token_logprobs) != n and (require_logprobs or traj.token_logprobs):
            raise ValueError(f"trajectory {i} has no sampling log-probs (token_logprobs)")
        out["input_ids"][i, :n] = traj.token_ids
        out["attention_mask"][i, :n] = 1
        out["policy_mask"][i, :n] = np.asarray(traj.token_step) != GAP
        out["advantages"][i, :n] = adv
        if traj.token_logprobs:
            out["old_logp"][i, :n] = traj.token_logprobs
    out["policy_mask"][:, 0] = 0.0  # nothing predicts the first token
    return out


def to_batch(credited: CreditedBatch, pad_id: int) -> TokenBatch | None:
    """The token batch of the trajectories the loss takes (``CreditedBatch.learned``: no
    ``env_error`` episode, no skipped group), or None when there are none."""
    trajectories, advantages = credited.learned()
    if not trajectories:
        return None
    return token_batch(trajectories, advantages, pad_id=pad_id)


# -- update --------------------------------------------------------------------------------

class LoRAPolicy:
    """The policy as ``accumulate_gradients`` drives it: a causal LM with a LoRA adapter, its
    tokens scored under the sampling ``temperature`` (the distribution that drew them); the
    reference policy of the KL term is the same network with the adapter switched off.
    ``rllib.module.HFPolicyModule`` holds one."""

    def __init__(self, lm, temperature: float = 1.0) -> None:
        self.lm = lm
        self.temperature = float(temperature)
        self._sharing_unsupported: str | None | object = _UNCHECKED

    def forward_train(self, batch: dict, *, with_reference: bool = True, prefix: SharedPrefix | None = None,
                      ref_prefix: SharedPrefix | None = None) -> dict:
        """Current (``logp``) and reference (``ref_logp``) log-probs of the policy tokens of
        ``batch`` (tensors [rows, width]). With ``prefix`` / ``ref_prefix`` (from
        ``encode_prefix``), every row begins with that prefix and only the continuations are
        computed here."""
        self._training_mode()
        args = (batch["input_ids"].long(), batch["attention_mask"].long(), batch["policy_mask"])
        out = {"logp": token_logprobs(self.lm, *args, temperature=self.temperature, prefix=prefix)}
        if with_reference:
            with torch.no_grad(), self.lm.disable_adapter():
                out["ref_logp"] = token_logprobs(self.lm, *args, temperature=self.temperature, prefix=ref_prefix)
        return out

    def prefix_sharing(self) -> str | None:
        """None when this model's attention can take a shared prefix, else why not (checked once)."""
        if self._sharing_unsupported is _UNCHECKED:
            self._sharing_unsupported = sharing_unsupported(self.lm)
        return self._sharing_unsupported

    def encode_prefix(self, prefix_ids, *, reference: bool = False) -> SharedPrefix:
        """The prefix computed once under the current policy (with gradient when enabled) or,
        with ``reference``, under the base model (adapter off, no gradient)."""
        if reference:
            with torch.no_grad(), self.lm.disable_adapter():
                return SharedPrefix(self.lm, prefix_ids, grad=False)
        self._training_mode()
        return SharedPrefix(self.lm, prefix_ids, grad=torch.is_grad_enabled())

    def _training_mode(self) -> None:
        """Training mode before a pass with gradient: transformers recomputes a layer under
        activation checkpointing only then, and otherwise a prompt's activations (~2 MB a token
        for SmolLM2-135M in fp32) stay whole until its backward. Every dropout is off
        (``load_causal_lm``), so the mode changes nothing else."""
        if torch.is_grad_enabled() and not self.lm.training:
            self.lm.train()


@dataclass
class UpdateStats:
    """What one minibatch's gradient measured: the token-mean ``loss`` and ``grpo_loss``'s
    statistics (``STAT_KEYS``, each already a mean over the minibatch's policy tokens) summed
    over the micro-batches, the ``policy_tokens`` of this batch, and the last micro-batch's
    forward output (RLlib's learner returns it)."""

    loss: torch.Tensor
    stats: dict[str, float]
    policy_tokens: int
    last_forward: dict = field(default_factory=dict)


def use_prefix_sharing(policy, wanted: bool = True) -> bool:
    """Whether to share prefixes with this policy; a model that cannot says why, once."""
    if not wanted:
        return False
    reason = policy.prefix_sharing()
    if reason is not None and not getattr(policy, "_sharing_reason_logged", False):
        logger.warning("prefix sharing off, every row computes its whole prompt: %s", reason)
        policy._sharing_reason_logged = True
    return reason is None


def accumulate_gradients(policy, batch: dict, cfg: LossConfig, micro_batch_tokens: int, share_prefix: bool = True,
                         n_tokens: int | None = None) -> UpdateStats:
    """Forward and backward over one minibatch (tensors [rows, width]), micro-batch by
    micro-batch, accumulating the gradient of the minibatch's token-mean loss in ``.grad``.
    ``policy``: ``forward_train``, ``encode_prefix`` and ``prefix_sharing`` as ``LoRAPolicy``
    has them. ``n_tokens`` is the mean's denominator (default: this batch's policy tokens; a
    learner holding one shard passes the whole minibatch's)."""
    own_tokens = int(batch["policy_mask"][:, 1:].sum())
    n_tokens = own_tokens if n_tokens is None else n_tokens
    with_reference = cfg.kl_coeff > 0
    total_loss, totals, fwd_last = torch.zeros(()), {}, {}
    for unit in prefix_micro_batches(batch, micro_batch_tokens, use_prefix_sharing(policy, share_prefix)):
        if not any(bool(m["policy_mask"][:, 1:].any()) for m in unit.micro):
            continue
        prefix = ref_prefix = None
        if unit.prefix is not None:
            prefix = policy.encode_prefix(unit.prefix)
            ref_prefix = policy.encode_prefix(unit.prefix, reference=True) if with_reference else None
        for micro in unit.micro:
            mask = micro["policy_mask"][:, 1:].bool()  # token t is predicted at t - 1
            if not bool(mask.any()):
                continue
            fwd = policy.forward_train(micro, with_reference=with_reference, prefix=prefix, ref_prefix=ref_prefix)
            loss, stats = grpo_loss(fwd["logp"], micro["old_logp"][:, 1:][mask], fwd.get("ref_logp"),
                                    micro["advantages"][:, 1:][mask], n_tokens, cfg)
            loss.backward()
            total_loss = total_loss + loss.detach().cpu()
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + float(v)
            fwd_last = fwd
        if prefix is not None:
            prefix.backward()
    return UpdateStats(total_loss, totals, own_tokens, fwd_last)


def update(policy, batch: TokenBatch, optimizer, loss_cfg: LossConfig, *, grad_clip: float | None = 1.0,
           micro_batch_tokens: int = 4096, share_prefix: bool = True) -> UpdateStats:
    """One optimizer step on ``batch``: ``accumulate_gradients``, the global-norm clip at
    ``grad_clip`` (None: off) over the parameters the optimizer steps, then the step."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.zero_grad(set_to_none=True)
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    out = accumulate_gradients(policy, tensors, loss_cfg, micro_batch_tokens, share_prefix)
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return out


@torch.no_grad()
def recompute_logprobs(policy, batch: dict, micro_batch_tokens: int, share_prefix: bool = True):
    """log pi_theta of every policy token of ``batch`` (tensors [rows, width]) under the
    current weights, in a [rows, width] tensor like ``old_logp`` (0 elsewhere): the old
    log-probs when the sampler's own cannot be trusted (vLLM)."""
    out = torch.zeros(batch["old_logp"].shape, dtype=torch.float32)
    for unit in prefix_micro_batches(batch, micro_batch_tokens, use_prefix_sharing(policy, share_prefix)):
        prefix = policy.encode_prefix(unit.prefix) if unit.prefix is not None else None
        for rows, micro in zip(unit.rows, unit.micro):
            mask = micro["policy_mask"][:, 1:].bool()
            if not bool(mask.any()):
                continue
            lp = policy.forward_train(micro, with_reference=False, prefix=prefix)["logp"]
            width = micro["input_ids"].shape[1]
            block = out[rows, 1:width]
            block[mask.cpu()] = lp.float().cpu()
            out[rows, 1:width] = block
    return out
