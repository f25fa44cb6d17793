"""``draco-gym report``: the HTML page opened in headless Chromium and read from its DOM.

The hand-made run has known verdicts, citations, a planted judge/env disagreement and a
hostile rollout; the slow test reports on a real run of the GRPO trainer. Every page load
records each request the page makes and each Content-Security-Policy violation: a report
must not reach for anything beyond its own file.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil

import pytest

from draco_gym import report
from draco_gym.cli import main
from draco_gym.types import Step
from report_fixtures import GUESSES, HOSTILE_CRITERION, HOSTILE_TEXT, READS_TOTAL, write_hand_made_run

# Every view of the page under test draws this long after its hashchange, as on a loaded
# machine: a test that reads the DOM before the view it asked for is drawn (an element the
# previous view left, a row count taken before the filter applied) fails every time here rather
# than now and then under load. Tests wait for the view the page says it has drawn instead
# (body[data-shown], Page.show and Page.wait_shown) through Playwright's expect, which polls
# without evaluating strings: the report's CSP forbids eval, so a string predicate given to
# wait_for_function throws as soon as it has to poll.
LATE_DRAW_MS = 150
WAIT_MS = 30_000

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    path = os.environ.get("DRACO_GYM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("no chromium on PATH: install Debian's chromium (apt-get install -y chromium; .ci/run does) "
                    "or set DRACO_GYM_CHROMIUM to a Chromium binary")
    return path


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        chrome = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chrome
        chrome.close()


class Page:
    """A report opened in a fresh page that records requests, dialogs, errors and CSP
    violations."""

    def __init__(self, browser, html_path):
        self.url = html_path.resolve().as_uri()
        self.requests, self.dialogs, self.errors = [], [], []
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.page.add_init_script("window.__violations = [];"
                                  "document.addEventListener('securitypolicyviolation',"
                                  " e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));")
        self.page.add_init_script("const listen = window.addEventListener;"
                                  "window.addEventListener = function (type, fn, options) {"
                                  f" const late = type === 'hashchange' ? e => setTimeout(() => fn(e), {LATE_DRAW_MS}) : fn;"
                                  " return listen.call(this, type, late, options); };")
        self.page.route("**/*", self._route)
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.goto(self.url)

    def wait_ready(self):
        self.page.wait_for_selector("body[data-ready='1']")
        return self

    def _route(self, route):
        self.requests.append(route.request.url)
        if route.request.url == self.url:
            route.continue_()
        else:
            route.abort()

    def _dialog(self, dialog):
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def show(self, hash_, wait_for):
        """Open the view at hash_ and wait until the page has drawn it and it holds wait_for."""
        self.page.evaluate("h => { location.hash = h; }", hash_)
        self.wait_shown(hash_)
        self.page.wait_for_selector(wait_for)
        return self.page

    def wait_shown(self, hash_):
        """Wait until the page says it has finished drawing the view at hash_ (after a click
        that navigates, for example)."""
        from playwright.sync_api import expect

        expect(self.page.locator("body")).to_have_attribute("data-shown", hash_, timeout=WAIT_MS)

    def left_the_page(self):
        """Requests for anything but the report itself, and CSP violations."""
        violations = self.page.evaluate("window.__violations")
        return [u for u in self.requests if u != self.url] + violations

    def close(self):
        self.context.close()


@pytest.fixture(scope="module")
def hand_made(tmp_path_factory):
    run = tmp_path_factory.mktemp("hand") / "run"
    expected = write_hand_made_run(run)
    # the hand-made run's judge capped observations at 2,000 characters (max_observation_chars)
    path = report.build_report(run, limits=report.Limits(judge_observation=2000, judge_message=6000))
    return run, path, expected


@pytest.fixture
def page(browser, hand_made):
    opened = Page(browser, hand_made[1])
    yield opened.wait_ready()
    opened.close()


def test_group_table_has_one_row_per_rollout_and_the_rubric_shows_origins(page, hand_made):
    _, _, expected = hand_made
    for gid, (task, g) in enumerate(expected["groups"]):
        p = page.show(f"#group/{gid}", "#group-table tbody tr")
        assert p.locator("#group-table tbody tr").count() == g
        assert p.locator("h2 code").inner_text() == task
    # The third group saved Criterion dumps: their origins show, and the dropped one says why.
    p = page.show("#group/2", "#rubric .cites")
    rubric = p.locator("#rubric tbody").inner_text()
    assert "proposed" in rubric and "from a rollout" in rubric
    assert "Authenticates first" in p.locator(".dropped").inner_text()
    assert "discriminative dropout" in p.locator(".dropped").inner_text()
    assert "augment[2]" in p.locator(".fallbacks").inner_text()
    # Side by side, each rollout's steps coloured by the verdicts citing them: refund-2's #2
    # has a PASS on step 1 and a FAIL on step 2.
    cells = p.locator("#group-table tbody tr").nth(1).locator(".stepcell")
    assert cells.count() == 2
    assert [cells.nth(j).get_attribute("class") for j in range(2)] == ["stepcell pass", "stepcell fail"]
    # A citation in the rubric opens the rollout at the cited step.
    link = p.locator("#rubric tbody tr").nth(1).locator(".cites a").first  # "Checks the refund...", rollout #1
    assert link.inner_text() == "s2"
    target = link.get_attribute("href")
    link.click()
    page.wait_shown(target)
    assert p.locator("#steps .step.focus").get_attribute("id") == "step-2"
    assert "Checks the refund went through" in p.locator("#step-2 .citing").inner_text()
    # R_i and A_i: the second group's rewards are (0, 1, -1), so A = (0, +1.22, -1.22).
    p = page.show("#group/1", "#group-table tbody tr")
    cells = [p.locator("#group-table tbody tr").nth(i).locator("td").nth(1).inner_text() for i in range(3)]
    assert cells == ["0.00", "+1.00", "-1.00"]
    assert "+1.22" in p.locator("#group-table tbody tr").nth(1).inner_text()
    assert page.errors == [] and page.left_the_page() == []


def test_a_cited_step_shows_its_verdicts_with_evidence_and_its_credit(page):
    p = page.show("#rollout/0/0", "#step-2 .citing")
    step1, step2 = p.locator("#step-1"), p.locator("#step-2")
    assert READS_TOTAL in step1.locator(".citing").inner_text()
    assert READS_TOTAL not in step2.locator(".citing").inner_text()
    assert GUESSES in step2.locator(".citing").inner_text()
    assert step1.locator(".vcite.pass").count() == 1 and step1.locator(".vcite.fail").count() == 0
    # The evidence is folded; opening it shows the judge's words.
    evidence = step1.locator(".vcite .evidence")
    assert not evidence.is_visible()
    step1.locator(".vcite summary").click()
    assert "printed {'total': 42.5}" in evidence.inner_text()
    # Credit: per-token advantage and push against the uniform baseline A_i.
    assert step1.locator(".cbar-value").first.inner_text() == "+1.830"
    assert "A_i = +1.225" in p.locator(".legend-box").inner_text()
    assert "no code: closing message" in p.locator("#step-3 .step-head").inner_text()
    assert "success=true" in p.locator(".env-metrics").inner_text()
    # A failing rollout's cited step is coloured as a failure.
    p = page.show("#rollout/0/1", "#step-1 .citing")
    assert p.locator("#step-1 .vcite.fail").count() == 3


def test_long_observations_are_folded_capped_and_point_at_their_jsonl_line(page):
    p = page.show("#rollout/0/2", "#step-1")
    step = p.locator("#step-1")
    marks = step.locator(".step-head").inner_text()
    assert "judge saw the observation shortened to 2000 of 6000 characters" in marks
    observation = step.locator("details.block", has_text="observation")
    assert not observation.locator("pre").is_visible()  # folded
    text = observation.locator("pre").text_content()
    assert "characters not embedded: full text in rollouts.jsonl line 3" in text
    assert len(text) < 1200
    pointer = p.locator("#full-record")
    assert "rollouts.jsonl line 3" in pointer.inner_text()
    assert pointer.locator("a").get_attribute("href") == "rollouts.jsonl"
    # The run cut by its token budget marks its last step.
    p = page.show("#rollout/2/3", "#step-2")
    assert "token budget" in p.locator("#step-2 .step-head").inner_text()


def test_filters_find_groups_by_task_criterion_verdict_termination_and_disagreement(page, hand_made):
    _, _, expected = hand_made

    def tasks(query):
        p = page.show(f"#groups?{query}", "#match-count")
        return [p.locator("#groups-table tbody tr").nth(i).locator("td").nth(1).inner_text()
                for i in range(p.locator("#groups-table tbody tr").count())]

    everything = [t for t, _ in expected["groups"]]
    assert tasks("") == everything
    assert tasks("dis=1") == expected["disagree"]
    assert tasks("task=refund-2") == ["refund-2"]
    assert tasks("crit=order+total&verdict=fail") == ["order-total-1"]
    assert tasks("crit=guess&verdict=na") == ["order-total-1"]
    assert tasks("crit=refund+went&verdict=pass") == ["refund-2"]
    assert tasks("crit=authenticates&verdict=dropped") == ["refund-2"]
    assert tasks("term=max_turns") == ["order-total-1"]
    assert tasks("term=length&dis=1") == ["refund-2"]
    # Through the controls, as a user does: tick the lens.
    p = page.show("#groups", "#groups-table")
    p.locator("input[name=dis]").check()
    page.wait_shown("#groups?dis=1")
    assert p.locator("#groups-table tbody tr").count() == 2
    assert "judge rewarded it" in p.locator("#groups-table tbody tr").first.inner_text()


def assert_readable_axes(p):
    """Every chart's y axis has distinct tick labels (a flat series included)."""
    for chart in p.locator(".chart-card svg.chart").all():
        ticks = chart.locator("text[text-anchor=end]").all_text_contents()
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks


def _injected(p) -> int:
    return p.evaluate("document.querySelectorAll('#pwned, #pwned-crit, img, i, b').length")


def test_hostile_rollout_renders_as_text_and_runs_nothing(browser, hand_made):
    page = Page(browser, hand_made[1])
    try:
        _hostile_checks(page)
    finally:
        page.close()


def _hostile_checks(page):
    # Before the page's own script draws anything: the data blocks parsed as data only.
    assert page.dialogs == []
    assert _injected(page.page) == 0
    assert page.page.evaluate("document.scripts.length") == 1 + 3 + 1
    page.wait_ready()
    p = page.show("#rollout/1/0", "#step-1 .citing")
    assert HOSTILE_TEXT in p.locator("#step-1 .step-main pre").first.inner_text()
    assert "<script>alert(2)</script>" in p.locator("#step-1").inner_text()
    assert HOSTILE_CRITERION in p.locator("table.verdicts").inner_text()
    assert '<b id=\\"pwned\\">42</b>' in p.locator(".env-metrics").inner_text()
    p.locator("#step-1 .vcite summary").first.click()
    assert "</script><script>alert(5)</script>" in p.locator("#step-1 .vcite").first.inner_text()
    page.show("#group/1", "#rubric .cites")
    page.show("#groups", "#groups-table")
    assert page.dialogs == []
    assert _injected(p) == 0
    # Only the page's own scripts: the index, one block per group, and the program.
    assert p.evaluate("document.scripts.length") == 1 + 3 + 1
    assert p.evaluate("document.querySelectorAll('html').length") == 1
    assert page.errors == [] and page.left_the_page() == []


def test_no_request_leaves_the_page_in_any_view(page):
    for hash_, sel in [("#groups", "#groups-table"), ("#group/2", "#rubric .cites"), ("#rollout/2/0", "#step-1"),
                       ("#run", ".charts svg")]:
        page.show(hash_, sel)
    page.page.locator("details.card summary").first.click()  # every metric, with sparklines
    assert page.left_the_page() == []
    assert page.errors == []


def test_run_at_a_glance_draws_every_figure_and_the_evaluation(page):
    p = page.show("#run", ".charts svg")
    captions = p.locator(".chart-card figcaption").all_inner_texts()
    for words in ("Reward", "dropout", "Inert-credit", "Uncredited citations", "Termination", "Judge cost", "Judge tokens", "fallbacks", "Time"):
        assert any(words in c for c in captions), (words, captions)
    assert p.locator(".chart-card svg path, .chart-card svg polygon").count() >= 10
    # Rates as rates with their intervals; after - before only for a rate, with its own interval
    # (0.25 -> 0.5 of 4 each: 1.96 * sqrt(.25 * .75 / 4 + .5 * .5 / 4) = 0.648); none for a setting.
    rows = {r.locator("th").inner_text(): r.locator("td").all_inner_texts() for r in p.locator("table.eval tbody tr").all()}
    assert rows["success_rate"] == ["0.250 [0.05, 0.70]", "0.500 [0.15, 0.85]", "+0.250 [-0.398, +0.898]"]
    assert rows["raised_blocks"] == ["0.000 [0.00, 0.39]", "0.000 [0.00, 0.43]", "no change seen"]  # not [0, 0]
    assert rows["temperature"] == ["1", "1", ""] and rows["episodes"] == ["4", "4", ""]
    assert "too few episodes" in p.locator("section.card ul.notes").inner_text()
    assert "metrics.jsonl: reward_mean" in p.locator(".charts").inner_text()
    assert_readable_axes(p)


# -- the generator, without a browser --------------------------------------------------------


def test_embedded_json_cannot_end_its_script_element():
    hostile = {"a": "</script><script>alert(1)</script>", "b": "<!--", "c": "&lt;", "d": "\u2028"}
    text = report.embed_json(hostile)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == hostile


def test_judge_limits_match_what_the_judge_reads():
    from draco_gym.reward.render import render_trajectory

    params = inspect.signature(render_trajectory).parameters
    assert report.JUDGE_MESSAGE_CHARS == params["max_message_chars"].default
    assert report.JUDGE_OBSERVATION_CHARS == params["max_observation_chars"].default


def test_renamed_metrics_are_found_under_a_prefix_and_missing_ones_are_derived(tmp_path):
    run = tmp_path / "run"
    write_hand_made_run(run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    nested = [{"env_runners": {"reward_mean": r["reward_mean"]}, "training_iteration": r["training_iteration"]}
              for r in rows]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nested))
    html = report.build_report(run).read_text()
    index = json.loads(html.split('id="run-index">', 1)[1].split("</script>", 1)[0])
    assert index["metrics"]["names"]["reward"] == "env_runners/reward_mean"
    assert index["metrics"]["names"]["pass_rate"] is None
    derived = index["derived"]
    assert derived["x"] == [1, 2]
    # From rollouts.jsonl: the third group's verdicts are 4 passes and 4 fails; the first
    # iteration's groups had 3 + 1 dropped and 2 criteria, the second's 2 + 1 dropped.
    assert derived["pass_rate"][1] == pytest.approx(4 / 8)
    assert derived["criteria_before"] == [3, 3] and derived["criteria_after"] == [2.5, 2]
    assert derived["fallbacks"] == {"augment": [0, 1]}
    # credit's measures come from the trainer's CreditedBatch (metrics.jsonl) only, never recomputed
    assert not {"inert_share", "paper_inert_share", "uncredited_citations"} & set(derived)


def test_bad_run_directories_are_named_in_the_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "neither metrics.jsonl nor rollouts.jsonl" in capsys.readouterr().err
    (tmp_path / "rollouts.jsonl").write_text('{"iteration": 0}\n{not json\n')
    assert main(["report", str(tmp_path)]) == 2
    assert "line 1 has no 'trajectory'" in capsys.readouterr().err
    run = tmp_path / "ok"
    write_hand_made_run(run)
    assert main(["report", str(run), "--max-observation-chars", "0"]) == 2
    assert "--max-observation-chars must be >= 1" in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path / "out" / "r.html")]) == 0
    assert (tmp_path / "out" / "r.html").stat().st_size > 10_000
    assert "r.html" in capsys.readouterr().out


# -- a real run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_of_a_real_training_run(tmp_path, browser, capsys):
    """Two iterations of the GRPO trainer (tiny random Llama, PythonTools, the rule rubric)
    through `draco-gym train`, then `draco-gym report` on its output directory."""
    yaml = pytest.importorskip("yaml")
    from draco_gym.algos.policy.models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "run"
    config = {
        "name": "report", "output_dir": str(out), "iterations": 2,
        "env": {"id": "draco_gym/PythonTools-v0", "config": {"max_turns": 2}},
        "policy": {"model": str(model), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"group_size": 3, "tasks_per_iteration": 2, "max_new_tokens": 8, "max_response_tokens": 64},
        "reward": {"name": "rule"}, "credit": {"name": "draco"}, "optim": {"minibatch_size": None},
        "resources": {"ray_num_cpus": 2, "object_store_memory_mb": 80},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "run.yaml")]) == 0
    assert main(["report", str(out)]) == 0
    assert "report.html" in capsys.readouterr().out

    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    page = Page(browser, out / "report.html").wait_ready()
    try:
        p = page.show("#groups", "#groups-table")
        assert p.locator("#groups-table tbody tr").count() == 2 * 2
        assert "metrics.jsonl: env_runners/episode_return_mean" in page.show("#run", ".charts svg").locator(".charts").inner_text()
        assert_readable_axes(page.page)  # the judge-free rule reward: judge cost and tokens are all 0
        for gid in range(4):
            p = page.show(f"#group/{gid}", "#group-table tbody tr")
            assert p.locator("#group-table tbody tr").count() == 3
            assert p.locator("#rubric tbody tr").count() == len(records[3 * gid]["criteria"])
        first = records[0]
        p = page.show("#rollout/0/0", "#steps .ended")
        assert p.locator("#steps article.step").count() == len(first["trajectory"]["steps"])
        assert p.locator("table.verdicts tbody tr").count() == len(first["score"]["verdicts"])
        assert "R_i (judge reward)" in p.locator(".stats").inner_text()
        assert page.errors == [] and page.left_the_page() == []
    finally:
        page.close()


def test_token_arrays_are_skipped_but_text_that_names_them_is_kept(tmp_path):
    from draco_gym.types import Step, Task, Trajectory, TrajectoryScore

    sneaky = 'print(\'{"token_ids": [1, 2], "token_step": [1]}\')'
    traj = Trajectory(task=Task(id="t", instruction="i"), steps=[Step(index=1, text=sneaky, code=sneaky, observation="]")],
                      token_ids=[5, 6, 7], token_step=[-1, 1, 1], token_logprobs=[0.0, -0.5, -0.25])
    record = {"iteration": 0, "task_id": "t", "index": 0, "trajectory": traj.model_dump(mode="json"),
              "score": TrajectoryScore().model_dump(mode="json"), "criteria": [], "dropped": [], "fallbacks": [],
              "step_advantages": [0.0]}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record, indent=1).replace("\n", "") + "\n")
    groups = list(report.read_groups(tmp_path / "rollouts.jsonl"))
    assert len(groups) == 2  # the second line restarts at index 0: a new group
    for group in groups:
        (_, parsed), = group.rows
        assert parsed.trajectory.steps[0].text == sneaky and parsed.trajectory.steps[0].code == sneaky
        assert parsed.trajectory.steps[0].observation == "]"
        assert parsed.trajectory.token_ids == parsed.trajectory.token_step == parsed.trajectory.token_logprobs == []


def test_the_report_command_loads_no_training_or_reward_layer(tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    write_hand_made_run(run)
    code = ("import sys; from draco_gym.cli import main; rc = main(['report', sys.argv[1]]); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'transformers') "
            "or m.startswith(('draco_gym.algos', 'draco_gym.reward'))); sys.exit(str(heavy) if heavy or rc else 0)")
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_evaluation_directory_reports_too(tmp_path):
    """`draco-gym eval` writes rollouts without an iteration and, unscored, without a score."""
    run = tmp_path / "run"
    write_hand_made_run(run)
    records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()][:3]
    ev = run / "eval"
    ev.mkdir()
    with open(ev / "rollouts.jsonl", "w") as fh:
        for i, r in enumerate(records):
            fh.write(json.dumps({"task_id": r["task_id"], "index": i, "trajectory": r["trajectory"],
                                 "score": None if i == 0 else r["score"]}) + "\n")
    (ev / "summary.json").write_text(json.dumps({"checkpoint": "base", "success_rate": 0.33, "termination": {"submitted": 1.0}}))
    out = report.build_report(ev, tmp_path / "elsewhere" / "eval.html")
    index = json.loads(out.read_text().split('id="run-index">', 1)[1].split("</script>", 1)[0])
    (group,) = index["groups"]
    assert [r["R"] for r in group["roll"]] == [0.0, -1.0, 0.0]
    assert index["eval"]["columns"] == ["base"] and index["eval"]["diff"] is False
    assert {"key": "termination/submitted", "cells": [1.0], "diff": None} in index["eval"]["rows"]
    assert index["files"]["rollouts_href"] == "../run/eval/rollouts.jsonl"


def test_an_eval_summary_gives_a_column_per_checkpoint_with_its_rates(tmp_path):
    """``draco-gym eval --checkpoint last`` over two checkpoints: a column each, the rates (with
    their intervals) in place of the bare success rate, no after - before column."""
    from draco_gym.metrics import share

    def run(wins):
        return {"tasks": 2, "episodes": 4, "success_rate": wins / 4, "pass@1": wins / 4,
                "rates": {"episodes": 4, "success_rate": share(wins, 4)}}

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "summary.json").write_text(json.dumps({
        "checkpoints": ["t/checkpoint_1", "t/checkpoint_2"], "protocol": {"episodes_per_task": 2},
        "splits": {"default": {"tasks": 2, "checkpoints": {"t/checkpoint_1": run(1), "t/checkpoint_2": run(3)},
                               "mean": {"success_rate": 0.5}}}}))
    table = report._read_summary(tmp_path)
    assert table["columns"] == ["t/checkpoint_1", "t/checkpoint_2"] and table["diff"] is False
    rows = {r["key"]: r["cells"] for r in table["rows"]}
    assert rows["success_rate"] == [{"v": 0.25, "ci": share(1, 4)["ci95"], "k": 1, "n": 4},
                                    {"v": 0.75, "ci": share(3, 4)["ci95"], "k": 3, "n": 4}]
    assert rows["pass@1"] == [0.25, 0.75] and rows["episodes"] == [4, 4]


def test_a_run_with_metrics_only_or_broken_credit_still_opens(tmp_path, browser):
    run = tmp_path / "run"
    write_hand_made_run(run)
    lines = (run / "rollouts.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["step_advantages"][1] = float("nan")  # json.dumps writes NaN; a crashed credit rule could
    (run / "rollouts.jsonl").write_text(json.dumps(record) + "\n")
    page = Page(browser, report.build_report(run)).wait_ready()
    try:
        p = page.show("#rollout/0/0", "#steps .ended")
        assert "no credit" in p.locator("#step-2 .credit").inner_text()
        assert p.locator("#step-1 .cbar").count() == 2
    finally:
        page.close()
    (run / "rollouts.jsonl").unlink()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "judge_cost": 0.0}) + "\n" for r in rows))  # flat
    page = Page(browser, report.build_report(run)).wait_ready()
    try:
        assert "0 of 0 groups match" in page.show("#groups", "#match-count").locator("#match-count").inner_text()
        assert page.show("#run", ".charts svg").locator(".chart-card").count() >= 6
        assert_readable_axes(page.page)
        assert page.errors == [] and page.left_the_page() == []
    finally:
        page.close()


def test_many_groups_are_paged_and_the_lens_counts_every_page(tmp_path, browser):
    from draco_gym.bench.report_large import write_run

    run = tmp_path / "run"
    write_run(run, iterations=4, groups=16, size=3, n_steps=4)  # 64 groups: two pages of 50
    html = report.build_report(run)
    index = json.loads(html.read_text().split('id="run-index">', 1)[1].split("</script>", 1)[0])
    disagreeing = [g["id"] for g in index["groups"] if g["dis"]]
    assert 0 < len(disagreeing) < 64
    page = Page(browser, html).wait_ready()
    try:
        p = page.show("#groups", "#groups-table")
        assert p.locator("#groups-table tbody tr").count() == 50
        p.get_by_role("button", name="next ›").click()
        page.wait_shown("#groups?page=2")
        assert p.locator("#groups-table tbody tr").count() == 14
        assert "page 2 of 2" in p.locator(".pager").inner_text()
        p = page.show("#groups?dis=1", "#match-count")
        assert f"{len(disagreeing)} of 64 groups match" in p.locator("#match-count").inner_text()
        shown = [int(r.get_attribute("data-gid")) for r in p.locator("#groups-table tbody tr").all()]
        assert shown == disagreeing[:50]
        assert page.errors == [] and page.left_the_page() == []
    finally:
        page.close()


def test_a_turn_without_code_is_labelled_for_what_it_was():
    """A malformed reply mid-episode is not a closing message: the label names the parse
    error the agent was shown (the page shows "no code: <label>")."""
    limits = report.Limits()
    unclosed = {"text": "```python\nprint(get_product('P101'", "code": None, "observation": "Error: ...",
                "info": {"parse": {"n_blocks": 0, "error": "a code block was opened but never closed"}}}
    closing = {"text": "Done.", "code": None, "observation": "", "info": {"parse": {"n_blocks": 0, "error": None}}}
    said = {"text": "Which order?", "code": None, "observation": "User: O1", "info": {}}
    detail = lambda step, last: report._step_detail(Step(index=1, **step), last, None, "line 1", limits)["nocode"]  # noqa: E731
    assert detail(unclosed, False) == detail(unclosed, True) == \
        "malformed reply (a code block was opened but never closed)"
    assert detail(closing, True) == "closing message"
    assert detail(said, False) == "message without code"
    assert report._step_detail(Step(index=1, **{**closing, "code": "x = 1"}), True, None, "l", limits)["nocode"] is None
    script = os.path.join(os.path.dirname(report.__file__), "report_assets", "report.js")
    with open(script) as fh:
        assert "'no code: ' + (s.nocode" in fh.read()  # the page shows the label
