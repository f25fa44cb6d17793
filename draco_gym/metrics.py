"""Numbers read from episode metrics, GRPO's group advantage, and unbiased estimators over
repeated episodes of one task: shared by training, the report and every evaluation.

With n episodes of a task of which c succeeded:
    pass@k  P(at least one of k episodes drawn without replacement succeeds)
    pass^k  P(all k of them succeed): tau-bench's consistency metric; pass^1 is SR
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import comb

from draco_gym.types import Termination


def finite_number(value) -> float | None:
    """A metric's value as a float (booleans count as 0/1), or None when it is not a finite
    number: env metrics are free-form, and a NaN or a string must not become a reward."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def learned_episodes(terminations) -> list[int]:
    """The indices of a group's episodes that its statistics and the loss take: those that did
    not end in ``env_error`` (the infrastructure failed them, not the policy); none when that
    leaves fewer than two of a larger group (no baseline: the group is skipped)."""
    terminations = list(terminations)
    kept = [i for i, termination in enumerate(terminations) if termination != Termination.ENV_ERROR]
    return kept if len(kept) >= min(2, len(terminations)) else []


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


# -- the reward-hacking alarm -----------------------------------------------------------------


def kendall_tau_b(x, y) -> float | None:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant pairs) /
    sqrt((n0 - ties in x) (n0 - ties in y)), n0 = n (n - 1) / 2; a pair tied in either is
    neither concordant nor discordant. None when either has no spread (no pair untied)."""
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} values, y has {len(y)}")
    n = len(x)
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            tied_x += dx == 0
            tied_y += dy == 0
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    n0 = n * (n - 1) // 2
    if n0 - tied_x == 0 or n0 - tied_y == 0:
        return None
    return (concordant - discordant) / math.sqrt((n0 - tied_x) * (n0 - tied_y))


def outcome_agreement(groups) -> float | None:
    """How far the training reward ranks a group's rollouts as the environment's outcome does:
    Kendall's tau-b between rewards and outcomes within each group, averaged over the groups
    with spread in both (None when no group has). ``groups`` holds (rewards, outcomes) pairs,
    one per group; an outcome that is not a finite number (``finite_number``) leaves its
    rollout out.

    Tau-b, not Spearman: a group is small (G = 4 to 16) and its outcome is usually binary
    (success), so most pairs are tied in the outcome; tau-b counts each untied pair once and
    corrects for the ties in both, and reads directly as the share of pairs the reward orders
    as the outcome does, minus the share it orders against it (+1: every untied pair agrees,
    -1: every one disagrees). A reward that rises while this falls is learning something
    other than the task."""
    taus = []
    for k, (rewards, outcomes) in enumerate(groups):
        if len(rewards) != len(outcomes):
            raise ValueError(f"group {k}: {len(rewards)} rewards for {len(outcomes)} outcomes")
        pairs = [(float(r), o) for r, o in ((r, finite_number(o)) for r, o in zip(rewards, outcomes)) if o is not None]
        tau = kendall_tau_b([r for r, _ in pairs], [o for _, o in pairs])
        if tau is not None:
            taus.append(tau)
    return sum(taus) / len(taus) if taus else None


def _slope(values) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ..."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    return (sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
            / sum((i - mean_x) ** 2 for i in range(n)))


def reward_outcome_divergence(reward_means, outcome_means, window: int = 8, margin: float = 0.05):
    """The reward-hacking alarm: over the last ``window`` iterations, the training reward rose
    while the outcome fell. Each series is fitted by least squares; the alarm fires when the
    fitted reward gained at least ``margin`` over the window (slope x (window - 1)) and the
    fitted outcome lost at least ``margin``. Returns (reward change, outcome change) when it
    fires, None otherwise (and while fewer than ``window`` iterations have an outcome).
    ``outcome_means[t]`` None (no rollout of iteration t had an outcome) leaves t out of both."""
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    if len(reward_means) != len(outcome_means):
        raise ValueError(f"{len(reward_means)} reward means for {len(outcome_means)} outcome means")
    kept = [(float(r), float(o)) for r, o in zip(reward_means, outcome_means) if o is not None][-window:]
    if len(kept) < window:
        return None
    rise = _slope([r for r, _ in kept]) * (window - 1)
    fall = _slope([o for _, o in kept]) * (window - 1)
    return (rise, fall) if rise >= margin and fall <= -margin else None


def success_kl_collapse(success_means, kl_means, window: int = 4, margin: float = 0.25, kl_rise: float = 0.01):
    """The collapse alarm: over the last ``window`` iterations, the environment's success fell
    while the policy's KL to its reference climbed, the mark of an update too large for the
    task (a learning rate that walks the policy off what it could do). Each series is fitted
    by least squares; the alarm fires when the fitted success lost at least ``margin`` over
    the window (slope x (window - 1)) and the fitted KL gained at least ``kl_rise``. Returns
    (success change, KL change) when it fires, None otherwise (and while fewer than ``window``
    iterations have both). An iteration whose success or KL is None is left out of both.

    A short window, unlike the reward-hacking alarm's: a collapse takes a few iterations (a
    run of 8 went 1.00, 0.67, 0.17, 0.00), and the KL's rise tells it from a run of hard
    draws, whose policy has not moved."""
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    if len(success_means) != len(kl_means):
        raise ValueError(f"{len(success_means)} success means for {len(kl_means)} KL means")
    kept = [(float(s), float(k)) for s, k in zip(success_means, kl_means) if s is not None and k is not None][-window:]
    if len(kept) < window:
        return None
    fall = _slope([s for s, _ in kept]) * (window - 1)
    rise = _slope([k for _, k in kept]) * (window - 1)
    return (fall, rise) if fall <= -margin and rise >= kl_rise else None


# -- shares of counted events, with 95% intervals (evaluations, the report) -------------------


Z95 = 1.959964


def wilson(k: int, n: int, z: float = Z95) -> list[float]:
    """95% Wilson score interval of a proportion k/n ([0, 1] when n = 0)."""
    if n <= 0:
        return [0.0, 1.0]
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def share(k: int, n: int) -> dict:
    return {"mean": k / n if n else 0.0, "k": int(k), "n": int(n), "ci95": wilson(k, n)}


def difference(before: dict, after: dict) -> dict:
    """after - before of two shares, with a 95% interval: paired (``paired_difference``) when
    both name the same episodes in ``outcomes``, else the normal approximation for two
    independent samples."""
    ob, oa = before.get("outcomes"), after.get("outcomes")
    if isinstance(ob, dict) and isinstance(oa, dict) and ob and ob.keys() == oa.keys():
        keys = sorted(ob)
        return paired_difference([bool(ob[k]) for k in keys], [bool(oa[k]) for k in keys])
    p1, n1, p2, n2 = before["mean"], before["n"], after["mean"], after["n"]
    if not n1 or not n2:
        return {"delta": p2 - p1, "ci95": [-1.0, 1.0]}
    half = Z95 * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return {"delta": p2 - p1, "ci95": [max(-1.0, p2 - p1 - half), min(1.0, p2 - p1 + half)]}


def paired_difference(before: Sequence[bool], after: Sequence[bool], z: float = Z95) -> dict:
    """after - before of a success rate measured twice on the same episodes, with Newcombe's
    score interval for paired proportions (Newcombe 1998, Statistics in Medicine 17:2635,
    method 10: each side's Wilson interval, joined through the phi correlation of the pairs,
    continuity-corrected as published).

    Pairs are what an evaluation with one seed gives: the same task and episode index, sampled
    from the same random numbers, before and after training. Where the two policies still agree
    on an episode the pair cancels out of the difference, so only episodes whose outcome changed
    carry it, and the interval is much narrower than two independent samples' of the same size
    (an episode that both policies pass, or both fail, is evidence of no change, not noise)."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} episodes before and {len(after)} after: pairs need both sides")
    n = len(before)
    if n == 0:
        return {"delta": 0.0, "ci95": [-1.0, 1.0], "paired": 0}
    both = sum(b and a for b, a in zip(before, after))
    lost = sum(b and not a for b, a in zip(before, after))
    gained = sum(a and not b for b, a in zip(before, after))
    neither = n - both - lost - gained
    p1, p2 = (both + lost) / n, (both + gained) / n
    l1, u1 = wilson(both + lost, n, z)
    l2, u2 = wilson(both + gained, n, z)
    margins = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    # phi with Newcombe's continuity correction: a positive association shrinks by n/2 (to 0
    # at most), a negative one is kept
    cross = both * neither - lost * gained
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    delta = p2 - p1
    below = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    above = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return {"delta": delta, "ci95": [max(-1.0, delta - below), min(1.0, delta + above)], "paired": n,
            "changed": {"gained": gained, "lost": lost}}
