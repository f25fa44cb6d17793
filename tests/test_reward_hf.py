"""Local models: TransformersJudge on a tiny random Llama, and one real TRL GRPOTrainer
step whose reward is the full DRACO pipeline talking to a judge server over HTTP."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from judge_server import JudgeServer, RuleJudge  # noqa: E402
from reward_fixtures import TASK, group  # noqa: E402

from draco_gym.reward import DynamicRubricReward, JudgeReply, OpenAIJudge, TRLReward, build_judge  # noqa: E402

CORPUS = [
    "The agent books the cheapest flight and pays with the saved card.",
    '{"criteria": [{"title": "Finds the cheapest option", "verdict": "PASS", "steps": [1]}]}',
    "print(apis.spotify.search(query='a', page=1)) complete_task() Traceback KeyError",
] * 20


def tiny_llama(directory) -> str:
    """A ~100K-parameter random Llama with a byte-level BPE trained here, saved to disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32768,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_transformers_judge_returns_text_and_token_counts(model_dir):
    import asyncio

    judge = build_judge("transformers", model=model_dir, max_prompt_tokens=128)
    rollout = "<trajectory steps=\"1\">\n" + "x " * 200 + "\n</trajectory>"
    messages = [{"role": "system", "content": "Stage score: judge."}, {"role": "user", "content": rollout}]
    reply = asyncio.run(judge.complete(messages, schema=None, schema_name="score", temperature=0.0, max_tokens=8, sample=0))
    assert isinstance(reply, JudgeReply) and isinstance(reply.text, str)
    assert 64 < reply.prompt_tokens <= 128  # the rollout's middle shortened to the budget
    assert 1 <= reply.completion_tokens <= 8
    again = asyncio.run(judge.complete(messages, schema=None, schema_name="score", temperature=0.0, max_tokens=8, sample=0))
    assert again == reply  # greedy decoding is deterministic
    assert judge.identity == {"kind": "transformers", "model": model_dir, "revision": None, "constrained": True,
                              "thinking": None}


def test_a_weak_local_judge_ends_in_explicit_fallbacks(model_dir):
    """A random model decoding freely cannot write the JSON; every stage must fall back, visibly.
    (The fallback rubric, the paper's 21 static criteria, is over 8192 tokens in the tiny
    model's 400-token vocabulary: the prompt budget is raised so every stage is asked.)"""
    judge = build_judge("transformers", model=model_dir, constrained=False, max_prompt_tokens=32768)
    reward = DynamicRubricReward(judge, max_tokens=12, max_repairs=0, retries=0)
    result = reward.score_group(TASK, group()[:2])
    assert result.rewards == [0.0, 0.0]
    stages = [f.split(":")[0] for f in result.fallbacks]
    assert stages[0] == "propose" and "augment[1]" in stages and "merge" in stages and stages[-1] == "group"
    assert result.total_usage.calls == 1 + 2 + 1 + 2  # propose, augment x2, merge, score x2


def test_one_grpo_trainer_step_with_the_dynamic_rubric_reward(model_dir, tmp_path):
    """A real TRL GRPOTrainer step on CPU: the reward function runs the seven DRACO stages
    against an OpenAI-protocol judge server for each group of 4 completions."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")

    def passes(title: str, text: str) -> bool:
        return "e" in text.split("<trajectory", 1)[-1].split("</trajectory>", 1)[0] if title.startswith("Writes") else len(text) % 2 == 0

    judge_logic = RuleJudge(["Writes the letter e somewhere", "Has an even prompt length"], passes)
    dataset = datasets.Dataset.from_dict({"prompt": ["Book the cheapest flight.", "Like every song."], "task_id": ["f", "s"]})
    with JudgeServer(judge_logic) as server:
        judge = OpenAIJudge("test-judge", base_url=server.base_url, api_key="sk-test")
        reward = TRLReward(DynamicRubricReward(judge), num_generations=4)
        args = trl.GRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, num_generations=4, per_device_train_batch_size=4,
            max_steps=1, max_completion_length=12, report_to=[], logging_steps=1, save_strategy="no",
            temperature=1.0,
        )
        trainer = trl.GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=dataset)
        trainer.train()
    assert not server.errors
    assert reward.history, "the reward function was never called"
    for members, score in reward.history:
        assert len(members) == 4 and len(score.scores) == 4
        assert score.fallbacks == []
        assert all(math.isfinite(r) and -1 <= r <= 1 for r in score.rewards)
    assert server.calls("propose") >= 1 and server.calls("attribute") >= 4
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert any("draco_dynamic" in k for k in logged), sorted(logged)
