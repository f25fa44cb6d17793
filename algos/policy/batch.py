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
from dataclasses import dataclass
from typing import Any

import numpy as np

from draco_gym.algos.policy.prefix import prefix_groups
from draco_gym.types import GAP, Trajectory

BATCH_KEYS = ("input_ids", "attention_mask", "policy_mask", "advantages", "old_logp")


def token_batch(trajectories: Sequence[Trajectory], advantages: Sequence[Sequence[float]], pad_id: int,
                require_logprobs: bool = True) -> dict:
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


def shard_rows(batch: dict, n: int) -> list[dict]:
    """A minibatch (numpy arrays [rows, width]) cut into ``n`` shards of consecutive rows,
    one per learner, as even as the rows allow. A learner left without rows still takes
    part in the gradient all-reduce: its shard is one padding token with no policy token."""
    shards = []
    for rows in np.array_split(np.arange(len(batch["input_ids"])), n):
        if len(rows):
            shards.append({k: v[rows] for k, v in batch.items()})
        else:
            empty = {k: np.zeros((1, 1), v.dtype) for k, v in batch.items()}
            empty["attention_mask"][:] = 1
            shards.append(empty)
    return shards


def micro_batches(batch: dict, token_budget: int) -> list[dict]:
    """Split a minibatch (tensors [rows, width]) into micro-batches of at most
    ``token_budget`` padded tokens (at least one row each), rows grouped by length so little
    is padding, each trimmed to its own longest row."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    return [_take(batch, rows, lengths) for rows in _pack(lengths, range(len(lengths)), token_budget, 0)]


@dataclass
class PrefixUnit:
    """Rows the learner computes together: the token ids their shared prefix holds (None
    when they share none) and their micro-batches (full rows, prefix included), with the
    minibatch row indices each micro-batch holds."""

    prefix: Any | None
    micro: list[dict]
    rows: list[list[int]]


def prefix_micro_batches(batch: dict, token_budget: int, share: bool = True) -> list[PrefixUnit]:
    """Split a minibatch by shared prefix (``prefix.prefix_groups``), then into micro-batches.

    A group's prefix is computed once for all its micro-batches, so the budget counts only
    what runs per micro-batch: the rows' tokens after the prefix. Rows that share nothing
    (or all rows, without ``share``) form one unit split as ``micro_batches`` does."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    if share:
        groups = prefix_groups([batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)])
    else:
        groups = []
    shared = [g for g in groups if g.length > 0]
    alone = sorted(set(range(len(lengths))) - {r for g in shared for r in g.rows})
    units = []
    if alone:
        packs = _pack(lengths, alone, token_budget, 0)
        units.append(PrefixUnit(None, [_take(batch, rows, lengths) for rows in packs], packs))
    for g in shared:
        packs = _pack(lengths, g.rows, token_budget, g.length)
        units.append(PrefixUnit(batch["input_ids"][g.rows[0], : g.length],
                                [_take(batch, rows, lengths) for rows in packs], packs))
    return units


def _pack(lengths: Sequence[int], rows: Sequence[int], token_budget: int, skip: int) -> list[list[int]]:
    """Rows grouped by length into packs of at most ``token_budget`` padded tokens after the
    first ``skip`` (at least one row each)."""
    packs: list[list[int]] = [[]]
    for i in sorted(rows, key=lambda i: lengths[i]):
        width = max([lengths[j] for j in packs[-1]] + [lengths[i]]) - skip
        if packs[-1] and width * (len(packs[-1]) + 1) > token_budget:
            packs.append([])
        packs[-1].append(i)
    return packs


def _take(batch: dict, rows: list[int], lengths: Sequence[int]) -> dict:
    width = max(lengths[j] for j in rows)
    return {k: batch[k][rows, :width] for k in BATCH_KEYS}
