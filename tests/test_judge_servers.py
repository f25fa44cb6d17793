"""The judge against each server family users run (their structured-output dialects, error
bodies, slots and streaming, as tests/judge_server.py reproduces them): the form chosen after
one probe, the step-down on any refusal that names the response format, the memory per
base URL, a forced form, no re-sent work after a timeout, and one request at a time for a
one-slot server."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from judge_server import DIALECTS, JudgeServer, ScriptedJudge, look_around_error
from reward_fixtures import MARKERS, TASK, assert_hand_computed, group, script

from draco_gym.reward import DynamicRubricReward, OpenAIJudge
from draco_gym.reward.judge_servers import server_profile

# the form each family takes first time, and how many refusals it costs to get there
FIRST_FORM = {
    "openai": ("json_schema", 0),
    "vllm": ("json_schema", 0),
    "sglang": ("json_schema", 0),
    "ollama": ("json_schema", 0),
    "llama_cpp_python": ("json_object_schema", 0),
    "llama_server": ("json_object_schema", 0),
    "plain": ("none", 3),  # an unknown family walks the whole ladder, once
}


def make_reward(server: JudgeServer, mode: str = "separate", judge_options: dict | None = None, **options):
    judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test", request_timeout_s=5,
                        max_retries=1, **(judge_options or {}))
    options.setdefault("retry_wait_s", 0.01)
    return DynamicRubricReward(judge, mode=mode, **options)


def refusals(server: JudgeServer) -> list:
    return [r for r in server.requests if r.status >= 400]


def sent_forms(server: JudgeServer) -> set[str]:
    out = set()
    for r in server.requests:
        f = r.response_format or {}
        out.add("none" if not f else "json_object_schema" if "schema" in f else f["type"])
    return out


def uncapped_strings(schema) -> list:
    """Free-text strings of a schema without a maxLength."""
    if isinstance(schema, list):
        return [s for v in schema for s in uncapped_strings(v)]
    if not isinstance(schema, dict):
        return []
    own = [schema] if schema.get("type") == "string" and "enum" not in schema and "maxLength" not in schema else []
    return own + [s for v in schema.values() for s in uncapped_strings(v)]


def test_every_family_is_covered():
    assert set(FIRST_FORM) == set(DIALECTS)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_server_family_scores_a_group_after_one_probe(dialect):
    form, n_refused = FIRST_FORM[dialect]
    with JudgeServer(ScriptedJudge(script()), dialect=dialect) as server:
        reward = make_reward(server)
        result = reward.score_group(TASK, group())
        again = reward.score_group(TASK, group())  # remembered: no second probe, no refusal
    assert result.fallbacks == [] and again.fallbacks == []
    assert_hand_computed(result)
    assert reward.client.judge.format == form
    assert len(refusals(server)) == n_refused
    assert server.probes.count("/v1/models") == 1
    accepted = [r for r in server.requests if r.status == 200]
    assert {("none" if not r.response_format else "json_object_schema" if "schema" in r.response_format
             else r.response_format["type"]) for r in accepted} == {form}


def test_llama_cpp_python_500_naming_the_format_steps_down_and_is_remembered(caplog):
    """Without a probe to go by (no /v1/models), the first request is json_schema; the
    server's 500 internal_server_error names response_format.type, so the judge steps down to
    llama.cpp's json_object + schema, logs it once, and a new judge for the same URL starts there."""
    with JudgeServer(ScriptedJudge(script()), dialect="llama_cpp_python", models_endpoint=False) as server:
        with caplog.at_level(logging.WARNING, logger="draco_gym.reward.judge_servers"):
            result = make_reward(server, judge_options={"slots": 1}).score_group(TASK, group())
            before = len(server.requests)
            other = make_reward(server, judge_options={"slots": 1}).score_group(TASK, group())
    assert result.fallbacks == [] and other.fallbacks == []
    assert_hand_computed(result)
    (refused,) = refusals(server)
    assert refused.status == 500 and refused.response_format["type"] == "json_schema"
    assert all(r.response_format == {"type": "json_object", "schema": r.response_format["schema"]}
               for r in server.requests if r.status == 200)
    # strings are capped, so the grammar ends every answer before max_tokens cuts it off
    assert all(uncapped_strings(r.response_format["schema"]) == [] for r in server.requests if r.status == 200)
    assert all(r.status == 200 for r in server.requests[before:])
    steps = [m for m in caplog.messages if "refused structured output" in m]
    assert len(steps) == 1 and "now sending json_object_schema" in steps[0]
    assert server_profile(server.base_url).format == "json_object_schema"


def test_llama_server_400_steps_down_and_its_slots_come_from_props():
    with JudgeServer(ScriptedJudge(script()), dialect="llama_server", slots=2, token_s=0.002) as server:
        reward = make_reward(server, max_concurrency=16)
        result = reward.score_group(TASK, group())
    assert result.fallbacks == []
    assert "/props" in server.probes and server_profile(server.base_url).slots == 2
    assert server.max_open == 2  # two slots: two requests at a time, never more


@pytest.mark.parametrize("mode", ["separate", "fused"])
def test_a_one_slot_server_gets_one_request_at_a_time(mode):
    """llama-cpp-python serves one request at a time and cuts a streaming answer short when
    another request arrives; the client must never have two open."""
    with JudgeServer(ScriptedJudge(script(mode)), dialect="llama_cpp_python", token_s=0.002) as server:
        result = make_reward(server, mode, max_concurrency=16).score_group(TASK, group())
    assert result.fallbacks == []
    assert_hand_computed(result)
    assert server.max_open == 1
    assert not any(r.interrupted for r in server.requests)


def _rollout(record) -> str | None:
    return next((m for m in MARKERS if m in record.messages[1]["content"]), None)


def test_a_one_slot_server_gets_each_attribute_call_right_after_its_rollouts_score_call():
    """llama-cpp-python keeps only its last prompt's KV cache: the client sends a rollout's
    attribute call straight after its score call (which shares the rules, task, rollout and
    rubric), not after the other rollouts' score calls."""
    with JudgeServer(ScriptedJudge(script()), dialect="llama_cpp_python", token_s=0.002) as server:
        result = make_reward(server).score_group(TASK, group())
    assert result.fallbacks == []
    assert_hand_computed(result)
    verdict_calls = [(r.stage, _rollout(r)) for r in server.requests if r.stage in ("score", "attribute")]
    assert len(verdict_calls) == 6
    for (stage, rollout), (next_stage, next_rollout) in zip(verdict_calls[::2], verdict_calls[1::2], strict=True):
        assert (stage, next_stage, next_rollout) == ("score", "attribute", rollout), verdict_calls


def test_two_rewards_on_one_one_slot_server_send_one_request_at_a_time():
    """The slot limit belongs to the server (its base URL), not to one client: two rewards
    scoring at once on a llama-cpp-python server never have two requests open."""
    with JudgeServer(ScriptedJudge(script()), dialect="llama_cpp_python", token_s=0.002) as server:
        first, second = make_reward(server), make_reward(server)

        async def both():
            return await asyncio.gather(first.ascore_group(TASK, group()), second.ascore_group(TASK, group()))

        results = asyncio.run(both())
    assert [r.fallbacks for r in results] == [[], []]
    assert server.max_open == 1
    assert not any(r.interrupted for r in server.requests)


def test_a_forced_form_is_sent_as_is_and_never_stepped_down():
    with JudgeServer(ScriptedJudge(script()), dialect="vllm") as server:
        result = make_reward(server, judge_options={"structured_output": "json_object_schema"}).score_group(TASK, group())
    assert result.fallbacks == [] and sent_forms(server) == {"json_object_schema"}

    with JudgeServer(ScriptedJudge(script()), dialect="llama_cpp_python") as server:
        result = make_reward(server, judge_options={"structured_output": "json_schema"},
                             retries=2).score_group(TASK, group())
    assert result.fallbacks[0].startswith("propose: ") and "refuses structured_output='json_schema'" in result.fallbacks[0]
    assert sent_forms(server) == {"json_schema"}  # forced: refused, but never stepped down
    assert server.calls("propose", status=None) == 1  # and a refusal is not retried by any layer
    assert server_profile(server.base_url).format == "json_object_schema"  # the probe still knows better


LOOK_BEHIND = {"type": "object", "properties": {"name": {"type": "string", "pattern": "(?<=a)b"}}, "required": ["name"]}
"""A schema vLLM's grammar compiler refuses (the one tests/test_vllm.py sends the live server)."""


def _refused_or_error_event(server: JudgeServer) -> list:
    return [r for r in server.requests if r.status >= 400 or r.error_event is not None]


@pytest.mark.parametrize("stream", [False, True])
def test_vllms_grammar_refusal_steps_down_the_same_streamed_or_not(stream, caplog):
    """vLLM refuses a json_schema its grammar compiler cannot take with a 400 when unstreamed;
    streamed, it answers 200 and the stream's one event is the same error body. Either way the
    judge steps down to json_object + schema once, logs that step, and the group is scored
    with no fallback and no failed judge request."""
    refuses_every_schema = lambda schema: look_around_error(LOOK_BEHIND)  # noqa: E731
    with JudgeServer(ScriptedJudge(script()), dialect="vllm", grammar_error=refuses_every_schema) as server:
        with caplog.at_level(logging.WARNING, logger="draco_gym.reward.judge_servers"):
            result = make_reward(server, judge_options={"stream": stream}).score_group(TASK, group())
    assert result.fallbacks == [] and result.judge_failures == []
    assert_hand_computed(result)
    (refused,) = _refused_or_error_event(server)
    assert refused.response_format["type"] == "json_schema"
    if stream:
        assert refused.status == 200 and refused.error_event["error"]["message"].startswith("Grammar error: regex parse error")
    else:
        assert refused.status == 400 and refused.error_event is None
    assert sent_forms(server) == {"json_schema", "json_object_schema"}
    assert all(r.response_format["type"] == "json_object" for r in server.requests if r is not refused)
    steps = [m for m in caplog.messages if "refused structured output" in m]
    assert len(steps) == 1 and "Grammar error" in steps[0] and steps[0].endswith("now sending json_object_schema")
    assert server_profile(server.base_url).format == "json_object_schema"


def test_a_look_behind_pattern_streamed_to_vllm_steps_down_and_a_forced_form_is_refused():
    """The live server's case (tests/test_vllm.py), streamed: the refusal arrives as an error
    event inside a 200 stream; the judge resends in the next form and gets an answer. A judge
    forced to json_schema gets FormatRefused, sent once."""
    from draco_gym.reward.judges import FormatRefused

    ask = [{"role": "user", "content": "A JSON object with a name, please."}]
    with JudgeServer(ScriptedJudge({None: {"name": "ab"}}), dialect="vllm") as server:
        judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test", request_timeout_s=5)
        reply = asyncio.run(judge.complete(ask, schema=LOOK_BEHIND, schema_name="probe", temperature=0.1, max_tokens=40))
        assert json.loads(reply.text) == {"name": "ab"}
        assert [(r.status, r.error_event is not None, r.response_format["type"]) for r in server.requests] == \
            [(200, True, "json_schema"), (200, False, "json_object")]
        assert server_profile(server.base_url).format == "json_object_schema"

        server.reset_log()
        forced = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test", request_timeout_s=5,
                             structured_output="json_schema")
        with pytest.raises(FormatRefused, match="refuses structured_output='json_schema'.*Grammar error"):
            asyncio.run(forced.complete(ask, schema=LOOK_BEHIND, schema_name="probe", temperature=0.1, max_tokens=40))
        assert len(server.requests) == 1


def test_an_error_event_that_names_no_response_format_fails_the_call_without_a_step_down():
    """vLLM breaks a streamed answer off with an error event when generation fails (an
    InternalServerError, no format named): the stage fails, is not re-sent, and the server
    keeps its json_schema form."""
    with JudgeServer(ScriptedJudge(script()), dialect="vllm") as server:
        server.inject("stream_error", stage="propose")
        result = make_reward(server).score_group(TASK, group())
    assert result.fallbacks and result.fallbacks[0].startswith("propose: ")
    assert "Internal server error" in result.fallbacks[0]
    (broken,) = _refused_or_error_event(server)
    assert broken.stage == "propose" and broken.error_event["error"]["type"] == "InternalServerError"
    assert server.calls("propose", status=None) == 1
    assert server_profile(server.base_url).format == "json_schema"


def test_a_timed_out_unstreamed_request_is_not_resent():
    """Not streamed, a request the client gave up on keeps the server busy to its end: no
    retry layer (the openai client's, the judge's, the client's) may send it again."""
    with JudgeServer(ScriptedJudge(script()), dialect="vllm", token_s=0.2) as server:
        judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="k", request_timeout_s=0.5,
                            max_retries=3, stream=False)
        result = DynamicRubricReward(judge, retries=3, retry_wait_s=0.01).score_group(TASK, group())
    assert result.fallbacks and result.fallbacks[0].startswith("propose: ")
    assert "not re-sent" in result.fallbacks[0]
    assert server.calls("propose", status=None) == 1


def test_a_streamed_request_given_up_on_stops_the_server_before_it_is_resent():
    """Streamed, the client's deadline closes the connection; the server stops computing
    (aborted), and only then does the retry start: never two copies computing at once."""
    with JudgeServer(ScriptedJudge(script()), dialect="vllm", token_s=0.05) as server:
        judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="k", request_timeout_s=5)
        result = DynamicRubricReward(judge, deadline_s=0.4, retries=1, retry_wait_s=0.3, max_concurrency=1) \
            .score_group(TASK, group())
    assert result.fallbacks and result.fallbacks[0].startswith("propose: ")
    propose = [r for r in server.requests if r.stage == "propose"]
    assert len(propose) == 2 and all(r.aborted for r in propose)
    # It stopped soon after the 0.4 s deadline, long before the whole answer (107 pieces of
    # 0.05 s: 5.3 s); the margin is a loaded machine's, the order below is exact.
    assert propose[0].end - propose[0].start < 2.0
    assert propose[0].end <= propose[1].start  # and before the retry (after its backoff) began
    copies: dict[str, list] = {}
    for r in server.requests:
        copies.setdefault(json.dumps(r.messages), []).append(r)
    assert any(len(c) > 1 for c in copies.values())
    for same in copies.values():  # no request is computed twice at once
        assert all(a.end <= b.start for a, b in zip(same, same[1:]))


def _prompt(record) -> str:
    return "\n".join(m["content"] for m in record.messages)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


@pytest.mark.parametrize("mode", ["separate", "fused"])
def test_a_rollouts_calls_share_the_rules_task_and_rollout_as_prefix(mode):
    """What repeats comes first: every call of a rollout (augment, score, attribute or the
    fused score_attribute) starts with the same judge rules, task and rollout, which a
    server's prompt cache then reuses; the stage's own text comes after."""
    from draco_gym.bench.judge_pipeline import prefix_share

    with JudgeServer(ScriptedJudge(script(mode))) as server:
        result = make_reward(server, mode).score_group(TASK, group())
    assert result.fallbacks == []
    stages = ("augment", "score", "attribute") if mode == "separate" else ("augment", "score_attribute")
    for marker in ("ROLL-A", "ROLL-B", "ROLL-C"):
        calls = [_prompt(r) for r in server.requests if r.stage in stages and marker in r.messages[1]["content"]
                 and r.stage != "merge"]
        assert len(calls) == len(stages)
        shared = calls[0]
        for other in calls[1:]:
            shared = _common_prefix(shared, other)
        assert TASK.instruction in shared and marker in shared and shared.rstrip().endswith("</trajectory>")
    share, _ = prefix_share([r.messages for r in server.requests], lambda m: list(json.dumps(m)))
    assert share >= 0.5, share


TITLES = ["Finds the cheapest flight", "Books exactly one ticket", "Pays with the saved card"]


@pytest.mark.parametrize("stage", ["propose", "augment", "merge"])
def test_llama_cpp_grammar_holds_criterion_titles_to_the_title_rule(stage):
    """The form llama.cpp decodes under: a title is 3 to 8 words, each starting with a letter
    or digit (SmolLM2 copied the prompt's "..." as titles under the bare schema), and no
    quote or backslash can end the JSON string early."""
    import re

    from draco_gym.reward.answers import answer_schema
    from draco_gym.reward.grammar import grammar_ready

    schema = grammar_ready(answer_schema(stage, max_items=10), stage, 1024)
    title = re.compile(schema["properties"]["criteria"]["items"]["properties"]["title"]["pattern"])
    assert all(title.fullmatch(t) for t in [*TITLES, "Reads all 3 pages: API paginates"])
    for bad in ["...", "... ... ...", "Two words", 'Says "done" without checking', "A b c d e f g h i", "Tab\tin title"]:
        assert not title.fullmatch(bad), bad
    assert uncapped_strings(schema) == []
    assert schema["properties"]["criteria"]["items"]["additionalProperties"] is False


@pytest.mark.parametrize("stage", ["score", "attribute", "score_attribute"])
def test_llama_cpp_grammar_asks_one_verdict_per_criterion_in_order_and_fits_max_tokens(stage):
    from draco_gym.reward.answers import answer_schema
    from draco_gym.reward.grammar import grammar_ready

    schema = grammar_ready(answer_schema(stage, titles=TITLES, n_steps=4), stage, 1024)
    (array,) = schema["properties"].values()
    items = array["prefixItems"]
    consts = [(i.get("anyOf") or [i])[0]["properties"]["criterion"]["const"] for i in items]
    assert consts == TITLES and array["items"] is False
    # step numbers as an enum: llama-cpp-python's converter ignores minimum and maximum
    if stage != "score":
        steps = [(i.get("anyOf") or [i])[0]["properties"]["steps"]["items"] for i in items]
        assert all(s == {"enum": [1, 2, 3, 4]} for s in steps), steps
    # a rubric of 15 criteria: each text gets less room in 1024 tokens than in 4096, never under 60 characters
    fifteen = [f"Criterion number {k} holds" for k in range(15)]
    caps = {limit: {s["maxLength"] for s in _strings(grammar_ready(answer_schema(stage, titles=fifteen, n_steps=4),
                                                                    stage, limit))} for limit in (1024, 4096)}
    assert 60 <= min(caps[1024]) and max(caps[1024]) < max(caps[4096]) <= 300, caps


def _strings(schema) -> list:
    if isinstance(schema, list):
        return [s for v in schema for s in _strings(v)]
    if not isinstance(schema, dict):
        return []
    own = [schema] if schema.get("type") == "string" and "maxLength" in schema else []
    return own + [s for v in schema.values() for s in _strings(v)]


def test_llama_cpp_compiles_every_stage_grammar():
    """llama-cpp-python falls back to plain JSON, silently, when a schema does not compile;
    every stage's grammar must compile (runs where the llamacpp extra is installed)."""
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    from draco_gym.reward.answers import answer_schema
    from draco_gym.reward.grammar import grammar_ready
    from draco_gym.reward.stages import SEGMENT_SCHEMA

    for stage, options in [("propose", {"max_items": 15}), ("augment", {"max_items": 10}), ("merge", {"max_items": 24}),
                           ("score", {"titles": TITLES, "n_steps": 5}), ("attribute", {"titles": TITLES, "n_steps": 5}),
                           ("score_attribute", {"titles": TITLES, "n_steps": 5})]:
        for max_tokens in (1024, 4096):
            schema = grammar_ready(answer_schema(stage, **options), stage, max_tokens)
            grammar.LlamaGrammar.from_string(grammar.json_schema_to_gbnf(json.dumps(schema)), verbose=False)
    grammar.LlamaGrammar.from_string(grammar.json_schema_to_gbnf(json.dumps(grammar_ready(SEGMENT_SCHEMA, "segment", 1024))),
                                     verbose=False)


def test_llama_cpp_grammar_shortens_an_open_criteria_list_that_would_not_fit_max_tokens():
    """SmolLM2 under llama.cpp's grammar kept adding merged criteria until max_tokens cut the
    JSON (the live run's merge fallback): the grammar allows only as many criteria as fit,
    each text at least 60 characters."""
    from draco_gym.reward.answers import answer_schema
    from draco_gym.reward.grammar import grammar_ready

    for stage, limit in (("propose", 15), ("augment", 10), ("merge", 24)):
        small = grammar_ready(answer_schema(stage, max_items=limit), stage, 1024)
        large = grammar_ready(answer_schema(stage, max_items=limit), stage, 16384)
        assert 1 <= small["properties"]["criteria"]["maxItems"] < limit == large["properties"]["criteria"]["maxItems"]
        assert min(s["maxLength"] for s in _strings(small)) >= 60
        # the longest answer the grammar allows, at ~3 characters a token, fits 1024 tokens
        longest = small["properties"]["criteria"]["maxItems"] * sum(
            s["maxLength"] + 20 for s in _strings(small["properties"]["criteria"]["items"])
            for _ in range(1 if s is not small["properties"]["criteria"]["items"]["properties"].get("grounding_references", {}).get("items") else 4))
        assert longest / 3 < 1024, longest
