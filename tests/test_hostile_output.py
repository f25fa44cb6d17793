"""Nothing the agent controls raises out of the pipeline (issue 36).

An agent's code can print a lone surrogate (``print(chr(0xd800))``), write bytes that are
not UTF-8, submit bytes (``submit(b'\\xff\\xfe')``) and nest its values a thousand levels
deep. Each of these once raised past the episode: the policy's tokenizer (``run_episodes``
lost the whole batch), the renderer and every judge's request (UnicodeEncodeError), the
rollout log (UnicodeDecodeError), AppWorld's relay (RecursionError). Here each is played
through the real pieces (PythonTools' sandboxed interpreter, the tiny random Llama's
tokenizer, ``RolloutLog``, ``render_trajectory``, the static and dynamic rubrics asking a
judge over a real socket), once by name and then as a property over arbitrary text, bytes
and nesting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import draco_gym  # noqa: F401 - registers the ids
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.policy.generation import Sample
from draco_gym.algos.policy.rollout import Episode, EpisodeLimits, run_episodes
from draco_gym.algos.rllib.reporting import RolloutLog
from draco_gym.records import read_records
from draco_gym.reward import RuleRubricReward, build_reward
from draco_gym.reward.judges import OpenAIJudge
from draco_gym.reward.render import render_trajectory
from draco_gym.types import RolloutGroup, Termination, Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judge_server import JudgeServer, RuleJudge  # noqa: E402
from sandbox_marks import needs_bwrap  # noqa: E402

LIMITS = EpisodeLimits(max_new_tokens=4096, max_response_tokens=1 << 20)


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


class ScriptedSampler:
    """Plays fixed token ids as the policy's turns: ``scripts[i][turn]`` for the i-th live
    episode (EOS appended); every script here has the same number of turns."""

    def __init__(self, chat: ChatFormat, scripts: list[list[list[int]]]) -> None:
        self.chat, self.scripts, self.turn = chat, scripts, 0

    def sample(self, prompts, max_new_tokens, seed):
        samples = []
        for script in self.scripts[: len(prompts)]:
            ids = script[min(self.turn, len(script) - 1)] + [self.chat.eos_ids[0]]
            samples.append(Sample(ids, [-1.0] * len(ids), True))
        self.turn += 1
        return samples


@pytest.fixture(scope="module")
def chat(tiny_model):
    from transformers import AutoTokenizer

    return ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(tiny_model))


@pytest.fixture(scope="module")
def env():
    made = gym.make("draco_gym/PythonTools-v0")
    yield made
    made.close()


@pytest.fixture(scope="module")
def judge_url():
    judge = RuleJudge(["Submits the total"], lambda title, text: "submit(1)" in text)
    with JudgeServer(judge) as server:
        yield server.base_url


def rewards(judge_url: str) -> dict:
    """Every kind of reader of a scored trajectory: the two judged rubrics and the rule one."""
    def judge():
        return OpenAIJudge("test-judge", base_url=judge_url, api_key="sk-test", max_retries=0)

    return {"static": build_reward("static", judge=judge(), retries=0, max_repairs=0),
            "dynamic": build_reward("dynamic", judge=judge(), mode="fused", retries=0, max_repairs=0),
            "rule": RuleRubricReward()}


def task_id(env) -> str:
    return env.unwrapped.task_ids[0]


def played(env, code: str) -> Trajectory:
    """One episode of ``code`` then a closing message, stepped by hand (no tokenizer)."""
    env.reset(options={"task_id": task_id(env)})
    env.step(fence(code))
    *_, info = env.step("Done.")
    return info["trajectory"]


def rolled_out(envs: list, chat: ChatFormat, scripts: list[list[list[int]]]) -> list[Trajectory]:
    """One episode per script (and environment), all in one batch of ``run_episodes``."""
    episodes = [Episode.start(e, chat, LIMITS, task_id=task_id(e)) for e in envs]
    return run_episodes(episodes, ScriptedSampler(chat, scripts), chat, LIMITS)


def encodable(value) -> bool:
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return True


# -- each exploit by name -------------------------------------------------------------------


def test_a_lone_surrogate_in_the_output_ends_no_episode_of_the_batch(env, chat):
    """Before: the tokenizer raised TypeError on the observation and the batch was lost."""
    other = gym.make("draco_gym/PythonTools-v0")
    try:
        hostile, calm = rolled_out([env, other], chat, [
            [chat.encode(fence("print(chr(0xd800) + 'after')")), chat.encode("Done.")],
            [chat.encode(fence("print('ok')")), chat.encode("Done.")]])
    finally:
        other.close()
    assert hostile.termination == calm.termination == Termination.NO_CODE
    assert hostile.steps[0].observation.startswith("\ufffdafter")
    assert calm.steps[0].observation.startswith("ok")
    assert encodable(hostile.model_dump(mode="json"))


class UnreadableObservation(gym.Wrapper):
    """An environment whose observation no tokenizer takes (not text at all)."""

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return (None if not (terminated or truncated) else observation), reward, terminated, truncated, info


def test_an_observation_the_tokenizer_refuses_ends_that_episode_as_env_error(chat):
    broken, calm = UnreadableObservation(gym.make("draco_gym/PythonTools-v0")), gym.make("draco_gym/PythonTools-v0")
    try:
        failed, done = rolled_out([broken, calm], chat, [
            [chat.encode(fence("print('ok')")), chat.encode("Done.")]] * 2)
    finally:
        broken.close()
        calm.close()
    assert failed.termination == Termination.ENV_ERROR and "env_exception" in failed.metrics
    assert done.termination == Termination.NO_CODE and done.steps[0].observation.startswith("ok")


@pytest.mark.parametrize("reader", ["render", "static", "dynamic"])
def test_a_lone_surrogate_reaches_the_renderer_and_every_judge_as_valid_text(env, judge_url, reader):
    """Before: render_trajectory and both judged rubrics raised UnicodeEncodeError."""
    trajectory = played(env, "print(chr(0xd800))")
    if reader == "render":
        assert "\ufffd" in render_trajectory(trajectory).encode("utf-8").decode("utf-8")
        return
    score = rewards(judge_url)[reader].score_group(trajectory.task, [trajectory, played(env, "submit(1)")])
    assert score.judge_failures == [] and score.judge_answers > 0
    if reader == "dynamic":  # the judge read both rollouts: only the second one submits
        assert score.rewards == [-1.0, 1.0]


def test_lone_surrogates_become_u_fffd_and_a_split_pair_its_character(env):
    trajectory = played(env, "print(chr(0xd800))\nprint(chr(0xdfff) + chr(0xd83d) + chr(0xde00))")
    assert trajectory.steps[0].observation.startswith("\ufffd\n\ufffd\U0001F600")


def test_submitted_bytes_reach_the_rollout_log_as_text(env, tmp_path):
    """Before: ``RolloutLog.write`` raised UnicodeDecodeError on the submitted bytes."""
    trajectory = played(env, "submit(b'\\xff\\xfe' + 'é'.encode())")
    assert trajectory.metrics["submitted"] is True and trajectory.metrics["success"] is False
    assert trajectory.metrics["answer"] == "\\xff\\xfeé"  # UTF-8 decoded, the invalid bytes escaped
    group = RolloutGroup(task_id=trajectory.task.id, trajectories=[trajectory],
                         score=RuleRubricReward().score_group(trajectory.task, [trajectory]))
    RolloutLog(tmp_path / "rollouts.jsonl").write([group], iteration=0, step_advantages=[[0.0, 0.0]])
    [record], torn = read_records(tmp_path / "rollouts.jsonl")
    assert torn == 0 and record["trajectory"]["metrics"]["answer"] == "\\xff\\xfeé"


# -- the property: arbitrary text, bytes and nesting through the whole pipeline --------------

# What the agent's code prints and submits: any code point, lone surrogates as often as the
# rest (st.text draws them by their share of the code space, about 1 in 500), any bytes,
# values nested up to 1200 deep (past the sandbox's wire limit of 100 and Python's recursion
# limit) and wide ones.
ANY_CHAR = st.characters(exclude_categories=()) | st.integers(0xD800, 0xDFFF).map(chr)
ANY_TEXT = st.lists(ANY_CHAR, max_size=40).map("".join)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY_TEXT \
    | st.binary(max_size=16)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                      | st.dictionaries(ANY_TEXT | st.binary(max_size=4) | st.integers(), inner, max_size=3),
                      max_leaves=12)


def nested(depth: int, kind: str) -> str:
    """Python source of a value ``depth`` levels deep, built by a loop (the parser's own
    nesting limit is 200)."""
    seed = {"list": "[x]", "dict": "{'k': x}", "tuple": "(x,)"}[kind]
    return f"x = 0\nfor _ in range({depth}):\n    x = {seed}\n"


@st.composite
def hostile_block(draw) -> str:
    lines = [f"print({draw(ANY_TEXT)!r})",
             f"__import__('sys').stdout.flush(); __import__('os').write(1, {draw(st.binary(max_size=32))!r})",
             f"print({draw(ANY_TEXT)!r}, file=__import__('sys').stderr)"]
    depth, kind = draw(st.integers(0, 1200)), draw(st.sampled_from(["list", "dict", "tuple"]))
    last = draw(st.sampled_from(["value", "nested", "print_nested"]))
    if last == "value":
        lines.append(f"submit({draw(VALUES)!r})")
    elif last == "nested":
        lines.append(nested(depth, kind) + "submit(x)")
    else:
        lines.append(nested(depth, kind) + "print(x)")
    return "\n".join(lines)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(block=hostile_block(), noise=st.lists(st.integers(0, 10_000), max_size=24), closing=ANY_TEXT)
def test_any_output_goes_through_the_pipeline_as_valid_text(env, chat, judge_url, tmp_path, block, noise, closing):
    """Arbitrary Unicode, bytes and nesting: ``env.step`` -> ``run_episodes`` (the tiny
    Llama's tokenizer) -> ``RolloutLog`` -> ``render_trajectory`` -> the static, dynamic and
    rule rubrics. No stage raises, every episode ends as the agent ended it, and every text
    is valid UTF-8. ``noise``: random token ids the policy may emit before its block (their
    decoding is whatever the tokenizer makes of them)."""
    vocab = len(chat.tokenizer)
    special = set(chat.tokenizer.all_special_ids)
    noise_ids = [t % vocab for t in noise if t % vocab not in special]
    closing_ids = chat.encode(closing.encode("utf-8", "replace").decode("utf-8"))  # the sampler's own text is valid
    script = [noise_ids + chat.encode("\n" + fence(block)), closing_ids]
    [trajectory] = rolled_out([env], chat, [script])
    assert trajectory.termination in (Termination.NO_CODE, Termination.MAX_TURNS), trajectory.termination
    assert "env_exception" not in trajectory.metrics, trajectory.metrics
    assert encodable(trajectory.model_dump(mode="json"))

    group = RolloutGroup(task_id=trajectory.task.id, trajectories=[trajectory, played(env, "submit(1)")])
    log = tmp_path / f"rollouts-{id(block)}.jsonl"
    for name, reward in rewards(judge_url).items():
        score = reward.score_group(group.task, group.trajectories)
        assert score.judge_failures == [], (name, score.judge_failures)
        RolloutLog(log).write([group.with_score(score)], iteration=0)
    records, torn = read_records(log)
    assert torn == 0 and len(records) == 6
    assert Trajectory.model_validate(records[0]["trajectory"]).steps == trajectory.steps
    assert encodable(render_trajectory(trajectory))


# -- AppWorld: a relay line nested past any recursive walk ------------------------------------


def test_relay_arguments_nested_past_the_bound_are_refused_before_they_are_serialised():
    """Before: arguments the parent could still parse but not serialise again for the world
    (a line ~980 deep, the exact depth depending on the stack) made ``env.step`` raise
    RecursionError. ``EnvServer._relay`` with a world that serialises its request as the real
    channel does (``json.dumps``): arguments deeper than ``MAX_DEPTH`` are answered 422 and
    recorded as a failed call before anything recursive walks them (here 5,000 levels, past
    any stack), shallower ones reach the world."""
    from types import SimpleNamespace

    from draco_gym.envs.appworld.server import EnvServer
    from draco_gym.text import MAX_DEPTH

    class World:
        def request(self, method, path, body, timeout_s):
            json.dumps({"method": method, "path": path, "body": body})  # os_sandbox.JsonLines.send
            return {"status_code": 200, "text": "{}", "api": "simple_note.login"}

    def nested_kwargs(depth):
        value: list = []
        for _ in range(depth - 2):  # the kwargs dict and its "a" list are two levels
            value = [value]
        return {"a": value}

    server, calls = SimpleNamespace(world=World()), []
    for depth in (MAX_DEPTH + 1, 5000):
        answer = EnvServer._relay(server, {"method": "POST", "url": "/simple_note/login",
                                           "kwargs": nested_kwargs(depth)}, calls)
        assert answer == {"status_code": 422, "text": json.dumps(
            {"message": f"The arguments nest deeper than {MAX_DEPTH} levels."})}
    assert EnvServer._relay(server, {"url": "/simple_note/login", "kwargs": nested_kwargs(MAX_DEPTH)},
                            calls)["status_code"] == 200
    assert calls == [{"name": "/simple_note/login", "ok": False, "status": 422}] * 2 + [
        {"name": "simple_note.login", "ok": True, "status": 200}]


RELAY_LINES = """relay = apis._requester.client._relay  # the shell's end of the API channel, the agent's to write
answers = []
for depth in range({low}, {high}):
    nested = "[" * depth + "]" * depth
    relay.replies.write(('{{"api": {{"method": "post", "url": "/simple_note/auth/token", "kwargs": {{"username": '
                         + nested + '}}}}}}\\n').encode())
    relay.replies.flush()
    answers.append(relay.requests.readline().decode().strip())
print(f"{{len(answers)}} answers, each one of:")
for answer in sorted(set(answers)):
    print(answer)"""
"""A block that writes API calls on the relay by hand, one per depth in [low, high), the
username nested ``depth`` lists deep, and prints how many answers came and which."""


@needs_bwrap  # AppWorld runs only under bubblewrap
def test_a_relay_line_nested_a_thousand_deep_never_raises_out_of_an_appworld_step():
    """The issue's exploit through ``gym.make("draco_gym/AppWorld-v0")`` in bwrap: the
    agent's code writes relay lines nested deeper and deeper (100 depths a block, from 500
    up). A depth the parent can parse but not serialise again (just under the recursion
    limit, where it depends on the stack) once raised RecursionError out of ``env.step``.
    Now every depth the parent parses is answered 422 in the block's output and recorded as
    a failed call, and the episode goes on (a normal step works); the first depth it cannot
    parse stops the shell and ends the episode as ``env_error``; the next episode works.
    Ending at a depth the parent cannot parse shows every depth below it was answered."""
    from draco_gym.envs.appworld import AppWorldRuntime, ensure_offline_suite
    from draco_gym.text import MAX_DEPTH

    source = ensure_offline_suite(AppWorldRuntime())
    env = gym.make("draco_gym/AppWorld-v0", data_root=str(source.data_dir), sandbox="bwrap", step_timeout_s=20,
                   max_turns=30, show_progress=False)
    refused = json.dumps({"status_code": 422, "text": json.dumps(
        {"message": f"The arguments nest deeper than {MAX_DEPTH} levels."})})
    profile = fence("print(apis.supervisor.show_profile()['first_name'])")
    try:
        env.reset(options={"task_id": "photo-count_1"})
        terminated, low, blocks = False, 500, []
        while not terminated and low < sys.getrecursionlimit() + 100:
            # without the bound, a depth in the parsed-but-not-serialisable band raises RecursionError here
            observation, _, terminated, truncated, info = env.step(fence(RELAY_LINES.format(low=low, high=low + 100)))
            assert not truncated
            blocks.append((observation, info))
            if not terminated:
                assert env.step(profile)[0].strip() == "Mara"
            low += 100
        *answered, (last, info) = blocks
        assert terminated and info["trajectory"].termination == Termination.ENV_ERROR, last[:500]
        assert last.startswith("Environment error: the code broke the environment's protocol"), last[:500]
        assert answered, "the first block already ended the episode: start the sweep lower"
        for observation, info in answered:
            assert observation.split() == ["100", "answers,", "each", "one", "of:", *refused.split()], observation
            assert info["tool_calls"] == [{"name": "/simple_note/auth/token", "ok": False, "status": 422}] * 100
        env.reset(options={"task_id": "photo-count_1"})
        assert env.step(profile)[0].strip() == "Mara"
    finally:
        env.close()


# -- valid_data's bounds, on values no sandbox bounded ---------------------------------------


def test_a_value_nested_past_the_recursion_limit_is_cut_at_its_depth_bound(tmp_path):
    """An environment of one's own may put anything in its metrics: a list nested 10,000
    deep (json.dumps and repr raise RecursionError on it) is cut at ``MAX_DEPTH`` when the
    Trajectory is built, and the rollout log writes it."""
    from draco_gym.text import MAX_DEPTH, nesting_depth, valid_data
    from draco_gym.types import Task

    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        json.dumps(deep)
    kept = valid_data({"answer": deep})
    assert nesting_depth(kept, limit=10 * MAX_DEPTH) == MAX_DEPTH  # the dict, 63 lists, in the last one a marker
    inner = kept["answer"]
    for _ in range(MAX_DEPTH - 2):
        [inner] = inner
    assert inner == ["[... a list nested too deep ...]"]
    task = Task(id="t", instruction="x")
    trajectory = Trajectory(task=task, termination="no_code", metrics={"answer": deep, "big": 1 << 20_000,
                                                                        "huge": "x" * 3_000_000,
                                                                        "wide": list(range(200_000))})
    assert trajectory.metrics["big"] == "[an integer of 20001 bits]"
    assert len(trajectory.metrics["huge"]) <= 1_000_000 and "truncated" in trajectory.metrics["huge"]
    assert trajectory.metrics["wide"][-1] == "[... values beyond the limit left out ...]"
    group = RolloutGroup(task_id="t", trajectories=[trajectory],
                         score=RuleRubricReward().score_group(task, [trajectory]))
    RolloutLog(tmp_path / "rollouts.jsonl").write([group], iteration=0)
    [record], torn = read_records(tmp_path / "rollouts.jsonl")
    assert torn == 0 and record["trajectory"]["metrics"]["big"] == "[an integer of 20001 bits]"
