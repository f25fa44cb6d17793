"""DRACO: the trajectory's advantage redistributed over its steps by the judge's citations.

    Q_j   = p_j / (p_j + f_j)       the pass fraction of the surviving verdicts citing step j
    w_j   = Q_j if A_i >= 0 else 1 - Q_j
    a_j   = A_i N w_j / (n_j sum_k w_k),   N = sum_j n_j

so each step's total push n_j a_j = A_i N w_j / sum_k w_k depends on how the judge graded
it, not on its length, and the trajectory's total sum_j n_j a_j = A_i N is GRPO's.

Whose is each value (paper: the DRACO paper, Section 3.3 and Appendix E; ours: this project's):

    Q_j from the surviving verdicts citing step j                           paper
    an uncited step takes Q-bar, the mean Q over cited steps                paper
    w_j = Q_j for A_i >= 0, 1 - Q_j for A_i < 0                             paper
    a_j = A_i N w_j / (n_j sum_k w_k)                                       paper
    uniform credit when nothing is cited or sum_k w_k = 0                   paper (Appendix E.7, E.8)
    a step with no tokens takes no share                                    ours (the paper
        assumes n_j > 0)
"""

from __future__ import annotations

from collections.abc import Sequence

from draco_gym.algos.credit.core import CreditRule, check_counts, check_finite
from draco_gym.algos.credit.registry import credit_rule
from draco_gym.algos.credit.spec import Need, RuleOptions


def step_quality(step_passes: Sequence[int], step_fails: Sequence[int]) -> list[float | None]:
    """DRACO's Q_j = p_j / (p_j + f_j) from the verdicts citing step j; None if uncited."""
    p = check_counts(step_passes, "step_passes")
    f = check_counts(step_fails, "step_fails", len(p))
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
    advantage = check_finite(advantage, "advantage")
    n = check_counts(step_tokens, "step_tokens")
    quality = step_quality(check_counts(step_passes, "step_passes", len(n)), check_counts(step_fails, "step_fails", len(n)))
    cited = [q for q in quality if q is not None]
    if not cited:
        return [advantage] * len(n)  # uniform credit, a_j = A_i
    q_bar = sum(cited) / len(cited)
    q = [q_bar if qj is None else qj for qj in quality]
    w = [qj if advantage >= 0 else 1.0 - qj for qj in q]
    total_tokens = sum(n)
    if total_tokens == 0:
        raise ValueError("step_tokens are all 0: set Step.n_tokens from the policy tokenizer before credit")
    weight_sum = sum(wj for wj, nj in zip(w, n) if nj > 0)
    if weight_sum <= 0:
        return [advantage] * len(n)  # uniform credit
    return [advantage * total_tokens * wj / (nj * weight_sum) if nj > 0 else 0.0 for wj, nj in zip(w, n)]


class DracoOptions(RuleOptions):
    """DRACO's closed form has no free value: it takes no options."""


@credit_rule("draco", DracoOptions, needs={Need.REWARD_ADVANTAGE, Need.VERDICTS})
def draco_rule(options: DracoOptions) -> CreditRule:
    """DRACO: the trajectory's advantage redistributed by the step quality of the surviving
    verdicts that cite each step (``draco_credit``)."""

    def assign(trajectories, group, advantages):
        out = []
        for traj, score, a in zip(trajectories, group.scores, advantages):
            passes, fails = score.step_counts(len(traj.steps))
            out.append(draco_credit(a, traj.step_tokens, passes, fails))
        return out

    return assign
