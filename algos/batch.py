"""From scored trajectories to the learner's padded token batch, and back out to micro-batches.

One row per trajectory, right-padded to the longest row:

    input_ids    the tokens the policy saw and sampled
    policy_mask  1 where the token belongs to a step (the loss is taken there), 0 on gap
                 tokens (prompt, observations, scaffolding) and padding
    advantages   a_j of the token's step (``token_advantages``): 0 on gap tokens
    old_logp     the sampling log-probs
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draco_gym.types import GAP, Trajectory

BATCH_KEYS = ("input_ids", "attention_mask", "policy_mask", "advantages", "old_logp")


def token_batch(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]], pad_id: int) -> dict:
    """Numpy arrays [rows, longest]. ``advantages[i]`` is per token of trajectory i."""
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
        if len(traj.token_logprobs) != n:
            raise ValueError(f"trajectory {i} has no sampling log-probs (token_logprobs)")
        out["input_ids"][i, :n] = traj.token_ids
        out["attention_mask"][i, :n] = 1
        out["policy_mask"][i, :n] = np.asarray(traj.token_step) != GAP
        out["advantages"][i, :n] = adv
        out["old_logp"][i, :n] = traj.token_logprobs
    out["policy_mask"][:, 0] = 0.0  # nothing predicts the first token
    return out


def micro_batches(batch: dict, token_budget: int) -> list[dict]:
    """Split a minibatch (tensors [rows, width]) into micro-batches of at most
    ``token_budget`` padded tokens (at least one row each), rows grouped by length so little
    is padding, each trimmed to its own longest row."""
    lengths = batch["attention_mask"].sum(-1)
    order = sorted(range(len(lengths)), key=lambda i: int(lengths[i]))
    groups: list[list[int]] = [[]]
    for i in order:
        width = max([int(lengths[j]) for j in groups[-1]] + [int(lengths[i])])
        if groups[-1] and width * (len(groups[-1]) + 1) > token_budget:
            groups.append([])
        groups[-1].append(i)
    out = []
    for rows in groups:
        width = max(int(lengths[j]) for j in rows)
        out.append({k: batch[k][rows, :width] for k in BATCH_KEYS})
    return out
