"""Numbers read from episode metrics, GRPO's group advantage, and unbiased estimators over
repeated episodes of one task: shared by training, the report and every evaluation.

With n episodes of a task of which c succeeded:
    pass@k  P(at least one of k episodes drawn without replacement succeeds)
    pass^k  P(all k of them succeed): tau-bench's consistency metric; pass^1 is SR
"""

from __future__ import annotations

import math
from math import comb


def finite_number(value) -> float | None:
    """A metric's value as a float (booleans count as 0/1), or None when it is not a finite
    number: env metrics are free-form, and a NaN or a string must not become a reward."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def group_advantages(rewards, eps: float = 1e-6) -> list[float]:
    """GRPO's A_i = (R_i - mean R) / (std R + eps), population std over the group.

    A group whose rewards are all equal carries no signal: every A_i is 0.
    """
    r = []
    for i, x in enumerate(rewards):
        try:
            r.append(float(x))
        except (TypeError, ValueError):
            raise ValueError(f"rewards[{i}] must be a finite number, got {x!r}") from None
        if not math.isfinite(r[-1]):
            raise ValueError(f"rewards[{i}] must be a finite number, got {x!r}")
    if not r:
        return []
    mean = sum(r) / len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / len(r))
    if std <= 1e-12:
        return [0.0] * len(r)
    return [(x - mean) / (std + eps) for x in r]


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"successes must be within 0..{n} episodes, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be within 1..{n} (the episodes of the task), got {k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    _check(n, c, k)
    return comb(c, k) / comb(n, k)
