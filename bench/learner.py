"""The learner near the machine's limit: its achieved FLOP/s against a plain matmul of the same
shapes, and its memory, with the log-probs chunked and (for comparison) unchunked, and with
activation checkpointing.

    python bench/learner.py                                  # configs/quickstart.yaml's iteration
    python bench/learner.py --layers 4 --repeats 1           # a quick look (the first 4 layers)
    python bench/learner.py --modes chunked --micro-batch-tokens 2048 512   # memory against micro-batch size
    python bench/learner.py --modes chunked checkpointed --repeats 1        # what activation checkpointing costs

The batch is one iteration of the config's GRPO phase as the learner receives it: for each of
``rollout.tasks_per_iteration`` train tasks, ``rollout.group_size`` rows that begin with the
task's real prompt (the env's own, through the policy's chat template), then ``max_turns``
turns of up to ``rollout.max_new_tokens`` sampled tokens, each but the last followed by an
observation (random token ids: the FLOPs do not depend on the ids). The learner's work on it
is the trainer's own: ``accumulate_gradients`` (current policy forward and backward, the
reference forward with the adapter off, micro-batches of ``optim.micro_batch_tokens``, prefix
sharing per ``optim.share_prefix``), the gradient clip and the AdamW step, under the config's
policy (model, dtype, LoRA, temperature).

Each variant (mode x micro-batch size) runs in a process of its own (``spawn``), all loaded
before any timing: one warm-up iteration each, then ``--repeats`` timed ones, the variants
taking turns so that each sees the same machine. Printed per variant:

- seconds per learner iteration (the fastest) and the process's peak PSS during it, and what
  the step added over the PSS before it (sampled every 0.1 s; freed pages are handed back
  first, as the trainer's learner does after each step);
- achieved FLOP/s, counted as 6 x N x tokens: N is the trainable path's parameters, the
  weights of every linear layer of the decoder (the path the gradient runs through to the
  LoRA adapters; embeddings are a lookup), over every token the backbone computes (a shared
  prefix once per group); plus 6 x width x vocabulary per policy token (the head runs on
  policy tokens only). Attention's score FLOPs are not counted. The 6N convention (forward
  2N, backward 4N) sits close to the work done here: the frozen weights' own gradients are
  skipped (-2N) and the reference forward added (+2N);
- the matmul limit, measured right before and right after each timed iteration in the same
  process and threads (the higher of the two: a shared machine's speed moves between
  minutes): for every linear shape of that path and the head, [tokens x in] @ [in x out] and
  the two matmuls of its backward, on inputs of a micro-batch's tokens (the head's: the
  iteration's policy tokens, up to that), each the fastest of 5 into preallocated outputs,
  summed with the model's weights: the FLOP/s a learner doing nothing but those matmuls
  would get;
- the same share with attention's FLOPs counted too (PaLM's convention, appendix B of
  Chowdhery et al. 2022): QK^T and the weighted sum of V, 4 x heads x head_dim FLOPs per key
  a query attends to (causal keys only; a shared prefix once per group) in a forward, three
  forwards' worth for the policy's forward and backward, one for the reference's. At an
  agent's context lengths (~840 tokens a row here against a width of 576) attention adds a
  fifth to the 6N count, which leaves it out.

The last line is the learner's share of that limit by the 6N count (chunked, the first
micro-batch size; the median over its iterations of each one's FLOP/s over the limit measured
beside it). Goal: >= 0.5.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from draco_gym.bench.train_iteration import learner_model, padded_batch

MODES = {
    "unchunked": "the whole micro-batch's [tokens x vocab] logits at once (the textbook expression)",
    "chunked": "draco-gym's log-probs: 256 policy tokens of logits at a time, their gradient taken at once",
    "checkpointed": "chunked, each decoder layer recomputed in the backward (policy.gradient_checkpointing): "
                    "its forward runs twice, not counted in the FLOPs",
}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/quickstart.yaml", help="the run config whose GRPO iteration to time")
    p.add_argument("--layers", type=int, default=0, help="keep the model's first N layers (0: all): a quicker look")
    p.add_argument("--threads", type=int, default=2, help="torch threads, for the learner and the matmuls alike")
    p.add_argument("--repeats", type=int, default=2, help="timed iterations per variant (after one warm-up)")
    p.add_argument("--observation-tokens", type=int, default=60, help="tokens of each observation between turns")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--micro-batch-tokens", type=int, nargs="+", default=None,
                   help="run each mode at each of these micro-batch sizes (default: the config's optim.micro_batch_tokens)")
    return p.parse_args(argv)


def iteration_batch(config, model_path: str, seed: int = 0, observation_tokens: int = 60) -> dict:
    """One iteration's learner batch (tensors [rows, width]) from the config: real prompts,
    random continuations within the config's budgets."""
    import torch
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.registration import env_entry, env_tasks, make_from_entry

    ro = config.rollout
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    chat = ChatFormat.from_tokenizer(tokenizer)
    env = make_from_entry(env_entry(config.env.id, config.env.modules), config.env.config)
    tasks = env_tasks(env, config.env.id, config.env.task_ids)[: ro.tasks_per_iteration]
    turns = int(config.env.config.get("max_turns", 2))
    vocab = len(tokenizer)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for task in tasks:
        prompt, _ = env.reset(seed=seed, options={"task_id": task})
        prompt_ids = torch.tensor(chat.prompt_ids(prompt, ro.max_prompt_tokens))
        for _ in range(ro.group_size):
            ids, policy = [prompt_ids], [torch.zeros(len(prompt_ids))]
            for turn in range(turns):
                n = int(torch.randint(ro.max_new_tokens // 2, ro.max_new_tokens + 1, (1,), generator=g))
                ids.append(torch.randint(vocab, (n,), generator=g)), policy.append(torch.ones(n))
                if turn < turns - 1:
                    ids.append(torch.randint(vocab, (observation_tokens,), generator=g))
                    policy.append(torch.zeros(observation_tokens))
            rows.append((torch.cat(ids), torch.cat(policy)))
    env.close()
    return padded_batch(rows, g)


def unchunked_logprobs(hidden, head, chosen, temperature: float = 1.0, chunk_tokens: int = 0):
    """The baseline: every policy token's logits at once, one log-softmax."""
    import torch

    logits = head(hidden).float()
    if temperature > 0:
        logits = logits / temperature
    return logits.gather(-1, chosen[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def linear_shapes(lm) -> dict[tuple[int, int], int]:
    """(in, out) -> how many of the decoder's linear layers have that shape (LoRA's base
    layers; the adapters' own small matmuls are left out)."""
    import torch

    from draco_gym.algos.policy.lm import decoder_and_head

    backbone, _ = decoder_and_head(lm)
    shapes: dict[tuple[int, int], int] = {}
    for name, m in backbone.named_modules():
        if isinstance(m, torch.nn.Linear) and "lora_" not in name:
            shapes[(m.in_features, m.out_features)] = shapes.get((m.in_features, m.out_features), 0) + 1
    return shapes


def matmul_rate(shapes: dict[tuple[int, int], int], rows: int, head: tuple[int, int], head_rows: int,
                head_count: float) -> float:
    """FLOP/s of a forward and backward's matmuls (y = x W^T, dx = dy W, dW = x^T dy) over
    these shapes, weighted by their counts (the head's by its share of the tokens); each the
    fastest of 5, into preallocated outputs (the machine's best, not its allocator's)."""
    import torch

    def timed(m: int, k: int, n: int) -> float:
        x, w, dy = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
        y, dx, dw = torch.empty(m, n), torch.empty(m, k), torch.empty(k, n)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            torch.mm(x, w.T, out=y)
            torch.mm(dy, w, out=dx)
            torch.mm(x.T, dy, out=dw)
            best = min(best, time.perf_counter() - t0)
        return best

    flops = seconds = 0.0
    for (k, n), count in shapes.items():
        flops += count * 6 * rows * k * n
        seconds += count * timed(rows, k, n)
    flops += head_count * 6 * head_rows * head[0] * head[1]  # = 6 x head x policy tokens
    seconds += head_count * timed(head_rows, *head)
    return flops / seconds


_STATE: dict = {}  # the worker process's learner, between calls


def setup_variant(config_path: str, mode: str, micro_batch_tokens: int | None, layers: int, threads: int,
                  observation_tokens: int) -> dict:
    """Load the policy and build the batch in this (fresh) worker process; one warm-up
    iteration. Returns the batch's figures."""
    import torch

    from draco_gym.algos.config import load_config
    from draco_gym.algos.policy import lm as lm_module
    from draco_gym.algos.policy.iteration import accumulate_gradients, recompute_logprobs
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.algos.rllib.module import HFPolicyModule

    torch.set_num_threads(threads)
    if mode == "unchunked":
        lm_module.chosen_logprobs = unchunked_logprobs
    config = load_config(config_path)
    path = learner_model(resolve_model(config.policy.model), layers)
    module = HFPolicyModule(observation_space=None, action_space=None, inference_only=False, model_config={
        "model": path, "dtype": config.policy.dtype, "lora": config.policy.lora.model_dump(),
        "temperature": config.rollout.temperature, "gradient_checkpointing": mode == "checkpointed"})
    batch = iteration_batch(config, path, observation_tokens=observation_tokens)
    optim = config.optim.model_copy(update={"micro_batch_tokens": micro_batch_tokens or config.optim.micro_batch_tokens})
    params = [p for p in module.lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
    batch["old_logp"] = recompute_logprobs(module, batch, optim.micro_batch_tokens, optim.share_prefix)  # ratio 1

    def iteration() -> float:
        optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        accumulate_gradients(module, batch, optim, optim.micro_batch_tokens, share_prefix=optim.share_prefix)
        if optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        optimizer.step()
        return time.perf_counter() - t0

    _STATE.update(module=module, optim=optim, iteration=iteration,
                  figures=batch_figures(module, batch, optim.share_prefix) | {"threads": threads})
    iteration()  # warm-up
    from draco_gym.algos.memory import release_freed_memory

    release_freed_memory()
    return _STATE["figures"]


def batch_figures(module, batch, share_prefix: bool) -> dict:
    """The iteration's counted FLOPs and attention's (module docstring), and its token counts."""
    from draco_gym.algos.policy.lm import decoder_and_head
    from draco_gym.algos.policy.prefix import prefix_groups

    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    n_policy = int(batch["policy_mask"][:, 1:].sum())
    groups = prefix_groups([batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)])
    shared = sum((len(g.rows) - 1) * g.length for g in groups) if share_prefix else 0
    backbone_tokens = sum(lengths) - shared
    n_path = sum(count * k * n for (k, n), count in linear_shapes(module.lm).items())
    head = decoder_and_head(module.lm)[1]
    config = module.lm.get_base_model().config
    width = config.num_attention_heads * (getattr(config, "head_dim", None)
                                         or config.hidden_size // config.num_attention_heads)
    keys = 0  # causal keys attended to, summed over the queries the backbone computes
    for g in groups:
        p = g.length if share_prefix else 0
        keys += p * (p + 1) // 2 + sum((lengths[r] * (lengths[r] + 1) - p * (p + 1)) // 2 for r in g.rows)
    return {"flops": 6 * n_path * backbone_tokens + 6 * head.in_features * head.out_features * n_policy,
            "attention_flops": 16 * width * config.num_hidden_layers * keys,
            "rows": len(lengths), "tokens": sum(lengths), "backbone_tokens": backbone_tokens,
            "policy_tokens": n_policy, "n_path": n_path,
            "layers": config.num_hidden_layers}


def timed_iteration() -> dict:
    """One learner iteration: its seconds, this process's peak PSS during it and its PSS
    before; and the matmul limit of its shapes measured right before and right after it (so
    both see the same machine), the higher of the two."""
    from draco_gym.algos.memory import TreeMemory, release_freed_memory

    release_freed_memory()  # as the trainer's learner does after each step
    limit_before = matmul_limit()
    memory = TreeMemory(os.getpid(), interval_s=0.1)
    before = memory.root.memory_full_info().pss
    with memory:
        seconds = _STATE["iteration"]()
    release_freed_memory()  # the other variants' turn: this one keeps only what it holds
    return {"seconds": seconds, "peak": memory.peak_pss, "before": before,
            "limit": max(limit_before, matmul_limit())}


def matmul_limit() -> float:
    from draco_gym.algos.policy.lm import decoder_and_head

    f = _STATE["figures"]
    head = decoder_and_head(_STATE["module"].lm)[1]
    rows = min(_STATE["optim"].micro_batch_tokens, f["backbone_tokens"])
    head_rows = min(f["policy_tokens"], rows)  # the limit is the machine's: the head's matmul at its largest
    return matmul_rate(linear_shapes(_STATE["module"].lm), rows, (head.in_features, head.out_features), head_rows,
                       head_count=f["policy_tokens"] / head_rows)


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None) -> int:
    args = parse(argv)
    load = os.getloadavg()
    spawn = multiprocessing.get_context("spawn")
    variants = [(mode, mbt) for mbt in (args.micro_batch_tokens or [None]) for mode in args.modes]
    pools = {v: ProcessPoolExecutor(max_workers=1, mp_context=spawn) for v in variants}
    try:
        figures = {}
        for (mode, mbt), pool in pools.items():  # one at a time: loading is not what is measured
            figures[mode, mbt] = pool.submit(setup_variant, args.config, mode, mbt, args.layers, args.threads,
                                             args.observation_tokens).result()
        runs: dict[tuple, list[dict]] = {v: [] for v in variants}
        for rep in range(args.repeats):  # the variants take turns, so each sees the same machine
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                r = pools[v].submit(timed_iteration).result()
                runs[v].append(r)
                print(f"  {v[0]} {v[1] or ''}: {r['seconds']:.2f} s, peak {r['peak'] / 2**30:.2f} GiB PSS (before "
                      f"{r['before'] / 2**30:.2f}), matmul limit {r['limit'] / 1e9:.1f} GFLOP/s", file=sys.stderr,
                      flush=True)
        peaks = {v: pools[v].submit(max_rss).result() for v in variants}
    finally:
        for pool in pools.values():
            pool.shutdown()
    from draco_gym.algos.config import load_config

    config_mbt = load_config(args.config).optim.micro_batch_tokens
    first = next(iter(figures.values()))
    gib = 2**30
    print(f"\n== the learner on one iteration of {args.config}: {first['rows']} rows, {first['tokens']} tokens "
          f"({first['backbone_tokens']} through the backbone with prefix sharing, {first['policy_tokens']} policy), "
          f"{first['layers']} layers, {first['threads']} threads, {args.repeats} timed iterations per variant; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end ==")
    print(f"counted FLOPs: 6 x {first['n_path'] / 1e6:.1f}M path parameters x {first['backbone_tokens']} tokens + "
          f"6 x head x {first['policy_tokens']} policy tokens = {first['flops'] / 1e12:.2f} TFLOP per iteration; "
          f"attention {first['attention_flops'] / 1e12:.2f} TFLOP more")
    print(f"{'mode':<13}{'micro':>6}{'s/iter':>8}{'GFLOP/s':>9}{'matmul GFLOP/s':>16}{'share':>7}{'+attn':>7}"
          f"{'peak PSS GiB':>14}{'step adds GiB':>15}{'max RSS GiB':>13}")
    rows = {}
    for mode, mbt in variants:
        best = min(runs[mode, mbt], key=lambda r: r["seconds"])
        share = statistics.median(first["flops"] / r["seconds"] / r["limit"] for r in runs[mode, mbt])
        with_attention = statistics.median((first["flops"] + first["attention_flops"]) / r["seconds"] / r["limit"]
                                           for r in runs[mode, mbt])
        peak = max(r["peak"] for r in runs[mode, mbt])
        adds = max(r["peak"] - r["before"] for r in runs[mode, mbt])
        rows[mode, mbt] = {"seconds": best["seconds"], "share": share, "peak": peak}
        print(f"{mode:<13}{mbt or config_mbt:>6}{best['seconds']:>8.2f}{first['flops'] / best['seconds'] / 1e9:>9.1f}"
              f"{best['limit'] / 1e9:>16.1f}{share:>7.2f}{with_attention:>7.2f}{peak / gib:>14.2f}{adds / gib:>15.2f}"
              f"{peaks[mode, mbt] / gib:>13.2f}")
    print("(s/iter, GFLOP/s: the fastest iteration, and the matmul limit measured beside it; share: the median "
          "over iterations of each one's FLOP/s over the limit measured beside it; +attn: the same with attention's "
          "FLOPs counted too)")
    for mode, what in MODES.items():
        if mode in args.modes:
            print(f"  {mode}: {what}")
    for mbt in args.micro_batch_tokens or [None]:
        if ("unchunked", mbt) in rows and ("chunked", mbt) in rows:
            a, b = rows["unchunked", mbt], rows["chunked", mbt]
            print(f"chunked / unchunked at {mbt or config_mbt} micro-batch tokens: time {b['seconds'] / a['seconds']:.2f}, "
                  f"process peak {b['peak'] / a['peak']:.2f}")
        if ("checkpointed", mbt) in rows and ("chunked", mbt) in rows:
            a, b = rows["chunked", mbt], rows["checkpointed", mbt]
            print(f"checkpointed / chunked at {mbt or config_mbt} micro-batch tokens: time {b['seconds'] / a['seconds']:.2f}, "
                  f"process peak {b['peak'] / a['peak']:.2f}")
    key = ("chunked", (args.micro_batch_tokens or [None])[0])
    key = key if key in rows else variants[0]
    share = rows[key]["share"]
    print(f"learner share of the matmul limit ({key[0]}, {key[1] or config_mbt} micro-batch tokens): "
          f"{share:.2f} (goal >= 0.5: {'met' if share >= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
