"""The judge against a real server that no one here wrote: llama.cpp's OpenAI-compatible
server (llama-cpp-python[server], the ``llamacpp`` extra) serving the shipped SmolLM2-135M
GGUF on 127.0.0.1. One probe tells the judge it is llama-cpp-python: one slot, llama.cpp's
json_object + schema form. The demo's scripted group is scored in separate and fused mode
with no fallback from a format error: decoding under the schema's grammar, even a 135M model
answers in the right shape (what it says may still break a rubric rule; those are listed)."""

from __future__ import annotations

import time

import pytest
from llama_server import LlamaServer, LlamaServerMissing
from reward_fixtures import FORMAT_ERRORS

from draco_gym.algos.cli.demo import scripted_episodes
from draco_gym.reward import DynamicRubricReward, OpenAIJudge
from draco_gym.reward.judge_servers import server_profile


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_server():
    try:
        with LlamaServer() as server:
            yield server
    except LlamaServerMissing as exc:
        pytest.skip(str(exc))


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", ["fused", "separate"])
def test_llama_cpp_server_scores_a_group_without_format_fallbacks(llama_server, mode):
    base_url = llama_server.base_url
    episodes = scripted_episodes()
    judge = OpenAIJudge("smollm2-135m-instruct", base_url=base_url, api_key="sk-local", request_timeout_s=300)
    reward = DynamicRubricReward(judge, mode=mode, max_tokens=1024, deadline_s=1800, retries=0)
    start = time.perf_counter()
    result = reward.score_group(episodes[0].task, episodes)
    elapsed = time.perf_counter() - start
    profile = server_profile(base_url)
    calls = {stage: usage.calls for stage, usage in result.usage.items()}
    print(f"\n{mode}: {elapsed:.0f} s, rewards {result.rewards}, {len(result.criteria)} criteria, "
          f"fallbacks {result.fallbacks}, calls {calls}")
    assert (profile.family, profile.format, profile.slots) == ("llama-cpp-python", "json_object_schema", 1)
    format_fallbacks = [f for f in result.fallbacks if any(e in f for e in FORMAT_ERRORS)]
    assert format_fallbacks == [], format_fallbacks
    # scored against the judge's rubric (criteria kept, or all dropped by discriminative
    # dropout when no rollout failed one: a 135M judge's verdicts may not separate them),
    # not set to 0 for want of a rubric or a rollout's verdicts
    assert result.criteria or result.dropped, "the group was scored against a rubric"
    assert not any(f.startswith("group:") for f in result.fallbacks), result.fallbacks
    assert "disconnected" not in llama_server.log_text()  # one request at a time: no answer cut short
