"""TRACE: values, windowed TD rewards, terminal fill, mixing, and the batched reference scorer."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draco_gym.algos.credit import CREDIT_RULES, get_credit_rule
from draco_gym.algos.credit.trace import TraceOptions, trace_credit, trace_turn_rewards, trace_values
from draco_gym.types import GroupScore, Step, Task, Trajectory

# Hand example, T = 4 steps, eps = 0.1, K = 3, gamma = 0.8, lambda_term = 2, A_out = 1; the
# fill is lambda_term * gamma^(T-k+1) * A_out (the reference implementation's gamma^(T-t), t = k-1):
#   l       = [-2.0, -1.0, -1.0, -0.4, -0.1]
#   d = -l + 0.1 = [2.1, 1.1, 1.1, 0.5, 0.2]
#   V = log(2.1 / d) = [0, 0.646627, 0.646627, 1.435085, 2.351375]
#   delta_k = [log(2.1/1.1), 0, log(1.1/0.5), log(0.5/0.2)] = [0.646627, 0, 0.788457, 0.916291]
#   r_1: m = 3, (0.646627 + 0.8*0 + 0.64*0.788457) / 2.44 = 1.151240 / 2.44 = 0.471820 (1+3-1 < 4: no fill)
#   r_2: m = 3, (0 + 0.8*0.788457 + 0.64*0.916291) / 2.44 = 0.498849, + 2 * 0.8^3 * 1 = 1.522849
#   r_3: m = 2, (0.788457 + 0.8*0.916291) / 1.8 = 0.845272, + 2 * 0.8^2 * 1 = 2.125272
#   r_4: m = 1, 0.916291 + 2 * 0.8 * 1 = 2.516291
#   a_k = 1.0 * 1 + 0.2 * r_k = [1.094364, 1.304570, 1.425054, 1.503258]
L = [-2.0, -1.0, -1.0, -0.4, -0.1]


def test_values_by_hand():
    assert trace_values(L) == pytest.approx([0.0, 0.646627, 0.646627, 1.435085, 2.351375], abs=1e-6)


def test_turn_rewards_by_hand():
    r = trace_turn_rewards(trace_values(L), 1.0)
    assert r == pytest.approx([0.471820, 1.522849, 2.125272, 2.516291], abs=1e-6)


def test_credit_by_hand():
    assert trace_credit(L, 1.0) == pytest.approx([1.094364, 1.304570, 1.425054, 1.503258], abs=1e-6)
    # A_out = -0.5 changes the mix and the fill, not the deltas:
    #   a_2 = -0.5 + 0.2 * (0.498849 + 2 * 0.512 * -0.5) = -0.502630
    assert trace_credit(L, -0.5)[1] == pytest.approx(-0.502630, abs=1e-6)


def test_flat_reference_gives_outcome_only():
    # the reference never changes its mind: every delta is 0, only the outcome terms remain
    params = TraceOptions(K=2, gamma=0.5, lambda_term=1.0, alpha_out=1.0, alpha_turn=1.0)
    # T = 3: steps 2 and 3 reach the end (k + K - 1 >= 3): fills 0.5^2 and 0.5^1 of 2.0
    assert trace_credit([-1.0] * 4, 2.0, params) == pytest.approx([2.0, 2.0 + 0.5, 2.0 + 1.0])


def test_window_is_truncated_at_k():
    # a jump at step 4 reaches step 2 (within K = 3) but not step 1
    l = [-1.0, -1.0, -1.0, -1.0, -0.01, -0.01]
    r = trace_turn_rewards(trace_values(l), 0.0)
    assert r[0] == 0.0 and r[1] > 0 and r[2] > r[1] and r[3] > r[2]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-20, 0), min_size=2, max_size=12), st.floats(-3, 3), st.integers(1, 5))
def test_affine_in_the_outcome_advantage(logprobs, a_out, K):
    # a_k(A) = a_k(0) + A * (alpha_out + alpha_turn * lambda_term * gamma^(T-k+1) [k + K - 1 >= T])
    p = TraceOptions(K=K)
    T = len(logprobs) - 1
    base, moved = trace_credit(logprobs, 0.0, p), trace_credit(logprobs, a_out, p)
    for k in range(1, T + 1):
        slope = p.alpha_out + (p.alpha_turn * p.lambda_term * p.gamma ** (T - k + 1) if k + K - 1 >= T else 0.0)
        assert moved[k - 1] == pytest.approx(base[k - 1] + a_out * slope, abs=1e-9)


@pytest.mark.parametrize("bad, match", [([], "l_0"), ([-1.0, 0.5], r"answer_logprobs\[1\]"), ([-1.0, math.nan], r"answer_logprobs\[1\]")])
def test_bad_logprobs(bad, match):
    with pytest.raises(ValueError, match=match):
        trace_values(bad)


@pytest.mark.parametrize("field, value", [("eps", 0.0), ("K", 0), ("gamma", 1.5), ("alpha_turn", math.inf)])
def test_bad_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TraceOptions(**{field: value})


def test_registry_needs_a_reference():
    assert "trace" in CREDIT_RULES
    with pytest.raises(ValueError, match="reference"):
        get_credit_rule("trace")


def _traj(n_steps, answer="42"):
    steps = [Step(index=i, text=f"```python\nprint(add({i}, 3))\n```", code=f"print(add({i}, 3))",
                  observation=str(i + 3), n_tokens=5) for i in range(1, n_steps + 1)]
    task = Task(id="t", instruction="add things", agent_prompt="You are a helpful agent.", metadata={"answer": answer})
    return Trajectory(task=task, steps=steps)


def test_registry_rule_with_a_scorer():
    trajs = [_traj(4), _traj(4)]
    rule = get_credit_rule("trace", scorer=lambda t: L)
    assert rule(trajs, GroupScore(), [1.0, -0.5]) == [trace_credit(L, 1.0), trace_credit(L, -0.5)]
    with pytest.raises(ValueError, match="expected 4"):
        get_credit_rule("trace", scorer=lambda t: L)([_traj(3)], GroupScore(), [1.0])


# -- the reference model, on a tiny random Llama with a BPE trained here --------------------


@pytest.fixture(scope="module")
def tiny_lm():
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = ["You are a helpful agent. print(add(1, 3)) Final answer: 42", "Assistant: Output: 4 5 6 7"] * 10
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    return LlamaForCausalLM(cfg), tok


def _one_at_a_time(model, tok, traj, scorer):
    """l_k computed the slow way: one unpadded sequence per prefix, answer log-probs summed by hand."""
    import torch

    from draco_gym.algos.credit.trace import default_render

    answer = tok(traj.task.metadata["answer"], add_special_tokens=False)["input_ids"]
    out = []
    for k in range(len(traj.steps) + 1):
        ctx = [tok.bos_token_id] + tok(default_render(traj.task, traj.steps[:k]) + scorer.answer_prompt,
                                       add_special_tokens=False)["input_ids"]
        ctx = ctx[-(scorer.max_length - len(answer)):]
        ids = torch.tensor([ctx + answer])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        out.append(sum(float(logp[len(ctx) - 1 + i, a]) for i, a in enumerate(answer)) / len(answer))
    return out


@pytest.mark.parametrize("batch_size, max_length", [(3, 4096), (8, 40)])
def test_batched_scoring_matches_one_at_a_time(tiny_lm, batch_size, max_length):
    from draco_gym.algos.credit.trace import ReferenceScorer

    model, tok = tiny_lm
    scorer = ReferenceScorer(model, tok, batch_size=batch_size, max_length=max_length)
    traj = _traj(5)
    got = scorer(traj)
    assert len(got) == 6 and all(x < 0 for x in got)
    assert got == pytest.approx(_one_at_a_time(model, tok, traj, scorer), abs=1e-4)


def test_scorer_through_registry_and_missing_gold(tiny_lm):
    from draco_gym.algos.credit.trace import ReferenceScorer

    model, tok = tiny_lm
    rule = get_credit_rule("trace", reference_model=model, tokenizer=tok)
    out = rule([_traj(3)], GroupScore(), [0.7])
    assert out == [pytest.approx(trace_credit(ReferenceScorer(model, tok)(_traj(3)), 0.7))]
    no_gold = _traj(2).model_copy(update={"task": Task(id="x", instruction="?")})
    with pytest.raises(ValueError, match="answer"):
        rule([no_gold], GroupScore(), [0.1])
