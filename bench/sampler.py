"""The torch sampler against the vLLM sampler, side by side in one run.

    python bench/sampler.py                          # CPU: SmolLM2-135M, 16 prompts x 64 tokens
    python bench/sampler.py --device cuda            # GPU (bench/gpu_check.sh runs this)
    python bench/sampler.py --skip iteration         # the sampling part only

Part 1: the same chat prompts, batch, model, LoRA adapter (r 16, all linear, non-zero: as
training samples) and token budget (T = 1, every row runs to the budget unless it ends)
through ``TorchSampler`` (transformers + PEFT, in this process) and ``VLLMSampler`` (vLLM's
engine as a Ray actor from vLLM's own environment, ``draco-gym setup vllm``). Each is
warmed up once, then timed over ``--repeats`` calls; it prints generated tokens/s of each,
and raw vLLM's: the same requests to ``llm.generate`` inside the engine's actor, timed there,
so that draco-gym's sampler / raw is what the framework costs on top of vLLM.
Part 2: one real GRPO iteration (PythonTools, the trainer's own code, one env runner, local
learner) with each sampler, and each phase's seconds side by side. Engine load time is
reported apart (it is paid once per run, not per iteration).
The last line is the sampling ratio vLLM/torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    topics = ["fruits", "rivers", "planets", "metals", "birds", "trees", "oceans", "colours"]
    return [list(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a short Python function about {topics[k % len(topics)]} number {k}."}],
        add_generation_prompt=True, tokenize=True, return_dict=False)) for k in range(n)]


def lora_adapter(model_path: str, folder: str):
    """SmolLM2 with a seeded, non-zero LoRA adapter (saved to ``folder`` for vLLM)."""
    import torch

    from draco_gym.algos.policy.lm import add_lora, load_causal_lm

    lm = add_lora(load_causal_lm(model_path), {"r": 16, "alpha": 32}, seed=1)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for key, p in lm.named_parameters():
            if "lora_B" in key:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    lm.save_pretrained(folder)
    return lm.eval()


def timed(sampler, prompts, budget: int, repeats: int) -> tuple[float, int]:
    sampler.sample(prompts[:2], [8, 8], seed=0)  # warm-up
    rates, tokens = [], 0
    for k in range(repeats):
        start = time.perf_counter()
        out = sampler.sample(prompts, [budget] * len(prompts), seed=100 + k)
        n = sum(len(s.token_ids) for s in out)
        rates.append(n / (time.perf_counter() - start))
        tokens += n
    return statistics.median(rates), tokens


def sampling(args, model_path: str) -> tuple[float, float]:
    import torch
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import eos_token_ids
    from draco_gym.algos.policy.generation import TorchSampler
    from draco_gym.algos.rllib.vllm_sampler import VLLMSampler, start_engine, stop_engine

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = chat_prompts(tokenizer, args.prompts)
    folder = tempfile.mkdtemp(prefix="bench_lora_")
    lm = lora_adapter(model_path, folder).to(args.device)
    eos = eos_token_ids(tokenizer, lm.generation_config)
    print(f"model {model_path}, {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {args.tokens} new tokens each, T = 1, LoRA r 16 (non-zero), device {args.device}, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    torch_rate, n = timed(TorchSampler(lm, eos_ids=eos, pad_id=tokenizer.pad_token_id or eos[0]), prompts,
                          args.tokens, args.repeats)
    print(f"torch sampler: {torch_rate:.1f} tokens/s (median of {args.repeats}, {n} tokens)", flush=True)
    del lm
    start = time.perf_counter()
    engine, info = start_engine(model_path, max_model_len=2048, kv_cache_gib=args.kv_cache_gib)
    print(f"vLLM engine up in {time.perf_counter() - start:.0f} s ({info})", flush=True)
    try:
        sampler = VLLMSampler(engine, eos_ids=eos)
        sampler.set_adapter(folder)
        vllm_rate, n = timed(sampler, prompts, args.tokens, args.repeats)
        print(f"vLLM sampler: {vllm_rate:.1f} tokens/s (median of {args.repeats}, {n} tokens)", flush=True)
        raw_rate, n = raw_vllm(engine, prompts, args.tokens, args.repeats, eos)
    finally:
        stop_engine(engine)
    print(f"raw vLLM (llm.generate inside the engine's actor): {raw_rate:.1f} tokens/s (median of {args.repeats}, "
          f"{n} tokens); draco-gym's sampler / raw: {vllm_rate / raw_rate:.2f}", flush=True)
    return torch_rate, vllm_rate


def _generate_in_host(host, prompts, budget, seed, stop_token_ids):
    """Runs inside the engine's actor (vLLM's interpreter, no draco-gym): the same requests
    ``EngineHost.sample`` makes, straight to ``llm.generate``, timed there."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=budget, logprobs=0,
                             stop_token_ids=list(stop_token_ids), seed=seed + i, skip_special_tokens=False)
              for i in range(len(prompts))]
    start = time.perf_counter()
    outs = host.llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=host._lora,
                             use_tqdm=False)
    return sum(len(out.outputs[0].token_ids) for out in outs), time.perf_counter() - start


def raw_vllm(engine, prompts, budget: int, repeats: int, eos) -> tuple[float, int]:
    """vLLM alone on the same prompts, adapter, seeds and budget as ``timed``: what the
    sampler's Ray call, its plain-type conversions and the log-prob read-out cost on top."""
    from draco_gym.algos.rllib.vllm_sampler import call_in_engine

    rates, tokens = [], 0
    for k in range(repeats):
        n, seconds = call_in_engine(engine, _generate_in_host, prompts, budget, 100 + k, list(eos))
        rates.append(n / seconds)
        tokens += n
    return statistics.median(rates), tokens


def iteration(args, model_path: str) -> None:
    from draco_gym.algos.rllib.grpo import GRPOConfig
    from draco_gym.algos.rllib.reporting import PHASES

    rows = {}
    for sampler in ("torch", "vllm"):
        config = (GRPOConfig()
                  .environment("draco_gym/PythonTools-v0", env_config={"max_turns": 2})
                  .policy(model=model_path, sampler=sampler, vllm_kv_cache_gib=args.kv_cache_gib)
                  .training(group_size=4, tasks_per_iteration=2, max_new_tokens=args.tokens,
                            max_response_tokens=4 * args.tokens, reward="rule", credit="draco",
                            recompute_old_logprobs=True)
                  .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
                  .learners(num_learners=0)
                  .debugging(seed=0, log_level="ERROR"))
        start = time.perf_counter()
        algo = config.build_algo()
        built = time.perf_counter() - start
        try:
            result = algo.train()
        finally:
            algo.stop()
        phases = result["timers"]["phases"]
        rows[sampler] = {"build": built, **{p: phases.get(p, 0.0) for p in PHASES},
                         "iteration": result["time_this_iter_s"],
                         "tokens/s": result["env_runners"]["generated_tokens_per_s"],
                         "logp diff": result["learners"].get("__all_modules__", {}).get("sampler_logp_max_abs_diff", float("nan"))}
    print("\none GRPO iteration (PythonTools, G = 4 x 2 tasks, SmolLM2, LoRA r 16), seconds:")
    print(f"{'':>12} {'torch':>10} {'vllm':>10}")
    for key in rows["torch"]:
        print(f"{key:>12} {rows['torch'][key]:>10.4g} {rows['vllm'][key]:>10.4g}")
    print("(build: trainer start, the vLLM engine load included; logp diff: max |learner - sampler| log-prob)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--skip", action="append", default=[], choices=["iteration"])
    args = parser.parse_args()

    from draco_gym.algos.config import ResourcesSection
    from draco_gym.algos.policy.models import resolve_model
    from draco_gym.algos.rllib.session import ray_session

    model_path = resolve_model(args.model)
    with ray_session(ResourcesSection(ray_num_cpus=2, object_store_memory_mb=200)):
        torch_rate, vllm_rate = sampling(args, model_path)
        if "iteration" not in args.skip:
            iteration(args, model_path)
    print(f"sampling tokens/s vLLM/torch: {vllm_rate / torch_rate:.2f}x ({vllm_rate:.1f} vs {torch_rate:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
