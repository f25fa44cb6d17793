"""The GRPO policy loss, on one screen.

Inputs are flat vectors over the policy's tokens of a micro-batch (every token that belongs
to a step; prompt and observation tokens never enter):

    logp      log pi_theta(y_t | y_<t)        current policy (LoRA on), with gradient
    old_logp  log pi_old(y_t | y_<t)          the policy that sampled the rollout
    ref_logp  log pi_ref(y_t | y_<t)          the base model (LoRA off), frozen
    adv       A_t                              the step advantage a_j of the token's step

    r_t     = exp(logp - old_logp)                              importance ratio
    pg_t    = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)    PPO clip
    pg_t    = min(pg_t, -c A_t)         where A_t < 0          dual clip (Ye et al., 2020)
    kl_t    = exp(ref - logp) - (ref - logp) - 1               k3 estimator of KL(pi_theta || pi_ref)
    L       = sum_t (pg_t + beta kl_t) / N                     token-mean; N = policy tokens
                                                               in the whole minibatch

N is passed in rather than taken from the vector's length, so that a minibatch split into
micro-batches (gradient accumulation) gives the same gradient as one big batch.
"""

from __future__ import annotations

import torch

from draco_gym.algos.config import LossConfig  # eps_low, eps_high, c (0: off), beta


def grpo_loss(logp, old_logp, ref_logp, adv, n_tokens: int, cfg: LossConfig):
    """Returns (loss, stats); stats are sums over these tokens, to be divided by N."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    pg = -torch.min(unclipped, clipped)
    if cfg.dual_clip > 0:
        pg = torch.where(adv < 0, torch.minimum(pg, -cfg.dual_clip * adv), pg)

    if ref_logp is None:
        kl = torch.zeros_like(logp)
    else:
        log_ref_ratio = ref_logp - logp
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0

    n = max(int(n_tokens), 1)
    loss = (pg + cfg.kl_coeff * kl).sum() / n
    with torch.no_grad():
        stats = {
            "policy_loss": pg.sum() / n,
            "kl": kl.sum() / n,
            "ratio": ratio.sum() / n,
            # the ratio's spread: 0 on-policy before the first step, larger the staler the sampler
            "ratio_abs_dev": (ratio - 1.0).abs().sum() / n,
            "clip_fraction": (unclipped != clipped).float().sum() / n,
        }
    return loss, stats
