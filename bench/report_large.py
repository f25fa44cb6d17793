"""How long `draco-gym report` takes on a large run, and how fast its page opens.

A synthetic run the size the report must handle: 100 iterations x 16 groups x G=6 rollouts
x 50 steps (9,600 rollouts, 480,000 steps), written in the trainer's rollouts.jsonl format
with realistic text sizes (messages, code, observations up to several thousand characters,
12 criteria per group with evidence and citations) and token arrays (prompt, policy and
observation tokens, as the trainer saves them). Then, side by side: the report's generation
time, its size next to rollouts.jsonl, and in headless Chromium the time until the page is
usable, until a group opens, until a 50-step rollout is drawn, and until the
disagreement filter has run over every group.

    python bench/report_large.py [--iterations 100 --groups 16 --group-size 6 --steps 50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from draco_gym.report import build_report
from draco_gym.types import Step, Task, Trajectory, TrajectoryScore, Verdict

WORDS = ("order total refund item user account balance payment card transfer amount date email phone "
         "address status pending complete error retry page result list filter api call response value "
         "field check verify submit login token expired because then first next finally the a of to in").split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def observation(rng: random.Random) -> str:
    rows = rng.choice([2, 5, 10, 20, 60])  # most small, some large API outputs
    return json.dumps([{"id": rng.randint(1, 99999), "name": sentence(rng, 3), "amount": round(rng.uniform(1, 900), 2),
                        "status": rng.choice(["pending", "complete", "failed"])} for _ in range(rows)])


class TokenPool:
    """Serialised token arrays of any length, cut from pools of pre-rendered numbers: a run
    this size holds about 200 million token entries, too many to draw one by one."""

    def __init__(self, rng: random.Random) -> None:
        self.ids = [str(rng.randrange(49152)) for _ in range(60_000)]
        self.logprobs = [str(round(-rng.random() * 3, 4)) for _ in range(60_000)]
        self.rng = rng

    def arrays(self, segments: list[tuple[int, int]]) -> str:
        """``segments``: (step, count) runs, step -1 for gap tokens (prompt, observations)."""
        ids, steps, logprobs = [], [], []
        for step, count in segments:
            start = self.rng.randrange(len(self.ids) - count)
            ids.append(",".join(self.ids[start:start + count]))
            steps.append(",".join([str(step)] * count))
            logprobs.append(",".join(self.logprobs[start:start + count]) if step > 0 else ",".join(["0.0"] * count))
        join = lambda parts: ",".join(p for p in parts if p)  # noqa: E731
        return f'"token_ids": [{join(ids)}], "token_step": [{join(steps)}], "token_logprobs": [{join(logprobs)}]'


EMPTY_TOKENS = '"token_ids": [], "token_step": [], "token_logprobs": []'


def make_group(rng, pool: TokenPool, iteration: int, g: int, size: int, n_steps: int, criteria: list[str]) -> list[str]:
    task = Task(id=f"app-task-{g % 40:03d}", instruction=sentence(rng, 40), agent_prompt=sentence(rng, 300))
    rows = []
    for i in range(size):
        steps, segments = [], [(-1, 900)]  # the prompt
        length = n_steps if i == 0 else rng.randint(n_steps // 2, n_steps)  # one full-length rollout per group
        for j in range(length):
            text = sentence(rng, rng.randint(10, 60))
            code = None if j == length - 1 else "\n".join(
                f"result_{k} = apis.{rng.choice(WORDS)}.{rng.choice(WORDS)}(id={rng.randint(1, 999)})" for k in range(rng.randint(1, 6)))
            obs = "" if code is None else observation(rng)
            n = rng.randint(40, 250)
            steps.append(Step(index=j + 1, text=text, code=code, observation=obs, n_tokens=n))
            segments += [(j + 1, n), (-1, len(obs) // 4)]
        success = rng.random() < 0.4
        traj = Trajectory(task=task, steps=steps, termination=rng.choice(["no_code", "no_code", "max_turns", "length"]),
                          metrics={"success": success, "passed": 3 if success else rng.randint(0, 2), "total": 3})
        verdicts = []
        for c in criteria:
            score = rng.choice([1, 1, -1, -1, 0]) if not success else rng.choice([1, 1, 1, -1])
            cites = sorted(rng.sample(range(1, length + 1), k=min(length, rng.randint(1, 3)))) if score else []
            verdicts.append(Verdict(criterion=c, score=score, cited_steps=cites, evidence=sentence(rng, 25),
                                    justification=sentence(rng, 15)))
        score = TrajectoryScore.from_verdicts(verdicts)
        line = json.dumps({"iteration": iteration, "task_id": task.id, "index": i, "trajectory": traj.model_dump(mode="json"),
                           "score": score.model_dump(mode="json"), "criteria": criteria, "dropped": ["Authenticates first"],
                           "fallbacks": [], "step_advantages": [rng.uniform(-2, 2) for _ in steps]})
        rows.append(line.replace(EMPTY_TOKENS, pool.arrays([s for s in segments if s[1] > 0]), 1))
    return rows


def write_run(run: Path, iterations: int, groups: int, size: int, n_steps: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    pool = TokenPool(rng)
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "rollouts.jsonl", "w") as fh:
        for it in range(iterations):
            for g in range(groups):
                criteria = [sentence(rng, 5).rstrip(".") for _ in range(12)]
                for line in make_group(rng, pool, it, g, size, n_steps, criteria):
                    fh.write(line + "\n")
    with open(run / "metrics.jsonl", "w") as fh:
        for it in range(iterations):
            fh.write(json.dumps({"training_iteration": it + 1, "reward_mean": rng.uniform(-0.3, 0.5),
                                 "rubric_pass_rate": rng.uniform(0.3, 0.7), "env/success": rng.uniform(0.2, 0.6),
                                 "criteria_before_dropout": 13, "criteria_after_dropout": 12,
                                 "inert_credit_share": rng.uniform(0, 0.2), "judge_cost": rng.uniform(1, 2),
                                 "judge_prompt_tokens": rng.randint(10**6, 2 * 10**6), "judge_completion_tokens": 10**5,
                                 "termination/no_code": 0.5, "termination/max_turns": 0.25, "termination/length": 0.25,
                                 "time/generation": 300.0, "time/judge": 120.0, "time/learner": 200.0}) + "\n")


def measure_page(html: Path, chromium: str, gid: int) -> dict[str, float]:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                      "--disable-background-networking", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        t0 = time.perf_counter()
        page.goto(html.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']")
        ready = time.perf_counter() - t0

        def timed(hash_: str, selector: str) -> float:
            start = time.perf_counter()
            page.evaluate("h => { location.hash = h; }", hash_)
            expect(page.locator("body")).to_have_attribute("data-shown", hash_, timeout=120_000)  # the view drawn
            page.wait_for_selector(selector)
            return time.perf_counter() - start

        group = timed(f"#group/{gid}", "#rubric .cites")
        lengths = page.evaluate("g => JSON.parse(document.getElementById('run-index').textContent).groups[g].roll"
                                ".map(r => r.ns)", gid)
        longest = lengths.index(max(lengths))
        n = lengths[longest]
        rollout = timed(f"#rollout/{gid}/{longest}", f"#step-{n}")
        lens = timed("#groups?dis=1", "#match-count")
        found = page.locator("#match-count").inner_text()
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : 0") / 2**20
        browser.close()
    return {"ready": ready, "group": group, "rollout": rollout, "rollout_steps": n, "lens": lens, "found": found, "heap": heap}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--keep", metavar="DIR", help="write the run and report here and keep them")
    args = parser.parse_args()

    run = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="draco-report-bench-"))
    shape = f"{args.iterations} iterations x {args.groups} groups x G={args.group_size} x <= {args.steps} steps"
    try:
        t0 = time.perf_counter()
        write_run(run, args.iterations, args.groups, args.group_size, args.steps)
        written = time.perf_counter() - t0
        jsonl = (run / "rollouts.jsonl").stat().st_size / 2**20
        print(f"synthetic run: {shape}; rollouts.jsonl {jsonl:,.0f} MiB, written in {written:.0f} s", flush=True)

        t0 = time.perf_counter()
        html = build_report(run)
        generate = time.perf_counter() - t0
        size = html.stat().st_size / 2**20
        print(f"generate: {generate:.1f} s, report.html {size:.1f} MiB ({size / jsonl:.3f} of rollouts.jsonl)", flush=True)

        page = measure_page(html, args.chromium, gid=args.iterations * args.groups // 2)
        print(f"page ready (index parsed, run view drawn): {page['ready']:.2f} s; JS heap {page['heap']:.0f} MiB")
        print(f"open a group: {page['group'] * 1e3:.0f} ms; a {page['rollout_steps']}-step rollout: "
              f"{page['rollout'] * 1e3:.0f} ms; disagreement lens over every group: {page['lens'] * 1e3:.0f} ms "
              f"({page['found']})")
        print(f"headline: {shape}: report generated in {generate:.1f} s ({size:.0f} MiB from {jsonl:,.0f} MiB of rollouts), "
              f"page usable in {page['ready']:.2f} s, a group in {page['group'] * 1e3:.0f} ms, "
              f"a {page['rollout_steps']}-step rollout in {page['rollout'] * 1e3:.0f} ms")
    finally:
        if not args.keep:
            shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
