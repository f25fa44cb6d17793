"""A dead judge is detectable: each failed judge request is recorded in the GroupScore with
its server and error, dead_judge names them once k groups in a row got no answer, and
probe_judge checks a judge with one request. The judges are real OpenAIJudges talking to a
closed port (refused connections) and to tests/judge_server.py answering garbage."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from draco_gym.reward import OutcomeReward, RuleRubricReward, WeightedReward, build_reward
from draco_gym.reward.judge_health import dead_judge, every_call_failed, judge_down, probe_judge
from draco_gym.reward.judge_protocol import JudgeUnavailable
from draco_gym.reward.judges import OpenAIJudge
from draco_gym.types import GroupScore, JudgeFailure, Step, Task, Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judge_server import JudgeServer, RuleJudge  # noqa: E402

TASK = Task(id="t", instruction="Submit the total.")
GROUP = [Trajectory(task=TASK, termination="no_code", metrics={"success": ok},
                    steps=[Step(index=1, text=f"```python\nsubmit({n})\n```", code=f"submit({n})", observation="ok"),
                           Step(index=2, text="Done.")]) for n, ok in ((3, True), (4, False))]


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def dynamic(base_url: str, stream: bool = True):
    judge = OpenAIJudge("test-judge", base_url=base_url, api_key="sk-test", max_retries=0, request_timeout_s=10,
                        stream=stream)
    return build_reward("dynamic", judge=judge, mode="fused", retries=0, max_repairs=1, retry_wait_s=0.01)


def test_a_refused_judge_is_recorded_naming_its_url_and_dead_after_k_groups():
    url = closed_port_url()
    reward = dynamic(url)
    groups = [reward.score_group(TASK, GROUP) for _ in range(3)]
    for g in groups:
        assert g.rewards == [0.0, 0.0] and g.judge_answers == 0
        # propose, 2 augments, merge, 2 fused scores: every request failed, each recorded
        assert [f.stage for f in g.judge_failures] == ["propose", "augment", "augment", "merge",
                                                       "score_attribute", "score_attribute"]
        assert all(f.server == url and "APIConnectionError" in f.error and url in f.error for f in g.judge_failures)
        assert every_call_failed(g)
    assert dead_judge(groups[:2], k=3) is None  # not yet k groups
    message = dead_judge(groups, k=3)
    assert message.startswith("the judge failed every call of the last 3 groups (18 requests, none answered): ")
    assert f"{url}: judge unavailable after 1 attempts: {url}: APIConnectionError: Connection error." in message
    assert "draco-gym train --check" in message


def test_a_judge_answering_garbage_is_dead_too_and_one_answer_is_not():
    with JudgeServer(lambda request: "I am fine, thanks for asking.") as server:
        garbage = [dynamic(server.base_url).score_group(TASK, GROUP) for _ in range(2)]
    assert all(every_call_failed(g) for g in garbage)
    assert all("invalid answer after 1 repairs: the answer is not valid JSON" in f.error
               for g in garbage for f in g.judge_failures)
    assert dead_judge(garbage, k=2).count(server.base_url) == 1  # one server, named once
    with JudgeServer(RuleJudge(["Submits the right total"], lambda title, text: "submit(3)" in text)) as server:
        alive = dynamic(server.base_url).score_group(TASK, GROUP)
    assert alive.judge_answers == 6 and alive.judge_failures == [] and not every_call_failed(alive)
    assert alive.rewards == [1.0, -1.0]
    # the streak must be unbroken: a group that got answers, or one whose reward asked no
    # judge, ends it
    assert dead_judge([*garbage, alive], k=2) is None
    judge_free = RuleRubricReward().score_group(TASK, GROUP)
    assert judge_free.judge_answers == 0 and judge_free.judge_failures == [] and not every_call_failed(judge_free)
    assert dead_judge([garbage[0], judge_free, garbage[1]], k=2) is None


def test_a_weighted_reward_keeps_its_judge_part_record():
    url = closed_port_url()
    judge = OpenAIJudge("test-judge", base_url=url, api_key="sk-test", max_retries=0)
    combined = WeightedReward([(build_reward("dynamic", judge=judge, mode="fused", retries=0, max_repairs=0), 1.0),
                               (OutcomeReward(), 1.0)]).score_group(TASK, GROUP)
    assert len(combined.judge_failures) == 6 and combined.judge_answers == 0 and every_call_failed(combined)
    assert combined.rewards == [1.0, 0.0]  # the outcome part still scores


def test_dead_judge_by_hand():
    down = GroupScore(judge_failures=[JudgeFailure(stage="score", server="http://a/v1", error="e1"),
                                      JudgeFailure(stage="merge", server="http://b/v1", error="e2")])
    worse = GroupScore(judge_failures=[JudgeFailure(stage="score", server="http://a/v1", error="e3")])
    assert dead_judge([down, worse], k=2) == (
        "the judge failed every call of the last 2 groups (3 requests, none answered): http://a/v1: e3 | e1; "
        "http://b/v1: e2. Check that the judge server is running and reachable (draco-gym train --check probes it)")
    with pytest.raises(ValueError, match="k must be >= 1"):
        dead_judge([down], k=0)


def test_probe_names_the_url_and_the_error():
    url = closed_port_url()
    with pytest.raises(JudgeUnavailable, match=rf"judge at {url} did not answer a probe: {url}: APIConnectionError"):
        probe_judge({"name": "openai", "model": "m", "base_url": url, "api_key": "sk-test", "max_retries": 0})
    with JudgeServer(lambda request: "<html>502 Bad Gateway</html>") as server:
        with pytest.raises(JudgeUnavailable, match=rf"judge at {server.base_url} answered a probe with no JSON object"):
            probe_judge(OpenAIJudge("m", base_url=server.base_url, api_key="sk-test"))
    with JudgeServer(lambda request: {"ok": True}) as server:
        probe_judge(OpenAIJudge("m", base_url=server.base_url, api_key="sk-test"))
        (probe,) = server.requests
    assert probe.stage == "probe" and probe.status == 200


def test_the_first_iteration_without_a_judge_answer_names_the_judge():
    """One group per iteration, the judge on a closed port: ``judge_down`` names the URL and
    the error from the first iteration on, whatever ``dead_judge_groups`` is."""
    url = closed_port_url()
    [down] = [dynamic(url).score_group(TASK, GROUP)]
    line = judge_down([down])
    assert line.startswith("the judge failed every call of this iteration (6 requests, none answered): ")
    assert f"{url}: judge unavailable after 1 attempts: {url}: APIConnectionError: Connection error." in line
    assert "\n" not in line
    assert dead_judge([down], k=3) is None  # the stop still waits for k groups
    with JudgeServer(RuleJudge(["Submits the right total"], lambda title, text: "submit(3)" in text)) as server:
        alive = dynamic(server.base_url).score_group(TASK, GROUP)
    assert judge_down([down, alive]) is None  # one group of the iteration got answers
    judge_free = RuleRubricReward().score_group(TASK, GROUP)
    assert judge_down([judge_free]) is None  # no judge asked
    assert judge_down([down, judge_free]) == line  # the groups that asked one got nothing


@pytest.mark.parametrize("stream,fault,named", [
    (True, "html", "(status 200, content type text/html; charset=utf-8)"),
    (False, "html", "(status 200)"),
    (True, "html_as_json", "(status 200, content type application/json)"),
    (False, "html_as_json", "(status 200, content type application/json)")])
def test_a_judge_answering_an_html_page_is_named_as_such(stream, fault, named):
    """A proxy's error page with status 200 in place of a chat completion, labelled HTML or
    JSON, streamed or not: each failure says the server answered an HTML page, not that the
    answer was empty."""
    with JudgeServer(RuleJudge(["Submits the right total"], lambda title, text: "submit(3)" in text)) as server:
        server.inject(fault, times=100)
        score = dynamic(server.base_url, stream=stream).score_group(TASK, GROUP)
    assert every_call_failed(score)
    for failure in score.judge_failures:
        assert f"{server.base_url} answered an HTML page {named}, not a chat completion" in failure.error
        assert "502 Bad Gateway" in failure.error and "empty" not in failure.error
    assert "answered an HTML page" in judge_down([score])


def test_the_trainer_names_a_down_judge_once_per_streak_and_the_console_prints_it(caplog):
    """``GRPO._stop_on_dead_judge`` with one group per iteration and ``dead_judge_groups``
    = 3: the first iteration without an answer puts one line in the iteration's notes (and
    the log), the next ones of the same streak add none, the third stops the run; a judge
    that answers again ends the streak. ``ProgressCallback`` prints the notes under the
    progress line (the trial's own log does not reach the console)."""
    from collections import deque
    from types import SimpleNamespace

    from draco_gym.algos.rllib.grpo import GRPO
    from draco_gym.algos.rllib.reporting import NOTE_KEY
    from draco_gym.algos.rllib.runs import ProgressCallback
    from draco_gym.reward.judge_health import DeadJudge
    from draco_gym.types import RolloutGroup

    url = closed_port_url()
    down = RolloutGroup(task_id=TASK.id, trajectories=GROUP, score=dynamic(url).score_group(TASK, GROUP))
    up = down.with_score(RuleRubricReward().score_group(TASK, GROUP).model_copy(update={"judge_answers": 1}))
    algo = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(reward=SimpleNamespace(dead_judge_groups=3))),
                           _judged=deque(maxlen=3), _judge_down_named=False, _notes=[], iteration=0)
    notes = []
    for iteration, group in enumerate([down, down, up, down, down]):
        algo.iteration, algo._notes = iteration, []
        GRPO._stop_on_dead_judge(algo, [group])
        notes.append(algo._notes)
    assert [len(n) for n in notes] == [1, 0, 0, 1, 0]
    assert notes[0] == [f"warning: {judge_down([down.score])}"] and url in notes[0][0]
    assert notes[3] == notes[0]
    logged = [r.getMessage() for r in caplog.records if "the judge failed every call" in r.getMessage()]
    assert [line.split(":")[0] for line in logged] == ["iteration 1", "iteration 4"]  # as the progress line counts
    with pytest.raises(DeadJudge, match="the last 3 groups"):
        GRPO._stop_on_dead_judge(algo, [down])

    printed = []
    callback = ProgressCallback(Path("/nonexistent"), total_iterations=5, echo=printed.append)
    callback.on_trial_result(0, [], SimpleNamespace(), {"training_iteration": 1, NOTE_KEY: notes[0][0]})
    assert printed[1:] == [notes[0][0]]
