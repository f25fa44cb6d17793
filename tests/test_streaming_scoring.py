"""Scoring groups as they finish (``algos/policy/streaming.py``): the judge receives a
group's calls while the rollout loop still samples the other groups, and the rewards are
those of scoring every group after the rollout, in the same order. The judge is
tests/judge_server.py's rule-following judge over a real socket."""

from __future__ import annotations

import json
import time

import gymnasium as gym
import pytest

from draco_gym.algos.config import EpisodeLimits
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.policy.generation import Sample
from draco_gym.algos.policy.rollout import Episode, run_episodes
from draco_gym.algos.policy.streaming import GroupScorer, GroupWatch, uses_policy_judge
from draco_gym.reward import DynamicRubricReward, OpenAIJudge
from judge_server import JudgeServer, RuleJudge

MARKS = {"Names the striped animal": "zebra", "Names the orange fruit": "mango", "Names the green fruit": "kiwi"}
"""criterion -> the word a rollout must show (not in the rubric's own text, which the judge's prompt carries)"""
CRITERIA = list(MARKS)
G = 2
# SCRIPTS[k][m]: the turns of member m of group k. Group 0 ends at turn 1, group 2 at
# turn 2, group 1 at turn 3; each group's members differ, so each group's rewards differ
SCRIPTS = [
    [["zebra, done."], ["done."]],
    [["```python\nprint('mango')\n```", "```python\nprint('kiwi')\n```", "done."],
     ["```python\nprint('mango')\n```", "```python\nprint(1)\n```", "zebra, done."]],
    [["```python\nprint('mango')\n```", "done."], ["```python\nprint('kiwi')\n```", "zebra, done."]],
]


def passes(title: str, text: str) -> bool:
    return MARKS[title] in text


class GroupScriptedSampler:
    """Each episode plays its script, turn by turn (groups told apart by their task's
    prompt, members by their order). From turn ``wait_from_turn`` on it first waits for the
    judge to have received a call, and records how many it had: the judge at work while
    this rollout still samples. The wait ends as soon as a call arrives; its ceiling only
    guards against a hang (a loaded machine can take many seconds to get the call out)."""

    def __init__(self, chat: ChatFormat, starts: list[list[int]], server: JudgeServer | None = None,
                 wait_from_turn: int | None = None) -> None:
        self.chat, self.starts, self.server, self.wait_from_turn = chat, starts, server, wait_from_turn
        self.turn, self.judge_calls_seen = 0, []

    def sample(self, prompts, max_new_tokens, seed):
        self.turn += 1
        if self.wait_from_turn is not None and self.turn >= self.wait_from_turn:
            deadline = time.monotonic() + 300
            while not self.server.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            self.judge_calls_seen.append(len(self.server.requests))
        out, members = [], [0] * len(SCRIPTS)
        for prompt in prompts:  # the live episodes, in the rollout's order
            k = next(g for g, s in enumerate(self.starts) if prompt[: len(s)] == s)
            m, members[k] = members[k], members[k] + 1
            ids = self.chat.encode(SCRIPTS[k][m][self.turn - 1]) + [self.chat.eos_ids[0]]
            out.append(Sample(token_ids=ids, logprobs=[-1.0] * len(ids), ended_with_eos=True))
        return out


@pytest.fixture(scope="module")
def chat(tiny_model):
    from transformers import AutoTokenizer

    return ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(tiny_model))


@pytest.fixture(scope="module")
def envs():
    made = [gym.make("draco_gym/PythonTools-v0") for _ in range(len(SCRIPTS) * G)]
    yield made
    for env in made:
        env.close()


def rollout(chat, envs, on_done_for=None, server=None, wait_from_turn=None):
    """The groups' episodes through the trainer's loop; ``on_done_for(episodes, sampler)`` makes
    the loop's ``on_done``. Returns the trajectories and the sampler."""
    limits = EpisodeLimits(max_new_tokens=64, max_prompt_tokens=4096, max_response_tokens=4096)
    tasks = envs[0].unwrapped.task_ids[: len(SCRIPTS)]
    episodes = [Episode.start(env, chat, limits, task_id=tasks[k // G], seed=k) for k, env in enumerate(envs)]
    sampler = GroupScriptedSampler(chat, [list(episodes[g * G].tokens) for g in range(len(SCRIPTS))], server,
                                   wait_from_turn)
    on_done = on_done_for(episodes, sampler) if on_done_for else None
    return run_episodes(episodes, sampler, chat, limits, on_done=on_done), sampler


def reward_for(server: JudgeServer) -> DynamicRubricReward:
    return DynamicRubricReward(OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test"))


def test_run_episodes_reports_each_episode_once_in_the_turn_it_ends(chat, envs):
    ended: list[tuple[int, int, int]] = []
    trajs, _ = rollout(chat, envs, lambda episodes, sampler: lambda i: ended.append(
        (i, len(episodes[i].trajectory.steps), sampler.turn)))
    # (episode, its turns, turns sampled when reported): group 0 (episodes 0, 1) ends at
    # turn 1, group 2 (4, 5) at turn 2, group 1 (2, 3) at turn 3, each reported before the next turn
    assert ended == [(0, 1, 1), (1, 1, 1), (4, 2, 2), (5, 2, 2), (2, 3, 3), (3, 3, 3)]
    assert [len(t.steps) for t in trajs] == [1, 1, 3, 3, 2, 2]


def test_a_finished_group_is_judged_while_the_others_sample_and_rewards_match_sequential(chat, envs):
    with JudgeServer(RuleJudge(CRITERIA, passes), latency_s=0.05) as server:
        trajs, _ = rollout(chat, envs)
        groups = [trajs[g * G:(g + 1) * G] for g in range(len(SCRIPTS))]
        sequential_reward = reward_for(server)
        sequential = [sequential_reward.score_group(group[0].task, group) for group in groups]
        server.requests.clear()

        scorer = GroupScorer(reward_for(server), len(SCRIPTS))
        _, sampler = rollout(chat, envs, lambda episodes, _: GroupWatch(scorer, episodes, G), server, wait_from_turn=2)
        streamed = scorer.results()
    # turns 2 and 3 (groups 1 and 2 still sampling) began with group 0's calls at the judge
    assert len(sampler.judge_calls_seen) == 2 and all(n > 0 for n in sampler.judge_calls_seen)
    assert [s.rewards for s in streamed] == [s.rewards for s in sequential]
    verdicts = lambda scores: [[[(v.criterion, v.score, tuple(v.cited_steps)) for v in ts.verdicts] for ts in s.scores]
                               for s in scores]  # noqa: E731
    assert verdicts(streamed) == verdicts(sequential)
    assert len({tuple(s.rewards) for s in streamed}) == len(SCRIPTS), "each group's rewards differ: order counts"


def test_results_name_a_group_never_handed_over():
    scorer = GroupScorer(reward=object(), n_groups=2)
    with pytest.raises(RuntimeError, match=r"groups \[0, 1\] were never handed over"):
        scorer.results()


def test_a_self_judge_is_found_anywhere_in_the_reward_options():
    assert uses_policy_judge({"judge": "policy"})
    assert uses_policy_judge({"parts": [{"name": "outcome"}, {"name": "dynamic", "options": {"judge": {"name": "policy"}}}]})
    assert not uses_policy_judge({"judge": {"name": "openai", "model": "m"}})


def _by_length(title: str, text: str) -> bool:
    """Criterion k passes when bit k of the prompt's length is set: deterministic in the
    rollout (the prompt's fence code is random but of fixed length), independent across
    criteria, so rollouts of different lengths get different rewards."""
    return bool((len(text) >> CRITERIA.index(title)) & 1)


@pytest.mark.slow
def test_grpo_iterations_score_the_same_streaming_and_sequential(ray_session, tiny_model, tmp_path, monkeypatch):
    """The trainer end to end: the same seeded iterations with ``rollout.scoring``
    sequential and streaming give the same episode returns and judge calls."""
    from grpo_fixtures import make_config

    monkeypatch.setenv("STREAM_JUDGE_KEY", "sk-test")
    results = {}
    with JudgeServer(RuleJudge(CRITERIA, _by_length), latency_s=0.05) as server:
        judge = {"name": "openai", "model": "test-judge", "base_url": server.base_url, "api_key_env": "STREAM_JUDGE_KEY"}
        for mode in ("sequential", "streaming"):
            algo = make_config(tiny_model, tmp_path / mode).training(
                reward="dynamic", reward_options={"judge": judge}, scoring=mode).build_algo()
            try:
                results[mode] = [algo.train() for _ in range(2)]
            finally:
                algo.stop()
    for seq, stream in zip(results["sequential"], results["streaming"]):
        for key in ("episode_return_mean", "episode_return_min", "episode_return_max", "episode_return_std"):
            assert stream["env_runners"][key] == pytest.approx(seq["env_runners"][key], abs=1e-12), key
        assert stream["judge"]["calls"] == seq["judge"]["calls"]
    assert results["sequential"][0]["env_runners"]["episode_return_std"] > 0, ("rewards must differ to compare",
                                                                          results["sequential"][0]["judge"])

    def rewards(mode: str) -> list[tuple]:  # every rollout's reward, in the logged order
        lines = (tmp_path / mode / "rollouts.jsonl").read_text().splitlines()
        return [(r["iteration"], r["task_id"], r["index"], r["score"]["reward"]) for r in map(json.loads, lines)]
    assert rewards("streaming") == rewards("sequential")
