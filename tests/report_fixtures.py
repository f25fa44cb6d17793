"""A hand-made run directory with known verdicts, citations, a planted judge/env
disagreement and a hostile rollout, written in the trainer's format (one rollouts.jsonl line
per rollout, RolloutLog's RolloutRecord; metrics.jsonl as MetricsLog writes it)."""

from __future__ import annotations

import json
from pathlib import Path

from draco_gym.metrics import share
from draco_gym.types import Criterion, Step, Task, Trajectory, TrajectoryScore, Verdict

HOSTILE_TEXT = "<script>alert(1)</script></html><b id=\"pwned\">bold</b>"
HOSTILE_OBSERVATION = "</script><script>alert(2)</script><img src=x onerror=\"alert(3)\"><!-- </body>"
HOSTILE_CRITERION = "Avoids </script><b id=\"pwned-crit\">markup</b><script>alert(6)</script>"
LONG_OBSERVATION = "row " * 1500  # 6000 characters: over the embedding cap and the judge's limit

READS_TOTAL = "Reads the order total from the API"
SUBMITS = "Submits the exact total"
GUESSES = "Does not guess values"


def _traj(task: Task, steps: list[tuple[str, str | None, str]], termination: str, success: bool | None,
          answer=None) -> Trajectory:
    built = [Step(index=j + 1, text=text, code=code, observation=obs, n_tokens=10 * (j + 1) + len(text) % 7)
             for j, (text, code, obs) in enumerate(steps)]
    metrics = {"submitted": termination == "submitted"}
    if success is not None:
        metrics["success"] = success
    if answer is not None:
        metrics["answer"] = answer
    return Trajectory(task=task, steps=built, termination=termination, metrics=metrics)


def _score(verdicts: list[tuple[str, int, list[int], str]]) -> TrajectoryScore:
    return TrajectoryScore.from_verdicts([Verdict(criterion=c, score=s, cited_steps=cites, evidence=ev,
                                                  justification=f"because of {ev}" if ev else "")
                                          for c, s, cites, ev in verdicts])


def _record(iteration, task_id, index, traj, score, criteria, dropped=(), fallbacks=(), step_advantages=None) -> dict:
    return {"iteration": iteration, "task_id": task_id, "index": index,
            "trajectory": traj.model_dump(mode="json"), "score": score.model_dump(mode="json"),
            "criteria": criteria, "dropped": list(dropped), "fallbacks": list(fallbacks),
            "step_advantages": step_advantages if step_advantages is not None else []}


def _uniform(traj: Trajectory, a: float) -> list[float]:
    return [a] * len(traj.steps)


def write_hand_made_run(run: Path) -> dict:
    """Three groups over two iterations. Returns what the tests check against."""
    run.mkdir(parents=True, exist_ok=True)
    lines = []

    # Iteration 0, group 0 (task order-total-1, G=3): titles only, as the trainer saves them.
    task = Task(id="order-total-1", instruction="What is the total of order O1042? Submit it.")
    t1 = _traj(task, [("Let me look up the order.", "print(get_order('O1042'))", "{'total': 42.5}"),
                      ("The total is 42.5.", "submit(42.5)", "submitted"),
                      ("Done.", None, "")], "submitted", True)
    t2 = _traj(task, [("I will guess.", "submit(40)", "submitted"), ("Done.", None, "")], "submitted", False)
    t3 = _traj(task, [("Looking.", "print(get_order('O1042'))", LONG_OBSERVATION)], "max_turns", False)
    s1 = _score([(READS_TOTAL, 1, [1], "printed {'total': 42.5}"), (SUBMITS, 1, [2], "submit(42.5)"),
                 (GUESSES, 1, [2], "used the API value")])
    s2 = _score([(READS_TOTAL, -1, [1], "never read the order"), (SUBMITS, -1, [1], "submitted 40"),
                 (GUESSES, -1, [1], "guessed 40")])
    s3 = _score([(READS_TOTAL, 1, [1], "printed the order"), (SUBMITS, -1, [1], "never submitted"),
                 (GUESSES, 0, [], "")])
    titles = [READS_TOTAL, SUBMITS, GUESSES]
    for i, (t, s, a) in enumerate([(t1, s1, 1.22), (t2, s2, -1.22), (t3, s3, 0.0)]):
        adv = [a * 1.5, a * 1.5, a] if i == 0 else _uniform(t, a)
        lines.append(_record(0, task.id, i, t, s, titles, dropped=["Uses valid API calls"], step_advantages=adv))

    # Iteration 0, group 1 (task hostile<i>, G=3): agent output and judge text that try to
    # become markup, and the planted disagreement: #2 failed but the judge rewards it most.
    htask = Task(id="hostile<i>task</i>", instruction="Print </script> and <html> safely.")
    h1 = _traj(htask, [(HOSTILE_TEXT, "print('</script><script>alert(4)</script>')", HOSTILE_OBSERVATION)],
               "submitted", True, answer="</script><b id=\"pwned\">42</b>")
    h2 = _traj(htask, [("I print something pleasant.", "print('ok')", "ok")], "no_code", False)
    h3 = _traj(htask, [("Nothing.", None, "")], "no_code", False)
    hs1 = _score([(HOSTILE_CRITERION, -1, [1], "</script><script>alert(5)</script>"), ("Prints safely", 1, [1], "ok")])
    hs2 = _score([(HOSTILE_CRITERION, 1, [1], "clean"), ("Prints safely", 1, [1], "ok")])
    hs3 = _score([(HOSTILE_CRITERION, -1, [1], "nothing"), ("Prints safely", -1, [1], "nothing printed")])
    htitles = [HOSTILE_CRITERION, "Prints safely"]
    for i, (t, s) in enumerate([(h1, hs1), (h2, hs2), (h3, hs3)]):
        lines.append(_record(0, htask.id, i, t, s, htitles, step_advantages=_uniform(t, [0.0, 1.22, -1.22][i])))

    # Iteration 1, group 2 (task refund-2, G=4): criteria saved as Criterion dumps with their
    # origin, a dropped criterion with its origin, a judge fallback, a run cut by length.
    rtask = Task(id="refund-2", instruction="Refund the damaged item of order O7.")
    proposed = Criterion(title="Finds the damaged item", origin="instruction")
    added = Criterion(title="Checks the refund went through", origin="trajectory", trajectory_evidence="#3 never checked")
    dropped = Criterion(title="Authenticates first", origin="instruction")
    rcrit = [proposed.model_dump(mode="json"), added.model_dump(mode="json")]
    outcomes = [(True, 1, 1), (True, 1, -1), (False, -1, -1), (False, -1, 1)]
    for i, (ok, v1, v2) in enumerate(outcomes):
        t = _traj(rtask, [("Finding the item.", "print(items('O7'))", "[{'id': 3, 'damaged': True}]"),
                          ("Refunding." + (" x" * 4000 if i == 3 else ""), "refund(3)", "refunded")],
                  "length" if i == 3 else "submitted", ok)
        s = _score([(proposed.title, v1, [1], "item 3"), (added.title, v2, [2], "checked" if v2 > 0 else "unchecked")])
        lines.append(_record(1, rtask.id, i, t, s, rcrit, dropped=[dropped.title],
                             fallbacks=["augment[2]: the judge's JSON was invalid twice; added nothing from this rollout"],
                             step_advantages=_uniform(t, [1.0, 0.0, -1.0, 0.0][i])))

    with open(run / "rollouts.jsonl", "w") as fh:
        for line in lines:
            fh.write(json.dumps(line) + "\n")
    metrics = [
        {"training_iteration": 1, "reward_mean": 0.05, "reward_std": 0.8, "rubric_pass_rate": 0.5,
         "criteria_before_dropout": 3.5, "criteria_after_dropout": 2.5, "inert_credit_share": 0.5,
         "credit/paper_inert_share": 0.25, "credit/uncredited_citations": 2,
         "env/success": 0.33, "termination/submitted": 0.5, "termination/max_turns": 0.17, "termination/no_code": 0.33,
         "judge_cost": 0.012, "judge_prompt_tokens": 12000, "judge_completion_tokens": 2100, "judge_calls": 16,
         "reward_fallbacks": 0, "time/generation": 4.0, "time/judge": 2.5, "time/learner": 1.0, "time/iteration": 8.0},
        {"training_iteration": 2, "reward_mean": 0.0, "reward_std": 0.9, "rubric_pass_rate": 0.5,
         "criteria_before_dropout": 3.0, "criteria_after_dropout": 2.0, "inert_credit_share": 1.0,
         "env/success": 0.5, "termination/submitted": 0.75, "termination/length": 0.25,
         "judge_cost": 0.009, "judge_prompt_tokens": 9000, "judge_completion_tokens": 1500, "judge_calls": 10,
         "reward_fallbacks": 1, "time/generation": 3.5, "time/judge": 2.0, "time/learner": 1.1, "time/iteration": 7.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    # As draco-gym train --before-after writes it: the settings, then each rate with its interval.
    settings = {"tasks": 2, "episodes_per_task": 2, "temperature": 1.0, "episodes": 4}
    (run / "summary.json").write_text(json.dumps({
        "eval": {"before": {**settings, "success_rate": share(1, 4), "raised_blocks": share(0, 6)},
                 "after": {**settings, "success_rate": share(2, 4), "raised_blocks": share(0, 5)}},
        "notes": ["success_rate: 0.250 -> 0.500; too few episodes"]}))
    return {"groups": [("order-total-1", 3), (htask.id, 3), (rtask.id, 4)], "disagree": [htask.id, rtask.id]}
