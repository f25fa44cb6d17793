"""A scripted DRACO judge for one group of three rollouts, with its results worked by hand.

Task: book the cheapest flight. Rollouts are tagged ROLL-A (3 steps), ROLL-B (2 steps),
ROLL-C (4 steps) so the scripted judge can tell which one a request is about.

Final verdicts after attribution (stage 5), P = PASS, F = FAIL, - = not applicable:

                                      A          B          C
    Finds the cheapest flight option  P [2]      F [1]      P [2,3]
    Books exactly one ticket          P [3]      P [2]      F [4]   (stage 4 said PASS: overruled)
    Pays with the saved card          F [3]      P [2]      F [4]
    Reads every page of results       -          F [1]      F [2]
    Logs in before searching          P [1]      P [1]      P [1]   (nobody fails: dropped)

Dropout removes "Logs in before searching". Over the four survivors:
    A: p=2 f=1 -> R = 1/3        B: p=2 f=2 -> R = 0        C: p=1 f=3 -> R = -1/2
Step counts (p_j, f_j) over survivors:
    A: p = [0,1,1]   f = [0,0,1]
    B: p = [0,2]     f = [2,0]
    C: p = [0,1,1,0] f = [0,1,0,2]
"""

from __future__ import annotations

import math

from draco_gym.types import Step, Task, Trajectory

TASK = Task(id="flight-1", instruction="Book the cheapest flight from Oslo to Rome on 3 May and pay with the saved card.",
            agent_prompt="You are an agent. Write one ```python block per turn.")

P1, P2, P3 = "Finds the cheapest flight option", "Books exactly one ticket", "Pays with the saved card"
T1, X = "Reads every page of results", "Logs in before searching"
TITLES = [P1, P2, P3, T1, X]
SURVIVORS = [P1, P2, P3, T1]
EXPECTED_REWARDS = [1 / 3, 0.0, -0.5]
EXPECTED_COUNTS = [
    ([0, 1, 1], [0, 0, 1]),
    ([0, 2], [2, 0]),
    ([0, 1, 1, 0], [0, 1, 0, 2]),
]
MARKERS = ["ROLL-A", "ROLL-B", "ROLL-C"]
N_STEPS = [3, 2, 4]


def trajectory(marker: str, n_steps: int) -> Trajectory:
    steps = [
        Step(index=j, text=f"{marker} step {j}\n```python\nprint({j})\n```", code=f"print({j})", observation=str(j), n_tokens=10 * j)
        for j in range(1, n_steps + 1)
    ]
    return Trajectory(task=TASK, steps=steps, termination="no_code")


def group() -> list[Trajectory]:
    return [trajectory(m, n) for m, n in zip(MARKERS, N_STEPS, strict=True)]


def _crit(title: str, **extra) -> dict:
    return {"title": title, "description": f"{title}.", "evaluator_instruction": f"Check that the agent {title.lower()}.",
            "grounding_references": ["cheapest flight"], **extra}


PROPOSE = {"criteria": [_crit(P1), _crit(P2), _crit(P3), _crit(X)]}
AUGMENT = {
    "ROLL-A": {"criteria": []},
    "ROLL-B": {"criteria": [_crit(T1, trajectory_evidence="step 1 used only the first page")]},
    "ROLL-C": {"criteria": []},
}
MERGE = {"criteria": [_crit(P1, origin="instruction"), _crit(P2, origin="instruction"), _crit(P3, origin="instruction"),
                      _crit(T1, origin="trajectory", trajectory_evidence="step 1 used only the first page"),
                      _crit(X, origin="instruction")]}

# final (stage 5) verdicts: title -> (verdict, steps)
FINAL = {
    "ROLL-A": {P1: ("PASS", [2]), P2: ("PASS", [3]), P3: ("FAIL", [3]), T1: ("NOT_APPLICABLE", []), X: ("PASS", [1])},
    "ROLL-B": {P1: ("FAIL", [1]), P2: ("PASS", [2]), P3: ("PASS", [2]), T1: ("FAIL", [1]), X: ("PASS", [1])},
    "ROLL-C": {P1: ("PASS", [2, 3]), P2: ("FAIL", [4]), P3: ("FAIL", [4]), T1: ("FAIL", [2]), X: ("PASS", [1])},
}
_SCORE = {"PASS": 1, "FAIL": -1, "NOT_APPLICABLE": 0}


def score_answer(marker: str) -> dict:
    rows = []
    for title, (verdict, _) in FINAL[marker].items():
        score = _SCORE[verdict]
        if marker == "ROLL-C" and title == P2:
            score = 1  # stage 4 gets this wrong; attribution overrules it
        rows.append({"criterion": title, "score": score, "evidence": f"{marker} evidence", "justification": "because"})
    return {"verdicts": rows}


def attribute_answer(marker: str) -> dict:
    return {"attributions": [{"criterion": t, "verdict": v, "steps": s, "reason": "steps shown"} for t, (v, s) in FINAL[marker].items()]}


def fused_answer(marker: str) -> dict:
    return {"verdicts": [{"criterion": t, "verdict": v, "steps": s, "evidence": f"{marker} evidence", "justification": "because"}
                         for t, (v, s) in FINAL[marker].items()]}


def script(mode: str = "separate") -> dict:
    out: dict = {"propose": PROPOSE, "merge": MERGE}
    for m in MARKERS:
        out[("augment", m)] = AUGMENT[m]
        if mode == "separate":
            out[("score", m)] = score_answer(m)
            out[("attribute", m)] = attribute_answer(m)
        else:
            out[("score_attribute", m)] = fused_answer(m)
    return out


def assert_hand_computed(result) -> None:
    assert [c.title for c in result.criteria] == SURVIVORS
    assert result.dropped == [X]
    for got, want in zip(result.rewards, EXPECTED_REWARDS, strict=True):
        assert math.isclose(got, want)
    for score, n, (passes, fails) in zip(result.scores, N_STEPS, EXPECTED_COUNTS, strict=True):
        assert score.step_counts(n) == (passes, fails)
        assert [v.criterion for v in score.verdicts] == SURVIVORS
        for v in score.verdicts:  # every PASS or FAIL cites a step inside the trajectory
            assert (v.score == 0) == (not v.cited_steps)
            assert all(1 <= s <= n for s in v.cited_steps)
    a, b, c = result.scores
    assert (a.p, a.f, b.p, b.f, c.p, c.f) == (2, 1, 2, 2, 1, 3)


# what a schema-constrained answer cannot get wrong: its JSON and its shape
FORMAT_ERRORS = ("not valid JSON", "must be a JSON object", "answer is empty", "Field required", "characters long",
                 "refuses structured_output", "judge unavailable", "no answer within")


# A run that collapsed: 8 iterations at lr 3e-4, training success falling from 1.00 to 0.00
# while the KL to the reference rose to 0.137; the collapse alarm must fire on it.
COLLAPSE_SUCCESS = [0.67, 0.83, 1.00, 0.67, 0.17, 0.00, 0.50, 0.00]
COLLAPSE_KL = [0.010, 0.015, 0.020, 0.030, 0.050, 0.080, 0.110, 0.137]
