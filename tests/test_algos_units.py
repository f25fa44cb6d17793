"""The trainer's parts without Ray: loss, chat tokens, sampler, rollout loop, credit to tokens,
batching and gradient accumulation. The model is a tiny random Llama built in the test."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import draco_gym  # noqa: F401
from draco_gym.algos.policy.iteration import token_batch
from draco_gym.algos.policy.prefix import micro_batches
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.credit import apply_credit, get_credit_rule
from draco_gym.algos.policy.generation import Sample, TorchSampler
from draco_gym.algos.config import LossConfig
from draco_gym.algos.policy.loss import grpo_loss
from draco_gym.algos.policy.models import build_tiny_llama
from draco_gym.algos.policy.lm import token_logprobs
from draco_gym.algos.rllib.module import HFPolicyModule
from draco_gym.algos.rllib.reporting import PHASES, iteration_metrics
from draco_gym.algos.policy.rollout import Episode, EpisodeLimits, run_episodes
from draco_gym.types import GAP, Criterion, GroupScore, RolloutGroup, Termination, TrajectoryScore, Verdict


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"))
    return path, AutoTokenizer.from_pretrained(path)


def make_module(path, **extra):
    return HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                          model_config={"model": str(path), "lora": {"r": 4, "alpha": 8}, **extra})


# -- loss ----------------------------------------------------------------------------------


def test_loss_equals_hand_computation():
    cfg = LossConfig(clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl_coeff=0.1)
    # token:      inside clip   clipped high   clipped low (A<0)  dual clip (A<0)  gap-free zero A
    logp = [-1.0, -0.5, -2.0, 0.0, -1.2]
    old = [-1.1, -1.0, -1.5, -2.0, -1.2]
    ref = [-1.0, -0.7, -1.9, -0.5, -1.0]
    adv = [1.0, 2.0, -1.0, -0.5, 0.0]
    n_tokens = 8  # the whole minibatch has more tokens than this micro-batch

    expected, kls = 0.0, 0.0
    for lp, o, r, a in zip(logp, old, ref, adv):
        ratio = math.exp(lp - o)
        pg = -min(ratio * a, min(max(ratio, 0.8), 1.2) * a)
        if a < 0:
            pg = min(pg, -3.0 * a)
        kl = math.exp(r - lp) - (r - lp) - 1
        expected += pg + 0.1 * kl
        kls += kl
    expected /= n_tokens

    t = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    loss, stats = grpo_loss(t(logp), t(old), t(ref), t(adv), n_tokens, cfg)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["kl"].item() == pytest.approx(kls / n_tokens, rel=1e-12)
    # The fixed batch really exercises each branch.
    ratios = [math.exp(lp - o) for lp, o in zip(logp, old)]
    assert 0.8 < ratios[0] < 1.2 and ratios[1] > 1.2 and ratios[2] < 0.8 and ratios[3] > 3.0
    assert stats["clip_fraction"].item() == pytest.approx(3 / n_tokens)
    # |r - 1| summed: e^0.1 - 1, e^0.5 - 1, 1 - e^-0.5, e^2 - 1, 0
    assert stats["ratio_abs_dev"].item() == pytest.approx(
        (math.exp(0.1) - 1 + math.exp(0.5) - 1 + 1 - math.exp(-0.5) + math.exp(2.0) - 1) / n_tokens, rel=1e-12)


def test_loss_gradient_is_zero_outside_the_trust_region():
    logp = torch.tensor([0.5], requires_grad=True)  # ratio e^0.5 = 1.65 > 1.2, A > 0: clipped
    loss, _ = grpo_loss(logp, torch.zeros(1), None, torch.ones(1), 1, LossConfig(kl_coeff=0.0))
    loss.backward()
    assert logp.grad.item() == 0.0


# -- chat tokens, sampler, module ------------------------------------------------------------


def test_chat_pieces_render_the_template(tiny):
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    ids = chat.prompt_ids("Find the total.") + chat.encode("```python\nprint(1)\n```") + [chat.eos_ids[0]]
    ids += chat.observation_ids("1\n", ended_with_eos=True)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Find the total."},
         {"role": "assistant", "content": "```python\nprint(1)\n```"},
         {"role": "user", "content": "1\n"}],
        tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == rendered


def test_chat_needs_a_template(tiny):
    _, tok = tiny
    bare = tok.__class__.from_pretrained(tok.name_or_path)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat.from_tokenizer(bare)


def test_sampled_logprobs_equal_the_learners(tiny):
    """Ratio 1 and KL 0 before the first update: the sampler's log-probs (batched, left
    padded, KV cache, temperature 0.7) are the ones the module computes (right padded)."""
    path, tok = tiny
    module = make_module(path, temperature=0.7)
    sampler = TorchSampler(module.lm, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, temperature=0.7)
    prompts = [tok.encode("print(add(2, 3))"), tok.encode("You are a helpful agent. The answer is")]
    samples = sampler.sample(prompts, [12, 7], seed=3)
    assert [len(s.token_ids) <= n for s, n in zip(samples, [12, 7])] == [True, True]
    trajs = []
    for p, s in zip(prompts, samples):
        trajs.append(dict(ids=p + s.token_ids, mask=[0] * len(p) + [1] * len(s.token_ids), lp=s.logprobs))
    width = max(len(t["ids"]) for t in trajs)
    ids = torch.zeros(len(trajs), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    pm = torch.zeros(len(trajs), width)
    for i, t in enumerate(trajs):
        ids[i, : len(t["ids"])] = torch.tensor(t["ids"])
        att[i, : len(t["ids"])] = 1
        pm[i, : len(t["ids"])] = torch.tensor(t["mask"], dtype=torch.float)
    out = module.forward_train({"input_ids": ids, "attention_mask": att, "policy_mask": pm})
    sampled = torch.tensor([lp for t in trajs for lp in t["lp"]])
    assert out["logp"].shape == sampled.shape
    assert torch.allclose(out["logp"], sampled, atol=1e-4)
    assert torch.allclose(out["ref_logp"], out["logp"], atol=1e-6)  # LoRA B starts at 0


def test_sampler_is_reproducible_and_stops_at_eos(tiny):
    path, tok = tiny
    module = make_module(path)
    sampler = TorchSampler(module.lm, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    prompts = [tok.encode("hello")] * 4
    a, b = sampler.sample(prompts, [20] * 4, seed=11), sampler.sample(prompts, [20] * 4, seed=11)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    for s in a:
        assert s.ended_with_eos == (s.token_ids[-1] == tok.eos_token_id)
        assert tok.eos_token_id not in s.token_ids[:-1]


def test_session_decodes_into_its_cache_in_place(tiny, monkeypatch):
    """The session's KV cache (growing layers written in place, a turn's room reserved before
    decoding) samples what transformers' own concatenating cache samples, over turns that
    append observations of unequal length and drop a row; and a turn copies the cache once
    (the room it reserves), not once per decoded token."""
    from transformers import DynamicCache

    from draco_gym.algos.policy import generation

    path, tok = tiny
    module = make_module(path, temperature=0.8)
    sampler = TorchSampler(module.lm, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, temperature=0.8)
    prompts = [tok.encode("You are a helpful agent. print(add(2, 3))")] * 2 + [tok.encode("The answer is")]
    layer_class = generation._growing_layer_class()
    resize = layer_class._resize
    copies = []

    def counted(self, capacity):
        copies.append(capacity)
        resize(self, capacity)

    def play():
        session = sampler.session(prompts)
        first = session.sample([6, 9, 4], seed=1)
        session.extend([tok.encode("42"), tok.encode("Traceback: NameError"), []])
        session.keep([0, 2])
        copies.clear()
        second = session.sample([12, 5], seed=2)
        return [(s.token_ids, s.logprobs) for s in first + second], session

    monkeypatch.setattr(layer_class, "_resize", counted)
    growing, session = play()
    assert len(copies) == len(session.cache.layers), "decoding copied the cache"
    assert all(type(layer) is layer_class for layer in session.cache.layers)
    assert session.cache.get_seq_length() == session.mask.shape[1]
    monkeypatch.setattr(generation, "growing_cache", lambda model: DynamicCache(config=model.config))
    concatenating, _ = play()
    assert [ids for ids, _ in growing] == [ids for ids, _ in concatenating]
    for (_, a), (_, b) in zip(growing, concatenating):
        assert np.allclose(a, b, atol=1e-6)


def test_module_state_is_the_adapter_only(tiny):
    path, _ = tiny
    module = make_module(path)
    state = module.get_state()
    assert state and all("lora_" in k for k in state)
    other = make_module(path)
    bumped = {k: v + 1.0 for k, v in state.items()}
    other.set_state(bumped)
    assert all(torch.equal(other.get_state()[k], bumped[k]) for k in state)
    with pytest.raises(KeyError, match="lacks"):
        other.set_state(dict(list(state.items())[:1]))


# -- rollout loop, credit to tokens, batch ---------------------------------------------------


class ScriptedSampler:
    """Plays fixed assistant messages (the real env runs them); log-prob -1 per token."""

    def __init__(self, chat, messages, eos=True):
        self.chat, self.messages, self.eos, self.calls = chat, messages, eos, 0

    def sample(self, prompts, max_new_tokens, seed):
        out = []
        for budget in max_new_tokens:
            ids = self.chat.encode(self.messages[min(self.calls, len(self.messages) - 1)])
            ids = (ids + [self.chat.eos_ids[0]] if self.eos else ids)[:budget]
            out.append(Sample(ids, [-1.0] * len(ids), ids[-1] == self.chat.eos_ids[0]))
        self.calls += 1
        return out


@pytest.fixture(scope="module")
def env():
    e = gym.make("draco_gym/PythonTools-v0")
    yield e
    e.close()


def test_rollout_records_steps_and_gap_tokens(tiny, env):
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    task = env.unwrapped.task_ids[0]
    msgs = ["Let me look.\n```python\nprint(get_order('O1042'))\n```", "```python\nsubmit(1)\n```", "Done."]
    ep = Episode.start(env, chat, EpisodeLimits(max_new_tokens=64), task_id=task)
    [traj] = run_episodes([ep], ScriptedSampler(chat, msgs), chat, EpisodeLimits(max_new_tokens=64))
    assert traj.termination == Termination.NO_CODE
    assert [s.text for s in traj.steps] == msgs
    for j, step in enumerate(traj.steps, start=1):
        mine = [t for t, s in zip(traj.token_ids, traj.token_step) if s == j]
        assert mine == chat.encode(msgs[j - 1]) + [chat.eos_ids[0]]
        assert step.n_tokens == len(mine)
    assert traj.token_step[: len(chat.prompt_ids(traj.task.agent_prompt))] == [GAP] * len(
        chat.prompt_ids(traj.task.agent_prompt))
    assert all((lp == -1.0) == (s != GAP) for lp, s in zip(traj.token_logprobs, traj.token_step))
    # The observation of step 1 is in the context as gap tokens.
    gap_text = tok.decode([t for t, s in zip(traj.token_ids, traj.token_step) if s == GAP])
    assert traj.steps[0].observation.strip()[:20] in gap_text


def test_rollout_ends_as_length_when_the_budget_runs_out(tiny, env):
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    limits = EpisodeLimits(max_new_tokens=8, max_response_tokens=30)
    ep = Episode.start(env, chat, limits, task_id=env.unwrapped.task_ids[0])
    [traj] = run_episodes([ep], ScriptedSampler(chat, ["```python\nprint(list_products())\n```"], eos=False),
                          chat, limits)
    assert traj.termination == Termination.LENGTH
    assert all(0 < s.n_tokens <= 8 for s in traj.steps)
    # The environment evaluated the cut-off episode: an outcome (not submitted: a failure) that
    # the outcome reward scores without a fallback, and the env knows it ended
    assert traj.metrics["success"] is False and traj.metrics["submitted"] is False
    assert env.unwrapped.termination == Termination.LENGTH
    from draco_gym.reward import OutcomeReward

    score = OutcomeReward().score_group(traj.task, [traj])
    assert score.rewards == [0.0] and score.fallbacks == []


def test_a_cut_off_episode_keeps_what_it_achieved(tiny, env):
    """Submitted right, then the token budget ran out before the closing message (end rule
    no_code): the environment's evaluation at the cut is a success, beside termination length."""
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    task = env.unwrapped.task_ids[0]
    env.reset(options={"task_id": task})
    submit = f"```python\nsubmit({env.unwrapped.task.metadata['answer']!r})\n```"
    limits = EpisodeLimits(max_new_tokens=64, max_response_tokens=len(chat.encode(submit)) + 2)
    ep = Episode.start(env, chat, limits, task_id=task)
    [traj] = run_episodes([ep], ScriptedSampler(chat, [submit, "Done."]), chat, limits)
    assert traj.termination == Termination.LENGTH and len(traj.steps) == 1
    assert traj.metrics["submitted"] is True and traj.metrics["success"] is True


def _group(tiny, env):
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    limits = EpisodeLimits(max_new_tokens=64)
    scripts = [["```python\nx = 1\n```", "```python\nsubmit(x)\n```", "ok"], ["```python\nsubmit(2)\n```", "bye"]]
    trajs = []
    for script in scripts:
        ep = Episode.start(env, chat, limits, task_id=env.unwrapped.task_ids[0])
        trajs += run_episodes([ep], ScriptedSampler(chat, script), chat, limits)
    criteria = [Criterion(title="submits the total"), Criterion(title="explores first")]
    scores = [
        TrajectoryScore.from_verdicts([Verdict(criterion="submits the total", score=1, cited_steps=[2]),
                                       Verdict(criterion="explores first", score=-1, cited_steps=[1])]),
        TrajectoryScore.from_verdicts([Verdict(criterion="submits the total", score=-1, cited_steps=[1]),
                                       Verdict(criterion="explores first", score=-1, cited_steps=[1])]),
    ]
    return trajs, GroupScore(criteria=criteria, scores=scores)


def test_an_outcome_fallback_is_not_counted_as_the_judges(tiny, env):
    """An episode whose env reported no ``success`` is the outcome reward's fallback: the
    trainer counts it under env_runners/outcome_fallbacks, and judge/fallbacks stays 0."""
    from draco_gym.reward import OutcomeReward

    trajs, _ = _group(tiny, env)
    trajs = [trajs[0], trajs[1].model_copy(update={"metrics": {}})]
    groups = [RolloutGroup(task_id="t", trajectories=trajs, score=OutcomeReward().score_group(trajs[0].task, trajs))]
    stats = iteration_metrics(groups, apply_credit(groups, get_credit_rule("uniform")), dict.fromkeys(PHASES, 0.0),
                              1.0, 0)
    assert (stats["judge/fallbacks"], stats["env_runners/outcome_fallbacks"]) == (0, 1)


def test_advantages_land_on_exactly_their_steps_tokens(tiny, env):
    trajs, score = _group(tiny, env)
    groups = [RolloutGroup(task_id="t", trajectories=trajs, score=score)]
    credited = apply_credit(groups, get_credit_rule("draco"))
    rows, token_adv, step_adv = credited.trajectories, credited.token_advantages, credited.step_advantages
    stats = iteration_metrics(groups, credited, dict.fromkeys(PHASES, 0.0), 1.0, 0)
    assert step_adv[0][0] != step_adv[0][1]  # draco really redistributes
    for traj, per_token, per_step in zip(rows, token_adv, step_adv):
        for adv, step in zip(per_token, traj.token_step):
            assert adv == (0.0 if step == GAP else per_step[step - 1])
        # conservation: the trajectory's total push is GRPO's
        total = sum(n * a for n, a in zip(traj.step_tokens, per_step))
        assert total == pytest.approx(sum(per_token))
    batch = token_batch(rows, token_adv, pad_id=0)
    for i, traj in enumerate(rows):
        n = len(traj.token_ids)
        assert np.array_equal(batch["policy_mask"][i, 1:n], np.asarray(traj.token_step[1:]) != GAP)
        assert not batch["policy_mask"][i, n:].any() and not batch["advantages"][i, n:].any()
        assert np.allclose(batch["advantages"][i, :n], token_adv[i])
    assert stats["judge/criteria_after_dropout"] == 2 and stats["judge/rubric_pass_rate"] == pytest.approx(1 / 4)
    assert stats["env_runners/termination/no_code"] == 1.0


def test_micro_batches_give_the_full_batch_gradient(tiny, env):
    """Gradient accumulation over micro-batches equals one pass over the minibatch: the
    learner's own update (``GRPOTorchLearner._update``), once with the whole minibatch in
    one micro-batch and once with one trajectory per micro-batch."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from draco_gym.algos.rllib.grpo import GRPOConfig
    from draco_gym.envs.base import text_space

    path, _ = tiny
    trajs, score = _group(tiny, env)
    credited = apply_credit([RolloutGroup(task_id="t", trajectories=trajs, score=score)], get_credit_rule("draco"))
    batch = {k: torch.as_tensor(v) for k, v in token_batch(credited.trajectories, credited.token_advantages,
                                                           pad_id=0).items()}

    def grads(micro_batch_tokens):
        config = (GRPOConfig().environment("draco_gym/PythonTools-v0")
                  .policy(model=str(path), lora={"r": 4, "alpha": 8})
                  .training(micro_batch_tokens=micro_batch_tokens, grad_clip=None, kl_coeff=0.05, lr=2e-4))
        learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (text_space(), text_space())})
        # (a config never validated: RLlib's own knobs are read from its attributes)
        assert [g["lr"] for opt in learner._optimizer_parameters for g in opt.param_groups] == [2e-4]
        module = learner.module[DEFAULT_MODULE_ID]
        with torch.no_grad():  # move off LoRA's zero start so the KL term has a gradient too
            for name, p in module.lm.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
        learner._update({DEFAULT_MODULE_ID: batch})
        return [p.grad.clone() for p in module.lm.parameters() if p.requires_grad]

    assert len(micro_batches(batch, 16)) == len(trajs)  # the small budget really splits the minibatch
    whole, split = grads(10**9), grads(16)
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, split):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_token_logprobs_only_project_policy_positions(tiny):
    path, tok = tiny
    module = make_module(path)
    ids = torch.tensor([tok.encode("print(add(2, 3))")])
    mask = torch.zeros_like(ids, dtype=torch.float)
    mask[0, 3:5] = 1
    lp = token_logprobs(module.lm, ids, torch.ones_like(ids), mask)
    full = torch.log_softmax(module.lm(input_ids=ids).logits.float(), -1)
    assert torch.allclose(lp, full[0, 2:4].gather(-1, ids[0, 3:5, None]).squeeze(-1), atol=1e-5)


def test_episode_from_a_restored_prefix_continues_there(tiny, env):
    """ProVer's restarts: the replayed turns are gap context, the continuation's steps are
    numbered after them and only they carry tokens."""
    _, tok = tiny
    chat = ChatFormat.from_tokenizer(tok)
    limits = EpisodeLimits(max_new_tokens=64)
    prefix = ["```python\nx = 41\n```"]
    ep = Episode.from_prefix(env, chat, limits, env.unwrapped.task_ids[0], prefix)
    assert ep.n_steps == 1 and set(ep.token_step) == {GAP}
    [traj] = run_episodes([ep], ScriptedSampler(chat, ["```python\nprint(x + 1)\n```", "done"]), chat, limits)
    assert [s.text for s in traj.steps] == prefix + ["```python\nprint(x + 1)\n```", "done"]
    assert traj.steps[1].observation.strip() == "42"  # the restored state: x survived
    assert traj.steps[0].n_tokens == 0 and traj.steps[1].n_tokens > 0
    assert GAP not in {s for s in traj.token_step if s != GAP} and 1 not in traj.token_step


def test_multi_turn_session_logprobs_equal_the_learners(tiny):
    """The KV-cached session (prompt encoded once for the group, turns appended in chunks
    of unequal length, finished rows dropped) gives every sampled token the log-prob the
    learner computes on the plain sequence: ratio 1 before the first update, over turns."""
    path, tok = tiny
    module = make_module(path, temperature=0.9)
    chat = ChatFormat.from_tokenizer(tok)
    sampler = TorchSampler(module.lm, eos_ids=chat.eos_ids, pad_id=tok.pad_token_id, temperature=0.9)
    limits = EpisodeLimits(max_new_tokens=10, max_response_tokens=400)
    envs = [gym.make("draco_gym/PythonTools-v0", end_rule="task_completed", max_turns=3) for _ in range(3)]
    try:
        task = envs[0].unwrapped.task_ids[0]
        episodes = [Episode.start(e, chat, limits, task_id=task) for e in envs]
        stats = {}
        trajs = run_episodes(episodes, sampler, chat, limits, seed=5, stats=stats)
    finally:
        for e in envs:
            e.close()
    assert max(len(t.steps) for t in trajs) >= 2, "the test needs multi-turn episodes"
    assert stats["sampled_tokens"] == sum(s.n_tokens for t in trajs for s in t.steps)
    for traj in trajs:
        ids = torch.tensor([traj.token_ids])
        mask = torch.tensor([[float(s != GAP) for s in traj.token_step]])
        learner = token_logprobs(module.lm, ids, torch.ones_like(ids), mask, temperature=0.9)
        sampled = torch.tensor([lp for lp, s in zip(traj.token_logprobs, traj.token_step) if s != GAP])
        assert torch.allclose(learner, sampled, atol=1e-4), (learner - sampled).abs().max()


def test_policy_judge_answers_with_the_policy_and_plugs_into_the_dynamic_reward(tiny):
    """The self-judge: a reward built with ``judge: policy`` gets this runner's policy."""
    import asyncio
    from types import SimpleNamespace

    from draco_gym.algos.policy.self_judge import PolicyJudge, build_trainer_reward
    from draco_gym.reward import DynamicRubricReward

    path, tok = tiny
    module = make_module(path)
    chat = ChatFormat.from_tokenizer(tok)
    runner = SimpleNamespace(tokenizer=tok, module=module, chat=chat,
                             sampler=TorchSampler(module.lm, eos_ids=chat.eos_ids, pad_id=tok.pad_token_id),
                             config=SimpleNamespace(run=SimpleNamespace(policy=SimpleNamespace(model=str(path)))))
    judge = PolicyJudge(runner)
    reply = asyncio.run(judge.complete([{"role": "user", "content": "Score this."}], max_tokens=6, temperature=1.0))
    assert reply.prompt_tokens > 0 and 1 <= reply.completion_tokens <= 6 and isinstance(reply.text, str)
    reward = build_trainer_reward("dynamic", {"judge": "policy", "self_judge": True}, runner)
    assert isinstance(reward, DynamicRubricReward)
    assert isinstance(reward.client.judge, PolicyJudge) and reward.client.judge.runner is runner


def test_sample_names_env_runners_that_returned_nothing():
    """A runner that returns no episodes without a Ray error is named, not an IndexError
    further on (the driver's loop reads the first runner's timers)."""
    from types import SimpleNamespace

    from draco_gym.algos.rllib.grpo import GRPO

    runners = SimpleNamespace(healthy_env_runner_ids=lambda: [1, 2],
                              foreach_env_runner=lambda *args, **kwargs: [])
    algo = SimpleNamespace(env_runner_group=runners, config=SimpleNamespace(run=SimpleNamespace(rollout=SimpleNamespace(group_size=2))),
                           _drop_drawn_ahead=lambda: None)
    algo._sample_calls = lambda *args, **kwargs: GRPO._sample_calls(algo, *args, **kwargs)
    with pytest.raises(RuntimeError, match="2 of 2 env runners returned no episodes"):
        GRPO.sample(algo, ["a", "b"], seed=0)


def test_the_progress_callback_pickles_after_ray_replaced_print(tmp_path, monkeypatch, capsys):
    """Tune pickles the CLI's progress callback with its metrics log. Ray's tqdm_ray replaces
    ``builtins.print`` in the driver when a progress bar reaches it; a log holding the
    original ``print`` then cannot be pickled by name (``draco-gym train`` failed so)."""
    import builtins

    from ray import cloudpickle

    from types import SimpleNamespace

    from draco_gym.algos.rllib.runs import ProgressCallback

    callback = ProgressCallback(tmp_path, total_iterations=2)
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: None)
    restored = cloudpickle.loads(cloudpickle.dumps(callback))
    monkeypatch.undo()
    restored.on_trial_result(0, [], SimpleNamespace(local_path=None),
                             {"training_iteration": 1, "env_runners": {"episode_return_mean": 0.5}})
    assert "[iter 1/2]" in capsys.readouterr().out


def test_the_console_hears_each_alarm_once(tmp_path, caplog):
    """A collapse (the issue's run: success 1.00 -> 0.00 while the KL rose to 0.137) warns
    once, on the console of draco-gym train (the progress callback, in the driver) and through
    the trainer's logger for a run driven from Python; the reward-hacking alarm, whose warning
    the trial's log kept from the console, warns there too."""
    from types import SimpleNamespace

    from draco_gym.algos.rllib.grpo import GRPO
    from draco_gym.algos.rllib.runs import ProgressCallback
    from reward_fixtures import COLLAPSE_KL, COLLAPSE_SUCCESS

    def result(t, success, kl, reward):
        return {"training_iteration": t, "env_runners": {"episode_return_mean": reward, "env": {"success": success}},
                "learners": {"default_policy": {"kl": kl}}}

    lines = []
    callback = ProgressCallback(tmp_path, total_iterations=8, echo=lines.append)
    trainer = SimpleNamespace(_rows=[], _collapse_warned=False)
    for t, (success, kl) in enumerate(zip(COLLAPSE_SUCCESS, COLLAPSE_KL), start=1):
        callback.on_trial_result(t, [], SimpleNamespace(local_path=None), result(t, success, kl, 0.5))
        with caplog.at_level("WARNING", logger="draco_gym.algos.rllib.grpo"):
            GRPO._watch_for_collapse(trainer, result(t, success, kl, 0.5))
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: iteration 5: the environment's success fell by 0.69")
    assert "while the KL to the reference policy rose by 0.035" in warnings[0]  # 0.0345
    assert lines.index(warnings[0]) == lines.index(next(line for line in lines if "[iter 5/8]" in line)) + 1
    assert [r.getMessage() for r in caplog.records] == [warnings[0].removeprefix("warning: ")]

    lines.clear()
    callback = ProgressCallback(tmp_path, total_iterations=10, echo=lines.append)
    for t in range(1, 11):  # the reward rising 0.1 an iteration while success falls as much
        callback.on_trial_result(t, [], SimpleNamespace(local_path=None), result(t, 0.9 - 0.1 * t, 0.01, 0.1 * t))
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: iteration 8: the reward rose by 0.700")


def test_mixed_groups_with_criteria_counts_the_groups_a_rubric_must_tell_apart():
    """Of the groups whose episodes differ in outcome, the share that kept a criterion after
    dropout: here one of two (a group that all succeeded is not counted at all)."""
    from draco_gym.types import Task, Trajectory

    task = Task(id="t", instruction="")

    def group(outcomes, criteria):
        trajs = [Trajectory(task=task, metrics={"success": o}) for o in outcomes]
        kept = [Criterion(title=f"c{i}") for i in range(criteria)]
        score = GroupScore(criteria=kept, scores=[TrajectoryScore(reward=float(o)) for o in outcomes],
                           dropped=[] if criteria else ["c0"])
        return RolloutGroup(task_id="t", trajectories=trajs, score=score)

    groups = [group([True, False], 1), group([False, True, True], 0), group([True, True], 0)]
    stats = iteration_metrics(groups, apply_credit(groups, get_credit_rule("uniform")), dict.fromkeys(PHASES, 0.0),
                              1.0, 0)
    assert stats["judge/mixed_groups_with_criteria"] == 0.5
    one_outcome = [group([True, True], 1)]
    stats = iteration_metrics(one_outcome, apply_credit(one_outcome, get_credit_rule("uniform")),
                              dict.fromkeys(PHASES, 0.0), 1.0, 0)
    assert "judge/mixed_groups_with_criteria" not in stats


def test_policy_modules_of_one_process_share_one_copy_of_the_frozen_base(tiny):
    """The env runner and learner in the trainer's process (``num_env_runners: 0``) hold one copy
    of the base weights; each keeps its own adapter. A plain load (the warm start merges into
    its model) and another dtype keep their own, and nothing is held once no model needs it."""
    import gc

    from draco_gym.algos.policy.lm import _FROZEN_WEIGHTS, load_causal_lm

    path, _ = tiny
    sampler, learner = make_module(path), make_module(path)

    def base(module):
        return {n.replace(".base_layer", "").removeprefix("base_model.model."): p
                for n, p in module.lm.named_parameters() if "lora_" not in n}

    one, two = base(sampler), base(learner)
    assert one.keys() == two.keys()
    assert all(one[k].data_ptr() == two[k].data_ptr() for k in one), "two copies of the base weights"
    plain = dict(load_causal_lm(str(path)).named_parameters())
    assert not any(plain[k].data_ptr() == one[k].data_ptr() for k in plain)
    other = make_module(path, dtype="bfloat16")
    assert not any(p.data_ptr() == one[k].data_ptr() for k, p in base(other).items())

    ids = torch.tensor([[1, 5, 9, 4, 2]])
    with torch.no_grad():  # the learner's adapter moves; the sampler's, and so its outputs, do not
        before = sampler.lm(input_ids=ids).logits
        for name, p in learner.lm.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
        assert torch.equal(sampler.lm(input_ids=ids).logits, before)
        assert not torch.allclose(learner.lm(input_ids=ids).logits, before)

    del sampler, learner, other, one, two, p
    gc.collect()
    assert len(_FROZEN_WEIGHTS) == 0
