"""In-process judges: schema-constrained decoding, the self-judge's k-sample unanimity, prompts
fitted by shortening the rollout's middle, and the thinking switch."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from draco_gym.reward import stages
from draco_gym.reward.answers import InvalidAnswer, answer_schema, check_fused, parse_answer
from draco_gym.reward.base import finalize_group
from draco_gym.reward.judge_client import JudgeClient, UsageMeter
from draco_gym.reward.judges import FunctionJudge, JudgeReply, JudgeUnavailable
from draco_gym.reward.render import render_task
from draco_gym.types import Criterion, Step, Task, Trajectory, Verdict

TASK = Task(id="sum", instruction="Add 2 and 3 with the add tool and submit the sum.")
TITLES = ["Submits the correct sum", "Calls the add tool", "Recovers from a tool error", "Reports the final answer"]
CRITERIA = [Criterion(title=t, description=f"{t}.", evaluator_instruction=f"Pass if the agent {t.lower()}.",
                      origin="instruction") for t in TITLES]
LABEL = {1: "PASS", -1: "FAIL", 0: "NOT_APPLICABLE"}


def rollout(n_steps: int = 3, observation: str = "ok") -> Trajectory:
    steps = [Step(index=i, text=f"step-marker-{i} " + "x" * 40, code="pass", observation=f"{observation} {i}")
             for i in range(1, n_steps + 1)]
    return Trajectory(task=TASK, steps=steps, termination="no_code")


class StageScript:
    """A judge answering each stage from a script: ``score`` per sample (a list of scores per
    criterion, or raw text), ``attribute`` one (verdict, steps) per criterion."""

    model = "scripted"

    def __init__(self, score: list, attribute: list[tuple[str, list[int]]]) -> None:
        self.score, self.attribute = score, attribute

    async def complete(self, messages, *, schema, schema_name, temperature, max_tokens, sample):
        if schema_name == "score":
            answer = self.score[sample]
            if isinstance(answer, str):
                return JudgeReply(answer)
            return JudgeReply(json.dumps({"verdicts": [
                {"criterion": t, "score": s, "evidence": f"sample {sample}", "justification": "j"}
                for t, s in zip(TITLES, answer, strict=True)]}))
        assert schema_name == "attribute", schema_name
        return JudgeReply(json.dumps({"attributions": [
            {"criterion": t, "verdict": v, "steps": steps, "reason": "lenient"}
            for t, (v, steps) in zip(TITLES, self.attribute, strict=True)]}))


def judged(judge, samples: int) -> tuple[list[Verdict], list[str]]:
    client = JudgeClient(judge, max_repairs=0, retries=0)
    fallbacks: list[str] = []
    rows = asyncio.run(stages.final_verdicts(client, UsageMeter(), fallbacks, render_task(TASK.instruction),
                                             CRITERIA, [rollout()], view=stages.View(), samples=samples))
    assert rows is not None
    return rows[0], fallbacks


# A lenient attribution: PASS on every criterion except "Calls the add tool", which it fails.
LENIENT = [("PASS", [2]), ("FAIL", [1]), ("PASS", [3]), ("PASS", [3])]


def test_attribution_cannot_pass_what_the_k_samples_did_not_all_pass():
    # per criterion over k = 3 samples: [P,P,F] -> FAIL; [P,P,P] -> PASS; [N,N,N] -> N/A; [P,P,P] -> PASS
    judge = StageScript([[1, 1, 0, 1], [1, 1, 0, 1], [-1, 1, 0, 1]], LENIENT)
    verdicts, fallbacks = judged(judge, samples=3)
    assert fallbacks == []
    # attribution's PASS cannot lift the combined FAIL or N/A; its FAIL does overrule a PASS
    assert [v.score for v in verdicts] == [-1, -1, 0, 1]
    assert [v.cited_steps for v in verdicts] == [[], [1], [], [3]]
    assert "[2/3 samples passed]" in verdicts[0].justification
    assert "attribution's PASS not taken" in verdicts[0].justification
    # hand-computed reward: p = 1, f = 2 -> R = (1 - 2) / 3
    group = finalize_group(CRITERIA, [verdicts], dropout=False)
    assert group.rewards == pytest.approx([-1 / 3])


def test_one_sample_attribution_stays_the_final_verdict():
    # the paper's separate stages with a frozen judge: attribution confirms or overrules
    verdicts, _ = judged(StageScript([[-1, 1, 0, 1]], LENIENT), samples=1)
    assert [v.score for v in verdicts] == [1, -1, 1, 1]


def test_a_failed_sample_counts_as_not_passing_and_is_recorded():
    # sample 2 is not JSON (no repairs): no criterion can pass; all N/A stays N/A
    judge = StageScript([[1, 1, 0, -1], "I think it passes", [1, 1, 0, 1]], [("PASS", [1])] * 4)
    verdicts, fallbacks = judged(judge, samples=3)
    assert [v.score for v in verdicts] == [-1, -1, 0, -1]
    assert "[2/3 samples passed, 1 failed]" in verdicts[0].justification
    assert len(fallbacks) == 1 and fallbacks[0].startswith("score[1]: sample 2 of 3 failed")
    assert "counted as not passing" in fallbacks[0]


def test_combine_samples_with_failed_samples():
    def v(score):
        return Verdict(criterion="c", score=score, cited_steps=[1] if score else [])

    assert stages.combine_samples([[v(1)], [v(1)], [v(1)]])[0].score == 1
    assert stages.combine_samples([[v(1)], None, [v(1)]])[0].score == -1
    assert stages.combine_samples([[v(0)], None, [v(0)]])[0].score == 0
    assert stages.combine_samples([None, [v(-1)], None])[0].score == -1
    with pytest.raises(ValueError, match="at least one answered sample"):
        stages.combine_samples([None, None, None])


# -- the policy as judge: prompt fitting and the thinking switch ------------------------------

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def fake_runner(tokenizer):
    """What PolicyJudge reads of an env runner to build a prompt."""
    return SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(policy=SimpleNamespace(model="tiny"))),
                           tokenizer=tokenizer)


def captured_messages(trajectory: Trajectory) -> list[dict[str, str]]:
    """The fused stage's messages for ``trajectory``, as the stage renders them."""
    seen = []

    def answer(messages):
        seen.append(messages)
        return json.dumps({"verdicts": [{"criterion": t, "verdict": "NOT_APPLICABLE", "steps": [], "evidence": "-",
                                         "justification": "-"} for t in TITLES]})

    client = JudgeClient(FunctionJudge(answer))
    asyncio.run(stages.score_attribute(client, UsageMeter(), render_task(TASK.instruction, "You are an agent."),
                                       CRITERIA, stages.View().render(trajectory), len(trajectory.steps)))
    return seen[0]


def test_policy_judge_shortens_the_rollout_middle_never_rules_task_or_criteria(tiny_tokenizer):
    from draco_gym.algos.policy.self_judge import PolicyJudge
    from draco_gym.reward.local_judge import PromptTooLong, chat_ids

    messages = captured_messages(rollout(40, observation="observation " + "y" * 300))
    full = len(chat_ids(tiny_tokenizer, messages))
    limit = full // 3
    judge = PolicyJudge(fake_runner(tiny_tokenizer), max_prompt_tokens=limit)
    ids = judge.prompt_ids(messages)
    assert len(ids) <= limit < full
    text = tiny_tokenizer.decode(ids)
    assert messages[0]["content"] in text  # every stage rule
    assert TASK.instruction in text and "You are an agent." in text
    for criterion in CRITERIA:
        assert criterion.title in text and criterion.evaluator_instruction in text
    assert "step-marker-1 " in text and "step-marker-40 " in text  # the rollout's start and end
    assert "step-marker-20 " not in text and "characters truncated" in text  # its middle went
    # what cannot shrink must fit: a clear error instead of a cut
    with pytest.raises(PromptTooLong, match="rules, task and rubric alone"):
        PolicyJudge(fake_runner(tiny_tokenizer), max_prompt_tokens=300).prompt_ids(messages)


def test_thinking_switch_reaches_the_chat_template(tiny_tokenizer):
    from draco_gym.algos.config import RewardSection
    from draco_gym.algos.policy.self_judge import build_trainer_reward

    tokenizer = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = THINKING_TEMPLATE
    messages = [{"role": "user", "content": "judge this"}]
    prompts = {}
    for switch in ("on", "off"):  # as a YAML config gives it; the paper's cheap variant is off + one call
        options = RewardSection(name="dynamic", options={"judge": {"name": "policy", "thinking": switch},
                                                         "self_judge": True, "score_samples": 1}).options
        reward = build_trainer_reward("dynamic", options, fake_runner(tokenizer))
        assert reward.samples == 1
        prompts[switch] = tokenizer.decode(reward.client.judge.prompt_ids(messages))
    assert prompts["off"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompts["on"].endswith("<|im_start|>assistant\n") and "<think>" not in prompts["on"]
    with pytest.raises(ValueError, match="judge.thinking"):
        RewardSection(name="dynamic", options={"judge": {"name": "policy", "thinking": "maybe"}})


# -- constrained decoding ------------------------------------------------------------------


def test_constrained_decoding_makes_a_random_model_answer_in_schema(tiny_model):
    from draco_gym.reward.judges import TransformersJudge

    judge = TransformersJudge(str(tiny_model))
    titles = TITLES[:2]
    schema = answer_schema("score_attribute", titles=titles, n_steps=3)
    messages = [{"role": "user", "content": "Score the attempt."}]

    def answer(constrained: bool, max_tokens: int = 400) -> str:
        judge.constrained = constrained
        return asyncio.run(judge.complete(messages, schema=schema, temperature=1.0, max_tokens=max_tokens)).text

    parsed = parse_answer("score_attribute", answer(True))  # raises InvalidAnswer if not schema-valid
    assert [v.criterion for v in parsed.verdicts] == titles
    assert all(1 <= s <= 3 for v in parsed.verdicts for s in v.steps)
    check_fused(parsed, titles, 3)  # every PASS or FAIL cites a step, NOT_APPLICABLE none
    with pytest.raises(InvalidAnswer):
        parse_answer("score_attribute", answer(False, max_tokens=80))
    # a budget that cannot hold the answer's skeleton (the tiny tokenizer spells keys out) says so
    with pytest.raises(JudgeUnavailable, match="raise the reward's max_tokens"):
        answer(True, max_tokens=150)


def test_constrained_thinking_reasons_freely_then_answers_in_schema(tmp_path):
    from draco_gym.algos.policy.models import build_tiny_llama
    from draco_gym.reward.judges import TransformersJudge

    path = build_tiny_llama(tmp_path / "thinker", added_tokens=["<think>", "</think>"])
    judge = TransformersJudge(str(path), thinking=True, thinking_tokens=12)
    schema = answer_schema("score", titles=TITLES[:1])
    reply = asyncio.run(judge.complete([{"role": "user", "content": "Score."}], schema=schema, temperature=1.0,
                                       max_tokens=120))
    parse_answer("score", reply.text)  # the reasoning is not part of the answer
    assert reply.completion_tokens > len(judge.tokenizer.encode(reply.text, add_special_tokens=False))


def test_a_constrained_title_cannot_run_on_as_one_endless_word():
    """A 135M self-judge wrote one endless "word" as a title until max_tokens cut its answer
    mid-string; the grammar bounds each word, so every title closes."""
    import re

    from draco_gym.reward.answers import answer_schema
    from draco_gym.reward.grammar import TITLE_WORD_CHARS, grammar_schema

    pattern = grammar_schema(answer_schema("propose", max_items=6), "propose")["properties"]["criteria"]["items"][
        "properties"]["title"]["pattern"]
    assert re.fullmatch(pattern, "Opens the right note")
    assert not re.fullmatch(pattern, "Opens " + "." * (TITLE_WORD_CHARS + 1) + " note")
    assert not re.fullmatch(pattern, "Two words")
