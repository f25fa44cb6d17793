"""Where a GRPO iteration's time goes, what batched generation buys, and what prefix sharing
saves the learner.

    python bench/train_iteration.py                               # tiny random Llama, PythonTools
    python bench/train_iteration.py --model smollm2-135m-instruct --max-new-tokens 48
    python bench/train_iteration.py --skip iteration --skip generation   # the learner part only

Part 1 runs real iterations on Ray (one env runner, local learner) and prints each phase's
seconds and share of the iteration: generation, env (reset + tool execution), judge
(reward), credit, learner, weight sync, and everything else (driver bookkeeping, Ray
transfers, batching). Goal: everything else <= 5%. With ``--share-prefix both`` it runs the
iterations once with the learner's prefix sharing off and once on.

Part 2 runs the same G episodes of one task twice in this process, once batched (one
sampling call per turn across the G live episodes) and once one episode at a time, and
compares generated tokens per second of sampling time. Goal: batched >= 2x on CPU.
The policy is whatever --model names: with the tiny random model the numbers measure the
machinery, not a realistic workload.

Part 3 times the learner's work for one iteration (forward, backward and reference forward
over G rollouts of one task, micro-batched, then the optimizer step) with prefix sharing off
and on, at several G, on a quickstart-like batch: a shared prompt of --prompt-tokens, then
--turns turns of --turn-tokens sampled tokens each followed by an observation, different in
every rollout. It reports the ratio, the FLOPs each path executes, and their achieved FLOP/s
against a plain forward+backward of one such sequence (the machine's practical limit here).
FLOPs are counted as model FLOPs: per token 2 x (layer weights) + 4 x width x attended keys
per layer, plus the vocabulary projection on policy tokens; a training pass counts 3x its
forward (the usual convention), the reference forward 1x. The policy is SmolLM2-135M's real
weights cut to its first --learner-layers layers (0: all 30) so that it runs in minutes on a
shared 2-core CPU; the per-layer work, the width and the head are the real model's. The last
line is the learner speedup at G = 6. Goal: >= 2x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

PHASES = ("generation", "env", "judge", "credit", "learner", "sync", "other")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (built here), a local directory, or smollm2-135m-instruct")
    p.add_argument("--env", default="draco_gym/PythonTools-v0")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2, help="tasks per iteration")
    p.add_argument("--iterations", type=int, default=3, help="timed iterations (after one warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--reward", default="rule")
    p.add_argument("--credit", default="draco")
    p.add_argument("--threads", type=int, default=1, help="torch threads for part 2 (Ray's actors default to 1)")
    p.add_argument("--skip", choices=["iteration", "generation", "learner"], action="append", default=[])
    p.add_argument("--share-prefix", choices=["on", "off", "both"], default="on", help="part 1: the learner's sharing")
    learner = p.add_argument_group("part 3 (learner)")
    learner.add_argument("--learner-model", default="smollm2-135m-instruct")
    learner.add_argument("--learner-layers", type=int, default=4, help="keep the first N layers (0: all)")
    learner.add_argument("--learner-threads", type=int, default=2)
    learner.add_argument("--groups", type=int, nargs="+", default=[3, 6, 8], help="G values")
    learner.add_argument("--prompt-tokens", type=int, default=1500)
    learner.add_argument("--turns", type=int, default=3)
    learner.add_argument("--turn-tokens", type=int, default=64)
    learner.add_argument("--observation-tokens", type=int, default=40)
    learner.add_argument("--micro-batch-tokens", type=int, default=1024, help="the quickstart's")
    learner.add_argument("--repeats", type=int, default=2, help="timed runs per mode (the fastest counts)")
    return p.parse_args()


def model_path(name: str) -> str:
    from draco_gym.algos.policy.models import build_tiny_llama, resolve_model

    if name == "tiny":
        return str(build_tiny_llama(tempfile.mkdtemp(prefix="draco_bench_tiny_")))
    return resolve_model(name)


def bench_iteration(args, path: str) -> None:
    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.rllib.session import ray_session

    with ray_session(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=128)):
        modes = {"on": [True], "off": [False], "both": [False, True]}[args.share_prefix]
        for share in modes:
            report_iterations(args, run_iterations(args, path, share), share)


def run_iterations(args, path: str, share_prefix: bool) -> list[dict]:
    from draco_gym.algos.rllib.grpo import GRPOConfig

    config = (
        GRPOConfig()
        .environment(args.env, env_config={"max_turns": args.max_turns})
        .policy(model=path)
        .training(group_size=args.group_size, tasks_per_iteration=args.tasks, max_new_tokens=args.max_new_tokens,
                  max_response_tokens=args.max_turns * (args.max_new_tokens + 400), reward=args.reward,
                  credit=args.credit, minibatch_size=None)
        .env_runners(num_env_runners=1).learners(num_learners=0).debugging(seed=0, log_level="ERROR")
    )
    config.training(share_prefix=share_prefix)
    algo = config.build_algo()
    try:
        algo.train()  # warm-up: first-call costs (lazy imports, env processes) are not steady state
        rows = []
        for _ in range(args.iterations):
            r = algo.train()
            phases = r["timers"]["phases"]
            rows.append({p: float(phases[p]) for p in (*PHASES, "other")} | {
                "total": float(r["timers"]["training_step"]),
                "tokens_per_s": float(r["env_runners"]["generated_tokens_per_s"])})
    finally:
        algo.stop()
    return rows


def report_iterations(args, rows: list[dict], share_prefix: bool) -> None:
    total = statistics.mean(r["total"] for r in rows)
    print(f"\n== one GRPO iteration ({args.tasks} tasks x G={args.group_size}, {args.iterations} timed, "
          f"mean) model={args.model}, learner prefix sharing {'on' if share_prefix else 'off'} ==")
    print(f"{'phase':<12}{'seconds':>10}{'share':>9}")
    for p in PHASES:
        s = statistics.mean(r[p] for r in rows)
        print(f"{p:<12}{s:>10.3f}{s / total:>9.1%}")
    print(f"{'iteration':<12}{total:>10.3f}{1:>9.0%}")
    other = statistics.mean(r["other"] for r in rows) / total
    print(f"everything else: {other:.1%} of the iteration (goal <= 5%: {'met' if other <= 0.05 else 'NOT met'})")
    print(f"rollout tokens/s (sampling time only): {statistics.mean(r['tokens_per_s'] for r in rows):.1f}")


def bench_generation(args, path: str) -> None:
    import gymnasium as gym
    import torch
    from transformers import AutoTokenizer

    import draco_gym  # noqa: F401
    from draco_gym.algos.policy.chat import ChatFormat, eos_token_ids
    from draco_gym.algos.policy.generation import TorchSampler
    from draco_gym.algos.policy.lm import add_lora, load_causal_lm
    from draco_gym.algos.policy.rollout import Episode, EpisodeLimits, run_episodes

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(path)
    lm = add_lora(load_causal_lm(path), {"r": 16, "alpha": 32}).eval()
    chat = ChatFormat.from_tokenizer(tok)
    eos = eos_token_ids(tok, lm.generation_config)
    sampler = TorchSampler(lm, eos_ids=eos, pad_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0])
    limits = EpisodeLimits(max_new_tokens=args.max_new_tokens, max_response_tokens=args.max_turns * (args.max_new_tokens + 400))
    envs = [gym.make(args.env, max_turns=args.max_turns) for _ in range(args.group_size)]
    task = envs[0].unwrapped.task_ids[0]

    def episodes():
        return [Episode.start(env, chat, limits, task_id=task, seed=i) for i, env in enumerate(envs)]

    run_episodes(episodes()[:1], sampler, chat, limits, seed=99)  # warm-up
    results = {}
    for mode in ("batched", "one at a time"):
        stats: dict = {}
        t0 = time.perf_counter()
        for rep in range(2):
            if mode == "batched":
                run_episodes(episodes(), sampler, chat, limits, seed=rep, stats=stats)
            else:
                for i, ep in enumerate(episodes()):
                    run_episodes([ep], sampler, chat, limits, seed=rep * 100 + i, stats=stats)
        results[mode] = (stats["sampled_tokens"], stats["sampling_s"], time.perf_counter() - t0)
    for env in envs:
        env.close()
    print(f"\n== generation of G={args.group_size} episodes, 2 repeats, model={args.model}, "
          f"max_new_tokens={args.max_new_tokens} ==")
    print(f"{'mode':<15}{'tokens':>8}{'sampling s':>12}{'tokens/s':>10}{'wall s':>9}")
    for mode, (n, s, wall) in results.items():
        print(f"{mode:<15}{n:>8}{s:>12.2f}{n / s:>10.1f}{wall:>9.2f}")
    speedup = (results["batched"][0] / results["batched"][1]) / (results["one at a time"][0] / results["one at a time"][1])
    print(f"batched / one at a time: {speedup:.2f}x tokens/s (goal >= 2x: {'met' if speedup >= 2 else 'NOT met'})")


def learner_model(name: str, layers: int) -> str:
    """A directory that loads the model's first ``layers`` layers, its own weights
    (a config that says fewer layers, links to the rest), or the model's own directory."""
    import json
    from pathlib import Path

    src = Path(model_path(name))
    config = json.loads((src / "config.json").read_text())
    if layers <= 0 or layers >= config["num_hidden_layers"]:
        return str(src)
    dst = Path(tempfile.mkdtemp(prefix="draco_bench_layers_"))
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    (dst / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    return str(dst)


def padded_batch(rows, g) -> dict:
    """The learner's batch from (token ids, policy mask) rows: right-padded, one random
    advantage per row on its policy tokens (drawn from ``g``), the first token never a policy
    token (nothing predicts it)."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    batch = {k: torch.zeros(len(rows), width) for k in ("policy_mask", "advantages", "old_logp")}
    batch["input_ids"] = torch.zeros(len(rows), width, dtype=torch.long)
    batch["attention_mask"] = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (ids, policy) in enumerate(rows):
        batch["input_ids"][i, : len(ids)] = ids
        batch["attention_mask"][i, : len(ids)] = 1
        batch["policy_mask"][i, : len(ids)] = policy
        batch["advantages"][i, : len(ids)] = float(torch.randn((), generator=g)) * policy
    batch["policy_mask"][:, 0] = 0
    return batch


def quickstart_batch(group: int, args, vocab: int, seed: int) -> dict:
    """G rollouts of one task as the learner gets them: one prompt, then per turn sampled
    tokens (policy) and an observation (gap), every rollout its own, lengths varying."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(vocab, (n,), generator=g)  # noqa: E731
    between = lambda n: int(torch.randint(n // 2, n + 1, (1,), generator=g))  # noqa: E731
    prompt = rand(args.prompt_tokens)
    rows = []
    for _ in range(group):
        ids, policy = [prompt], [torch.zeros(args.prompt_tokens)]
        for turn in range(args.turns):
            n = between(args.turn_tokens)
            ids.append(rand(n)), policy.append(torch.ones(n))
            if turn < args.turns - 1:
                m = between(args.observation_tokens)
                ids.append(rand(m)), policy.append(torch.zeros(m))
        rows.append((torch.cat(ids), torch.cat(policy)))
    return padded_batch(rows, g)


def model_flops(config, lengths, policy_tokens: int, shared: int = 0) -> float:
    """Forward model FLOPs over rows of these lengths whose first ``shared`` tokens are one
    shared prefix (computed once): 2 x layer weights per token, 4 x width per attended key
    per layer, the vocabulary projection on policy tokens."""
    d = config.hidden_size
    heads = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or d // heads
    kv = config.num_key_value_heads * hd
    layer_weights = d * heads * hd * 2 + 2 * d * kv + 3 * d * config.intermediate_size
    per_token = config.num_hidden_layers * 2 * layer_weights
    per_key = config.num_hidden_layers * 4 * heads * hd
    keys = lambda a, b: (b * (b + 1) - a * (a + 1)) // 2  # noqa: E731 - keys attended by positions a..b-1
    total = per_token * shared + per_key * keys(0, shared)
    for n in lengths:
        total += per_token * (n - shared) + per_key * keys(shared, n)
    return float(total + 2 * d * config.vocab_size * policy_tokens)


def bench_learner(args) -> None:
    import torch

    from draco_gym.algos.policy.iteration import accumulate_gradients, recompute_logprobs
    from draco_gym.algos.config import LossConfig
    from draco_gym.algos.rllib.module import HFPolicyModule
    from draco_gym.algos.policy.prefix import prefix_groups

    torch.set_num_threads(args.learner_threads)
    path = learner_model(args.learner_model, args.learner_layers)
    module = HFPolicyModule(observation_space=None, action_space=None, inference_only=False,
                            model_config={"model": path, "lora": {"r": 16, "alpha": 32}})
    config = module.lm.get_base_model().config
    vocab = module.lm.get_output_embeddings().weight.shape[0]
    params = [p for p in module.lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=5e-5, weight_decay=0.01)
    loss_cfg = LossConfig(kl_coeff=0.01)  # the quickstart's: the reference forward runs
    if module.prefix_sharing() is not None:
        print(f"prefix sharing unsupported for this model: {module.prefix_sharing()}")

    def one_iteration(batch, share: bool):
        """Seconds of the learner's work on ``batch``, and the LoRA gradient (weights restored)."""
        before = [p.detach().clone() for p in params]
        optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        accumulate_gradients(module, batch, loss_cfg, args.micro_batch_tokens, share_prefix=share)
        grad = torch.cat([p.grad.flatten() for p in params])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
        return seconds, grad

    one = quickstart_batch(1, args, vocab, seed=0)
    length, n_policy = int(one["attention_mask"].sum()), int(one["policy_mask"].sum())
    plain_s = float("inf")
    for run in range(1 + args.repeats):  # the first is a warm-up
        t0 = time.perf_counter()
        out = module.forward_train(one, with_reference=False)
        out["logp"].sum().backward()
        if run > 0:
            plain_s = min(plain_s, time.perf_counter() - t0)
        module.lm.zero_grad(set_to_none=True)
    plain = 3 * model_flops(config, [length], n_policy) / plain_s

    rows = []
    for group in args.groups:
        batch, grads = quickstart_batch(group, args, vocab, seed=group), {}
        batch["old_logp"] = recompute_logprobs(module, batch, args.micro_batch_tokens)  # the sampler's, ratio 1
        lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
        n_policy = int(batch["policy_mask"].sum())
        shared = prefix_groups([batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)])[0].length
        flops = {False: 4 * model_flops(config, lengths, n_policy), True: 4 * model_flops(config, lengths, n_policy, shared)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(args.repeats):  # alternating order; the fastest of each counts (shared machine)
            for share in ((False, True) if rep % 2 == 0 else (True, False)):
                seconds, grads[share] = one_iteration(batch, share)
                times[share].append(seconds)
                print(f"  G={group} sharing {'on' if share else 'off'}: {seconds:.2f} s", file=sys.stderr, flush=True)
        off_s, on_s = min(times[False]), min(times[True])
        gap = float((grads[True] - grads[False]).norm() / grads[False].norm())
        rows.append((group, off_s, on_s, flops, gap, shared))

    layers = f"{config.num_hidden_layers} layers"
    print(f"\n== learner, one iteration on G rollouts of one task (fastest of {args.repeats}) : model={args.learner_model} ({layers}), "
          f"prompt {args.prompt_tokens} + {args.turns} turns of <= {args.turn_tokens} sampled + "
          f"<= {args.observation_tokens} observation tokens, micro_batch_tokens={args.micro_batch_tokens}, "
          f"{args.learner_threads} threads ==")
    print(f"plain forward+backward of one {length}-token sequence: {plain_s:.2f} s, "
          f"{plain / 1e9:.1f} GFLOP/s (the practical limit)")
    print(f"{'G':>3}{'shared':>8}{'unshared s':>12}{'shared s':>10}{'speedup':>9}{'unshared GFLOP/s':>18}"
          f"{'shared GFLOP/s':>16}{'grad rel diff':>15}")
    for group, off_s, on_s, flops, gap, shared in rows:
        off_rate, on_rate = flops[False] / off_s, flops[True] / on_s
        print(f"{group:>3}{shared:>8}{off_s:>12.2f}{on_s:>10.2f}{off_s / on_s:>8.2f}x"
              f"{off_rate / 1e9:>9.1f} ({off_rate / plain:>4.0%})"
              f"{on_rate / 1e9:>8.1f} ({on_rate / plain:>4.0%}){gap:>15.1e}")
    print("(FLOP/s: model FLOPs each path executes per second, training 3x forward + reference 1x; "
          "in % of the plain forward+backward)")
    group, off_s, on_s, *_ = next((r for r in rows if r[0] == 6), rows[-1])
    ratio = off_s / on_s
    print(f"learner speedup from prefix sharing at G={group}: {ratio:.2f}x (goal >= 2x: {'met' if ratio >= 2 else 'NOT met'})")


def main() -> None:
    args = parse()
    if "generation" not in args.skip or "iteration" not in args.skip:
        path = model_path(args.model)
    if "generation" not in args.skip:
        bench_generation(args, path)
    if "iteration" not in args.skip:
        bench_iteration(args, path)
    if "learner" not in args.skip:
        bench_learner(args)


if __name__ == "__main__":
    main()
