"""The credit arithmetic: group advantages, DRACO's closed form, steps to tokens.

Pure Python and numpy. A rule maps (a group's trajectories, its scores, the group
advantages A_i) to one advantage per step of each trajectory (``CreditRule``); every rule
joins ``CREDIT_RULES`` in ``registry.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from draco_gym.types import GAP, GroupScore, Trajectory


class CreditRule(Protocol):
    def __call__(
        self, trajectories: Sequence[Trajectory], group: GroupScore, advantages: Sequence[float]
    ) -> list[list[float]]: ...


# -- checks ------------------------------------------------------------------------------


def _finite(value: float, name: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def _counts(values: Sequence[int], name: str, length: int | None = None) -> list[int]:
    if length is not None and len(values) != length:
        raise ValueError(f"{name} has {len(values)} entries, expected one per step ({length})")
    out = []
    for j, v in enumerate(values):
        if isinstance(v, bool) or int(v) != v or v < 0:
            raise ValueError(f"{name}[{j}] must be a non-negative integer, got {v!r}")
        out.append(int(v))
    return out


# -- group advantage -----------------------------------------------------------------------


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO's A_i = (R_i - mean R) / (std R + eps), population std over the group.

    A group whose rewards are all equal carries no signal: every A_i is 0.
    """
    r = [_finite(x, f"rewards[{i}]") for i, x in enumerate(rewards)]
    if not r:
        return []
    mean = sum(r) / len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / len(r))
    if std <= 1e-12:
        return [0.0] * len(r)
    return [(x - mean) / (std + eps) for x in r]


# -- per-step rules ------------------------------------------------------------------------


def uniform_credit(advantage: float, step_tokens: Sequence[int]) -> list[float]:
    """Plain GRPO: every step of the trajectory gets the trajectory's advantage."""
    advantage = _finite(advantage, "advantage")
    return [advantage] * len(_counts(step_tokens, "step_tokens"))


def step_quality(step_passes: Sequence[int], step_fails: Sequence[int]) -> list[float | None]:
    """DRACO's Q_j = p_j / (p_j + f_j) from the verdicts citing step j; None if uncited."""
    p = _counts(step_passes, "step_passes")
    f = _counts(step_fails, "step_fails", len(p))
    return [pj / (pj + fj) if pj + fj else None for pj, fj in zip(p, f)]


def draco_credit(
    advantage: float,
    step_tokens: Sequence[int],
    step_passes: Sequence[int],
    step_fails: Sequence[int],
) -> list[float]:
    """DRACO's closed form: a_j = A * N * w_j / (n_j * sum_k w_k).

    Q_j    step quality from the surviving verdicts citing step j; an uncited step takes
           Q-bar, the mean Q over cited steps
    w_j    Q_j for a winner (A >= 0), 1 - Q_j for a loser: winners push their good steps
           hardest, losers suppress their bad steps hardest
    N      sum_j n_j, the trajectory's step tokens, so sum_j n_j a_j = A * N: the
           trajectory's total push is GRPO's, only redistributed across steps

    Falls back to uniform credit when no step is cited or the weights sum to 0. A step with
    no tokens carries no advantage and takes no share of the total.
    """
    advantage = _finite(advantage, "advantage")
    n = _counts(step_tokens, "step_tokens")
    quality = step_quality(_counts(step_passes, "step_passes", len(n)), _counts(step_fails, "step_fails", len(n)))
    cited = [q for q in quality if q is not None]
    if not cited:
        return uniform_credit(advantage, n)
    q_bar = sum(cited) / len(cited)
    q = [q_bar if qj is None else qj for qj in quality]
    w = [qj if advantage >= 0 else 1.0 - qj for qj in q]
    total_tokens = sum(n)
    if total_tokens == 0:
        raise ValueError("step_tokens are all 0: set Step.n_tokens from the policy tokenizer before credit")
    weight_sum = sum(wj for wj, nj in zip(w, n) if nj > 0)
    if weight_sum <= 0:
        return uniform_credit(advantage, n)
    return [advantage * total_tokens * wj / (nj * weight_sum) if nj > 0 else 0.0 for wj, nj in zip(w, n)]


def token_advantages(step_advantages: Sequence[float], token_step_index: Sequence[int]) -> list[float]:
    """Spread step advantages over tokens: a token of step j (1-based) gets a_j, a gap
    token (-1) gets 0. Vectorised: a long multi-turn batch has millions of tokens."""
    a = [_finite(x, f"step_advantages[{j}]") for j, x in enumerate(step_advantages)]
    index = np.asarray(token_step_index)
    if index.size and index.dtype.kind not in "iu":
        raise ValueError(f"token_step_index must hold integers, got dtype {index.dtype}")
    bad = np.flatnonzero((index != GAP) & ((index < 1) | (index > len(a))))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"token_step_index[{t}] is {index[t]}; expected -1 (gap) or a step in 1..{len(a)}")
    lookup = np.concatenate([[0.0], np.asarray(a, dtype=np.float64)])
    return lookup[np.where(index == GAP, 0, index)].tolist()
