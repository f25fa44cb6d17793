"""Screenshots of the report's views for the manual (docs/report.md), from a small run made of real parts.

Scripted agents (those of `draco-gym demo`, plus one that stops before submitting) play
PythonTools shop tasks in the real environment; each group is scored by the real rule
rubric and its credit assigned by the real DRACO rule, and the rollouts are written in the
trainer's rollouts.jsonl format. `draco-gym report` then renders it and headless Chromium
takes one screenshot per view into docs/images/ (the run report page shows them).

    python bench/report_screenshots.py [--out docs/images] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import gymnasium as gym

import draco_gym  # noqa: F401 - registers the environments
from draco_gym.algos.credit import get_credit_rule, group_advantages
from draco_gym.algos.cli.demo import AGENTS, _code
from draco_gym.algos.rllib.reporting import RolloutLog
from draco_gym.report import build_report
from draco_gym.reward import build_reward
from draco_gym.types import RolloutGroup

SCRIPTS = dict(AGENTS)
SCRIPTS["stops early"] = [
    "Let me fetch the order first.\n" + _code("order = get_order('{order}')\nprint(order)"),
    "The order has several items; the total is probably around 100.",
]


def play(env, task_id: str, script: list[str]):
    env.reset(options={"task_id": task_id})
    order = env.task.instruction.split("order ")[1].split("?")[0]
    info = {}
    for message in script:
        _, _, terminated, truncated, info = env.step(message.replace("{order}", order))
        if terminated or truncated:
            break
    trajectory = info.get("trajectory") or env.trajectory()
    for step in trajectory.steps:
        step.n_tokens = max(1, len(step.text.split()))
    return trajectory


def write_run(run: Path, iterations: int = 6, tasks_per_iteration: int = 3, seed: int = 0) -> None:
    rng = random.Random(seed)
    env = gym.make("draco_gym/PythonTools-v0").unwrapped
    reward, credit = build_reward("rule"), get_credit_rule("draco")
    tasks = [t for t in env.task_ids if t.startswith("order-total")]
    run.mkdir(parents=True, exist_ok=True)
    try:
        log = RolloutLog(run / "rollouts.jsonl")
        log.path.unlink(missing_ok=True)
        for it in range(iterations):
            for task_id in rng.sample(tasks, tasks_per_iteration):
                # The policy improves: later iterations draw the careful agents more often.
                names = rng.choices(list(SCRIPTS), weights=[1 + it, 1 + it / 2, 4 - it / 2, 3], k=4)
                trajectories = [play(env, task_id, SCRIPTS[n]) for n in names]
                group = RolloutGroup(task_id=task_id, trajectories=trajectories)
                group = group.with_score(reward.score_group(group.task, trajectories))
                steps = credit(trajectories, group.score, group_advantages(group.score.rewards))
                log.write([group], iteration=it, step_advantages=steps)
    finally:
        env.close()


def shoot(html: Path, out: Path, chromium: str) -> list[Path]:
    from playwright.sync_api import expect, sync_playwright

    index = json.loads(html.read_text().split('id="run-index">', 1)[1].split("</script>", 1)[0])
    # The group view of the first group where the judge and the environment disagree, and
    # the rollout view of its best-rewarded rollout.
    gid = next((g["id"] for g in index["groups"] if g["dis"]), 0)
    best = max(range(len(index["groups"][gid]["roll"])), key=lambda i: index["groups"][gid]["roll"][i]["R"])
    views = [("report_run.png", "#run", ".charts svg"), ("report_groups.png", "#groups?dis=1", "#groups-table"),
             ("report_group.png", f"#group/{gid}", "#rubric .cites"),
             ("report_rollout.png", f"#rollout/{gid}/{best}", "#steps .ended")]
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(html.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']")
        for name, hash_, selector in views:
            page.evaluate("h => { location.hash = h; }", hash_)
            expect(page.locator("body")).to_have_attribute("data-shown", hash_)  # the view drawn, not the last one
            page.wait_for_selector(selector)
            page.set_viewport_size({"width": 1280, "height": 900})
            if name == "report_run.png":  # three charts a row, the whole page
                page.set_viewport_size({"width": 1440, "height": 900})
            if name == "report_rollout.png":  # the evidence of one verdict, opened, and the steps below
                page.locator("#steps .vcite summary").first.click()
                page.set_viewport_size({"width": 1280, "height": 1500})
            page.screenshot(path=str(out / name), full_page=name == "report_run.png")
            written.append(out / name)
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "images"))
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--keep", metavar="DIR", help="write the run and its report here and keep them")
    args = parser.parse_args()
    run = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="draco-report-shots-"))
    try:
        write_run(run)
        html = build_report(run, title="scripted PythonTools agents, rule rubric, DRACO credit")
        for path in shoot(html, Path(args.out), args.chromium):
            print(path)
    finally:
        if not args.keep:
            shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
