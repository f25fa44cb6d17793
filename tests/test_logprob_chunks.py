"""The learner's log-probs, computed chunk by chunk over the policy tokens: the same values and
gradients as one full log-softmax, and never more than a chunk's logits at once."""

from __future__ import annotations

import math

import pytest
import torch

from draco_gym.algos.policy.lm import chosen_logprobs, decoder_and_head, token_logprobs
from draco_gym.algos.policy.models import build_tiny_llama
from draco_gym.algos.rllib.module import HFPolicyModule


def identity_head(vocab: int, trainable: bool = False) -> torch.nn.Linear:
    head = torch.nn.Linear(vocab, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(vocab))
    head.weight.requires_grad_(trainable)
    return head


def test_worked_logprobs_at_two_temperatures():
    """Logits [0, ln 2, ln 5]: softmax (1, 2, 5) / 8. At T = 2 the logits halve: (1, sqrt 2, sqrt 5)."""
    row = torch.tensor([0.0, math.log(2.0), math.log(5.0)])
    hidden = torch.stack([row, row, row])
    chosen = torch.tensor([2, 0, 1])
    lp = chosen_logprobs(hidden, identity_head(3), chosen, temperature=1.0, chunk_tokens=2)
    assert torch.allclose(lp, torch.log(torch.tensor([5 / 8, 1 / 8, 2 / 8])), atol=1e-6)
    z = 1 + math.sqrt(2) + math.sqrt(5)
    lp = chosen_logprobs(hidden, identity_head(3), chosen, temperature=2.0, chunk_tokens=1)
    assert torch.allclose(lp, torch.log(torch.tensor([math.sqrt(5) / z, 1 / z, math.sqrt(2) / z])), atol=1e-6)


@pytest.mark.parametrize("trainable", [False, True], ids=["frozen head", "trainable head"])
def test_worked_gradient_is_onehot_minus_softmax(trainable):
    """d log p_y / d logits = (onehot(y) - softmax) / T: with a frozen head taken in the
    forward, with a trainable one through the chunk's recomputation (and then the head's own
    gradient, the outer product with the hidden row, too). Two rows, two chunks, upstream
    weights 1 and 3, T = 1 and 2."""
    row = [0.0, math.log(2.0), math.log(5.0)]
    for temperature, probs in ((1.0, [1 / 8, 2 / 8, 5 / 8]),
                               (2.0, [x / (1 + math.sqrt(2) + math.sqrt(5)) for x in (1, math.sqrt(2), math.sqrt(5))])):
        hidden = torch.tensor([row, row], requires_grad=True)
        head = identity_head(3, trainable)
        lp = chosen_logprobs(hidden, head, torch.tensor([2, 0]), temperature=temperature, chunk_tokens=1)
        (lp * torch.tensor([1.0, 3.0])).sum().backward()
        p = torch.tensor(probs)
        expected = torch.stack([torch.tensor([0.0, 0.0, 1.0]) - p, 3 * (torch.tensor([1.0, 0.0, 0.0]) - p)]) / temperature
        assert torch.allclose(hidden.grad, expected, atol=1e-6)
        if trainable:
            assert torch.allclose(head.weight.grad, expected.T @ hidden.detach(), atol=1e-6)


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chosen_logprobs(torch.zeros(2, 3), identity_head(3), torch.tensor([0, 1]), chunk_tokens=0)


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"))
    return HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                          model_config={"model": str(path), "lora": {"r": 4, "alpha": 8}})


def batch(module):
    vocab = decoder_and_head(module.lm)[1].weight.shape[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(vocab, (3, 24), generator=g)
    attention = torch.ones_like(ids)
    attention[2, 19:] = 0
    policy = torch.zeros(3, 24)
    policy[:, 6:14] = 1
    policy[1, 16:22] = 1
    policy[2, 15:19] = 1
    return ids, attention, policy


def unchunked(lm, ids, attention, policy, temperature):
    """The textbook expression: the whole batch's logits, one log-softmax."""
    logits = lm(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logp[policy[:, 1:].bool()]


def lora_grads(lm):
    return torch.cat([p.grad.flatten() for p in lm.parameters() if p.requires_grad])


@pytest.mark.parametrize("chunk_tokens", [1, 5, 10_000])
def test_chunked_values_and_gradients_equal_the_full_log_softmax(module, chunk_tokens):
    lm = module.lm
    with torch.no_grad():  # off LoRA's zero start, so its A matrices get a gradient too
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    ids, attention, policy = batch(module)
    weights = torch.linspace(-1.0, 1.0, int(policy[:, 1:].sum()))

    lm.zero_grad(set_to_none=True)
    full = unchunked(lm, ids, attention, policy, temperature=0.7)
    (full * weights).sum().backward()
    full_grad = lora_grads(lm)

    lm.zero_grad(set_to_none=True)
    lp = token_logprobs(lm, ids, attention, policy, temperature=0.7, chunk_tokens=chunk_tokens)
    (lp * weights).sum().backward()
    assert torch.allclose(lp, full, atol=1e-5)
    assert torch.allclose(lora_grads(lm), full_grad, atol=1e-6, rtol=1e-4)
    assert full_grad.abs().sum() > 0

    with torch.no_grad(), lm.disable_adapter():  # the reference pass
        assert torch.allclose(token_logprobs(lm, ids, attention, policy, chunk_tokens=chunk_tokens),
                              unchunked(lm, ids, attention, policy, temperature=1.0), atol=1e-5)


@pytest.mark.parametrize("trainable", [False, True], ids=["frozen head", "trainable head"])
def test_no_more_than_a_chunk_of_logits_exists_forward_or_backward(module, trainable):
    """Every vocabulary projection sees at most a chunk of rows, and none keeps its output for
    the backward: a frozen head (LoRA's) is never projected again, a trainable one is
    projected again chunk by chunk in the backward (checkpointing)."""
    lm = module.lm
    head = decoder_and_head(lm)[1]
    assert not head.weight.requires_grad  # LoRA leaves the vocabulary head frozen
    rows: list[int] = []
    hook = head.register_forward_hook(lambda m, inputs, out: rows.append(out.shape[0]))
    head.weight.requires_grad_(trainable)
    try:
        ids, attention, policy = batch(module)
        lp = token_logprobs(lm, ids, attention, policy, chunk_tokens=4)
        n_forward = len(rows)
        lp.sum().backward()
    finally:
        hook.remove()
        head.weight.requires_grad_(False)
        head.weight.grad = None
    n_tokens = int(policy[:, 1:].sum())
    assert n_forward == math.ceil(n_tokens / 4)
    assert len(rows) == (2 if trainable else 1) * n_forward
    assert max(rows) <= 4
