"""Prefix sharing: a group's shared prompt is computed once, and nothing else changes.

Exactness is the contract: per-token log-probs (policy, reference, recomputed old ones) and
the LoRA gradient with sharing equal those without it, for multi-turn rollouts whose later
turns differ, in one micro-batch or many. Tiny random models: a Llama (the trainer's test
model, on real PythonTools rollouts), and Qwen2 / Qwen3 built here.
"""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

import draco_gym  # noqa: F401
from draco_gym.algos.policy import prefix as batch_mod
from draco_gym.algos.policy import generation as generation_mod
from draco_gym.algos.policy.iteration import token_batch
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.policy.generation import Sample, TorchSampler
from draco_gym.algos.policy.iteration import accumulate_gradients, recompute_logprobs
from draco_gym.algos.config import LossConfig
from draco_gym.algos.rllib.module import HFPolicyModule
from draco_gym.algos.policy.prefix import PrefixGroup, SharedPrefix, prefix_groups, prefix_micro_batches, sharing_unsupported
from draco_gym.algos.policy.rollout import Episode, EpisodeLimits, run_episodes
from draco_gym.types import GAP

LOSS = LossConfig(kl_coeff=0.05)


def make_module(path) -> HFPolicyModule:
    module = HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                            model_config={"model": str(path), "lora": {"r": 4, "alpha": 8}})
    with torch.no_grad():  # off LoRA's zero start: adapter on and off differ, the KL has a gradient
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return module


def build_qwen(kind: str, path, **extra):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[kind]
    torch.manual_seed(0)
    config = config_cls(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                        tie_word_embeddings=True, **extra)
    model_cls(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def model_dir(request, tiny_model, tmp_path_factory):
    if request.param == "llama":
        return tiny_model
    return build_qwen(request.param, tmp_path_factory.mktemp(request.param))


def synthetic_batch(vocab: int, seed: int = 0) -> dict:
    """Two tasks of G = 3 multi-turn rollouts and one lone rollout, as ``token_batch``
    builds them: prompt (gap), turn 1 (policy; within a task its first tokens agree, so
    the shared prefix reaches into policy tokens), observation (gap), turn 2 (policy)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    rows = []
    for prompt_len, group in ((40, 3), (33, 3), (25, 1)):
        prompt, opener = rand(prompt_len), rand(3)
        for _ in range(group):
            turn1, obs, turn2 = opener + rand(int(torch.randint(2, 9, (1,), generator=g))), \
                rand(int(torch.randint(3, 12, (1,), generator=g))), rand(int(torch.randint(1, 10, (1,), generator=g)))
            rows.append((prompt + turn1 + obs + turn2, [0] * prompt_len + [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)))
    width = max(len(ids) for ids, _ in rows)
    out = {k: torch.zeros(len(rows), width) for k in ("policy_mask", "advantages", "old_logp")}
    out["input_ids"] = torch.zeros(len(rows), width, dtype=torch.long)
    out["attention_mask"] = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (ids, policy) in enumerate(rows):
        out["input_ids"][i, : len(ids)] = torch.tensor(ids)
        out["attention_mask"][i, : len(ids)] = 1
        out["policy_mask"][i, : len(ids)] = torch.tensor(policy, dtype=torch.float)
        out["advantages"][i, : len(ids)] = torch.randn(len(ids), generator=g) * out["policy_mask"][i, : len(ids)]
    out["policy_mask"][:, 0] = 0
    return out


def vocab(module) -> int:
    return module.lm.get_output_embeddings().weight.shape[0]


def with_old_logprobs(module, batch: dict) -> dict:
    """Old log-probs near the current ones (ratios near 1: most tokens inside the clip)."""
    old = recompute_logprobs(module, batch, 10**9, share_prefix=False)
    noise = 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    return {**batch, "old_logp": (old + noise) * batch["policy_mask"]}


def lora_grad(module, batch: dict, budget: int, share: bool) -> torch.Tensor:
    module.lm.zero_grad(set_to_none=True)
    accumulate_gradients(module, batch, LOSS, budget, share_prefix=share)
    return torch.cat([p.grad.flatten() for n, p in module.lm.named_parameters() if "lora_" in n])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# -- what the prefix is --------------------------------------------------------------------


def test_prefix_groups_split_by_task_and_leave_every_row_a_continuation():
    system, task_a, task_b = [1] * 10, [2] * 30, [3] * 30
    seqs = [system + task_a + [7, 8], system + task_b + [9], system + task_a + [7, 5, 5], system + task_b + [4, 4]]
    # Per task (two rows share 41 and 40 tokens) saves more than all four sharing the system prompt.
    assert prefix_groups(seqs) == [PrefixGroup((0, 2), 41), PrefixGroup((1, 3), 40)]
    # Identical rows share all but their last token; rows sharing nothing stay alone.
    assert prefix_groups([[5, 6, 7], [5, 6, 7], [9]]) == [PrefixGroup((0, 1), 2), PrefixGroup((2,), 0)]
    assert prefix_groups([[1, 2], [3, 4]]) == [PrefixGroup((0,), 0), PrefixGroup((1,), 0)]
    assert prefix_groups([]) == []


def test_learner_shares_the_prompt_the_sampler_shared(tiny_model, monkeypatch):
    """One function decides the prefix: on real rollouts (G = 3 of two tasks, the real
    sampler), the prefix the learner computes once contains the prompt prefix the sampler
    encoded once."""
    from transformers import AutoTokenizer

    calls = {"sampler": [], "learner": []}

    def spy(side):
        def recorded(seqs, *args, **kwargs):
            groups = prefix_groups(seqs, *args, **kwargs)
            calls[side] += [list(seqs[g.rows[0]][: g.length]) for g in groups if g.length]
            return groups
        return recorded

    monkeypatch.setattr(generation_mod, "prefix_groups", spy("sampler"))
    monkeypatch.setattr(batch_mod, "prefix_groups", spy("learner"))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    chat = ChatFormat.from_tokenizer(tok)
    module = make_module(tiny_model)
    sampler = TorchSampler(module.lm, eos_ids=chat.eos_ids, pad_id=tok.pad_token_id)
    limits = EpisodeLimits(max_new_tokens=10)
    envs = [gym.make("draco_gym/PythonTools-v0", max_turns=2) for _ in range(6)]
    try:
        tasks = envs[0].unwrapped.task_ids[:2]
        episodes = [Episode.start(env, chat, limits, task_id=tasks[i // 3], seed=i) for i, env in enumerate(envs)]
        trajs = run_episodes(episodes, sampler, chat, limits, seed=5)
    finally:
        for env in envs:
            env.close()
    arrays = token_batch(trajs, [[0.0] * len(t.token_ids) for t in trajs], pad_id=0)
    units = prefix_micro_batches({k: torch.as_tensor(v) for k, v in arrays.items()}, 10**9)
    assert calls["sampler"] and calls["learner"]
    for sampled in calls["sampler"]:
        assert len(sampled) >= 20
        assert any(learned[: len(sampled)] == sampled for learned in calls["learner"])
    for learned in calls["learner"]:
        assert any(learned[: len(sampled)] == sampled for sampled in calls["sampler"])
    assert sorted(len(u.prefix) for u in units if u.prefix is not None) == sorted(map(len, calls["learner"]))


def test_sampler_shares_a_prefix_of_prompts_that_differ_after_it(tiny_model):
    """Prompts with a common beginning and different endings: encoded once up to where they
    part, then each its own way, every row samples exactly what it would alone."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    module = make_module(tiny_model)
    sampler = TorchSampler(module.lm, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, temperature=0.0)
    common = tok.encode("You are a helpful agent. Use the tools. ")
    prompts = [common + tok.encode("The answer is 42."), common + tok.encode("print(add(2, 3))"), common + [5]]
    together = sampler.sample(prompts, [8, 8, 8], seed=0)
    for prompt, sample in zip(prompts, together):
        [alone] = sampler.sample([prompt], [8], seed=0)
        assert sample.token_ids == alone.token_ids
        assert np.allclose(sample.logprobs, alone.logprobs, atol=1e-5)


# -- exactness -----------------------------------------------------------------------------


def test_shared_logprobs_equal_unshared(model_dir):
    """Policy, reference and recomputed log-probs of every policy token, to 1e-5."""
    module = make_module(model_dir)
    assert module.prefix_sharing() is None
    batch = synthetic_batch(vocab(module))
    units = prefix_micro_batches(batch, 10**9)
    assert sorted(len(u.prefix) for u in units if u.prefix is not None) == [36, 43]  # prompt + opener
    for unit in units:
        if unit.prefix is None:
            continue
        [rows] = unit.rows
        micro = unit.micro[0]
        with torch.no_grad():
            plain = module.forward_train(micro)
            shared = module.forward_train(micro, prefix=module.encode_prefix(unit.prefix),
                                          ref_prefix=module.encode_prefix(unit.prefix, reference=True))
        assert plain["logp"].shape == shared["logp"].shape and len(plain["logp"]) > 10
        assert torch.allclose(shared["logp"], plain["logp"], atol=1e-5, rtol=0)
        assert torch.allclose(shared["ref_logp"], plain["ref_logp"], atol=1e-5, rtol=0)
        assert not torch.allclose(plain["logp"], plain["ref_logp"], atol=1e-3)  # the adapter is on
    a = recompute_logprobs(module, batch, 10**9, share_prefix=False)
    b = recompute_logprobs(module, batch, 40, share_prefix=True)
    assert torch.allclose(a, b, atol=1e-5, rtol=0) and bool((a != 0).any())


def test_shared_gradient_equals_unshared(model_dir):
    """The LoRA gradient of the GRPO loss (policy + KL), to 1e-5 relative, whether a group's
    continuations fill one micro-batch or one micro-batch each."""
    module = make_module(model_dir)
    assert module.prefix_sharing() is None
    batch = with_old_logprobs(module, synthetic_batch(vocab(module)))
    unshared = lora_grad(module, batch, 10**9, share=False)
    assert float(unshared.norm()) > 0
    for budget in (10**9, 20):  # 20 tokens: a group's continuations in one micro-batch per row
        assert max(len(u.micro) for u in prefix_micro_batches(batch, budget)) == (1 if budget > 100 else 3)
        assert relative(lora_grad(module, batch, budget, share=True), unshared) < 1e-5


def test_shared_gradient_on_real_rollouts(tiny_model):
    """Real multi-turn PythonTools rollouts: G = 3 rows per task whose later turns (sampled
    code, tool output) differ."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    chat = ChatFormat.from_tokenizer(tok)

    class Scripted:  # row i writes its own code each turn; the env runs it
        def __init__(self):
            self.turn = 0

        def sample(self, prompts, budgets, seed):
            scripts = ["```python\nx = {i}\n```", "```python\nprint(x * {i} + 1)\n```", "Done {i}."]
            out = []
            for i in range(len(prompts)):
                ids = chat.encode(scripts[min(self.turn, 2)].format(i=i % 3 + 2)) + [chat.eos_ids[0]]
                out.append(Sample(ids, [0.0] * len(ids), True))
            self.turn += 1
            return out

    limits = EpisodeLimits(max_new_tokens=64)
    envs = [gym.make("draco_gym/PythonTools-v0", max_turns=3) for _ in range(6)]
    try:
        tasks = envs[0].unwrapped.task_ids[:2]
        episodes = [Episode.start(env, chat, limits, task_id=tasks[i // 3], seed=i) for i, env in enumerate(envs)]
        trajs = run_episodes(episodes, Scripted(), chat, limits)
    finally:
        for env in envs:
            env.close()
    assert all(len(t.steps) == 3 for t in trajs)
    rng = np.random.default_rng(0)
    adv = [list(rng.normal(size=len(t.token_ids)) * (np.asarray(t.token_step) != GAP)) for t in trajs]
    batch = {k: torch.as_tensor(v) for k, v in token_batch(trajs, adv, pad_id=0).items()}
    module = make_module(tiny_model)
    assert module.prefix_sharing() is None
    batch = with_old_logprobs(module, batch)
    units = prefix_micro_batches(batch, 10**9)
    assert all(u.prefix is not None and len(u.prefix) > 50 for u in units)  # every row shares its prompt
    assert sorted(r for u in units for rows in u.rows for r in rows) == list(range(6))
    assert max(len(u.micro) for u in prefix_micro_batches(batch, 150)) > 1
    unshared = lora_grad(module, batch, 10**9, share=False)
    assert relative(lora_grad(module, batch, 10**9, share=True), unshared) < 1e-5
    assert relative(lora_grad(module, batch, 150, share=True), unshared) < 1e-5


# -- models that cannot share --------------------------------------------------------------


def test_sliding_window_model_falls_back_with_a_logged_reason(tmp_path, caplog):
    path = build_qwen("qwen2", tmp_path / "windowed", use_sliding_window=True, sliding_window=16, max_window_layers=0)
    module = make_module(path)
    assert "sliding" in module.prefix_sharing()
    batch = with_old_logprobs(module, synthetic_batch(vocab(module)))
    with caplog.at_level(logging.WARNING, logger="draco_gym.algos.policy.iteration"):
        shared = lora_grad(module, batch, 10**9, share=True)
    assert "prefix sharing off" in caplog.text and "sliding" in caplog.text
    assert torch.equal(shared, lora_grad(module, batch, 10**9, share=False))


def test_probe_catches_a_prefix_forward_that_is_wrong(tiny_model, monkeypatch):
    """A model that passes the structural checks but whose continuation does not see the
    prefix it should (here: positions off by one) is caught before training uses it."""
    module = make_module(tiny_model)
    assert sharing_unsupported(module.lm) is None
    backbone = SharedPrefix(module.lm, torch.tensor([3, 4]), grad=False).backbone

    def shift(_, args, kwargs):  # only the continuation's forward is given position ids
        if kwargs.get("position_ids") is not None:
            kwargs["position_ids"] = kwargs["position_ids"] + 1
        return args, kwargs

    handle = backbone.register_forward_pre_hook(shift, with_kwargs=True)
    try:
        reason = sharing_unsupported(module.lm)
    finally:
        handle.remove()
    assert reason is not None and "differ" in reason


def test_checkpointed_gradient_through_a_shared_prefix_equals_the_plain_one(model_dir):
    """``policy.gradient_checkpointing``: every decoder layer is recomputed in the backward
    (its forward runs again), the prompt is still shared (the prefix's and the
    continuations' caches are one-pass caches a recomputed layer reads as the first time),
    and the LoRA gradient is the one without checkpointing, to 1e-5 relative."""
    from draco_gym.algos.policy.lm import enable_activation_checkpointing

    plain = make_module(model_dir)
    checkpointed = make_module(model_dir)
    enable_activation_checkpointing(checkpointed.lm)
    for m in checkpointed.lm.modules():
        if getattr(m, "gradient_checkpointing", False):
            m._can_checkpoint_with_cache = True
    assert checkpointed.prefix_sharing() is None
    batch = with_old_logprobs(plain, synthetic_batch(vocab(plain)))
    expected = lora_grad(plain, batch, 10**9, share=False)
    layer = next(m for m in checkpointed.lm.modules() if getattr(m, "gradient_checkpointing", False))
    runs = []
    layer.register_forward_hook(lambda *args: runs.append(torch.is_grad_enabled()))
    for budget in (10**9, 20):
        runs.clear()
        assert relative(lora_grad(checkpointed, batch, budget, share=True), expected) < 1e-5
        # forwards with gradient (prefix, continuations) and the backward's recomputations
        assert runs.count(True) >= 4, runs


def test_the_module_knob_checkpoints_and_keeps_sharing(tiny_model):
    module = HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                            model_config={"model": str(tiny_model), "lora": {"r": 4, "alpha": 8},
                                          "gradient_checkpointing": True})
    assert module.prefix_sharing() is None
    assert all(getattr(m, "_can_checkpoint_with_cache", False) for m in module.lm.modules()
               if getattr(m, "gradient_checkpointing", False))


def test_a_prefix_taken_with_gradient_is_recomputed_from_the_first_step(tiny_model):
    """A fresh module is in eval mode, and transformers recomputes a checkpointed layer only in
    training mode: the first prefix of a run, encoded before any ``forward_train``, must be
    recomputed in its backward too, not keep the whole prompt's activations until then."""
    module = HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                            model_config={"model": str(tiny_model), "lora": {"r": 4, "alpha": 8},
                                          "gradient_checkpointing": True})
    assert not module.lm.training
    attention = next(m.self_attn for m in module.lm.modules() if getattr(m, "gradient_checkpointing", False)
                     and hasattr(m, "self_attn"))
    runs = []  # the attention's calls: a recomputing layer calls it again in the backward
    attention.register_forward_hook(lambda *args: runs.append(torch.is_grad_enabled()))
    prefix = module.encode_prefix(torch.arange(3, 40))
    rows = torch.arange(3, 50).repeat(2, 1)
    prefix.row_hidden(rows, torch.ones_like(rows)).sum().backward()
    runs.clear()
    prefix.backward()
    assert runs == [True], "the prefix's layer was not recomputed in its backward"
