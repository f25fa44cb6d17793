"""Sampling backends: many prompts in, one sampled continuation with log-probs per prompt out.

``TorchSampler`` is a plain KV-cached sampling loop over a transformers model, batched over
left-padded prompts. It is written out rather than calling ``generate`` for two reasons:
the log-probability of each sampled token comes from exactly the distribution that drew it
(``log_softmax(logits / T)``, the same expression the learner evaluates), and memory stays
O(batch) instead of keeping every step's full-vocabulary logits.

``VLLMSampler`` does the same with a vLLM engine on GPU; the LoRA adapter is loaded per
weights version. It imports vllm lazily and is UNVERIFIED here (no GPU on the build
machine); the trainer recomputes old log-probs on the learner when it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass
class Sample:
    """One continuation: the sampled ids (EOS included when sampled) and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]
    ended_with_eos: bool


class Sampler(Protocol):
    def sample(self, prompts: Sequence[list[int]], max_new_tokens: Sequence[int], seed: int) -> list[Sample]: ...


class TorchSampler:
    """Batched ancestral sampling from a transformers causal LM (CPU or GPU).

    ``temperature == 0`` means greedy decoding; the recorded log-probs are then those of
    the untempered distribution.
    """

    def __init__(self, model, *, eos_ids: Sequence[int], pad_id: int, temperature: float = 1.0) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.model = model
        self.eos_ids = tuple(eos_ids)
        self.pad_id = int(pad_id)
        self.temperature = float(temperature)

    def sample(self, prompts: Sequence[list[int]], max_new_tokens: Sequence[int], seed: int) -> list[Sample]:
        import torch

        if not prompts:
            return []
        if len(max_new_tokens) != len(prompts):
            raise ValueError("one max_new_tokens per prompt")
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's last token is aligned
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        budget = torch.tensor(list(max_new_tokens), device=device)
        eos = torch.tensor(self.eos_ids, device=device)
        generator = torch.Generator(device=device).manual_seed(int(seed))

        out_ids: list[list[int]] = [[] for _ in prompts]
        out_lp: list[list[float]] = [[] for _ in prompts]
        done = budget <= 0
        ended = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        step_input, step_pos, cache = ids, positions, None
        cache_kw = _cache_argument(self.model)
        with torch.no_grad():
            for t in range(int(budget.max().item()) if len(budget) else 0):
                if bool(done.all()):
                    break
                out = self.model(
                    input_ids=step_input,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{cache_kw: cache},
                )
                cache = getattr(out, cache_kw)
                logits = out.logits[:, -1].float()
                if self.temperature > 0:
                    logp = torch.log_softmax(logits / self.temperature, dim=-1)
                    token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
                else:
                    logp = torch.log_softmax(logits, dim=-1)
                    token = logits.argmax(-1)
                token_lp = logp.gather(-1, token[:, None]).squeeze(-1)
                for i in torch.nonzero(~done).flatten().tolist():
                    out_ids[i].append(int(token[i]))
                    out_lp[i].append(float(token_lp[i]))
                hit_eos = torch.isin(token, eos) & ~done
                ended |= hit_eos
                done = done | hit_eos | (budget <= t + 1)
                step_input = token[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        return [Sample(out_ids[i], out_lp[i], bool(ended[i])) for i in range(len(prompts))]


def _cache_argument(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; accept both."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


class VLLMSampler:
    """Sampling with vLLM (GPU). UNVERIFIED: written against vLLM's documented offline API
    (``LLM.generate`` with token prompts, ``SamplingParams(logprobs=0)``, ``LoRARequest``)
    but never run on this project's build machine, which has no GPU.

    The adapter is handed over as a directory written by ``HFPolicyModule.save_adapter``;
    ``set_adapter`` switches to a new weights version.
    """

    def __init__(self, model_path: str, *, eos_ids: Sequence[int], temperature: float = 1.0,
                 max_lora_rank: int = 16, gpu_memory_utilization: float = 0.5, max_model_len: int | None = None) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise ImportError("sampler 'vllm' needs vLLM: pip install 'draco-gym[vllm]' on a GPU machine") from exc
        self.llm = LLM(model=model_path, enable_lora=True, max_lora_rank=max_lora_rank,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)
        self.eos_ids = list(eos_ids)
        self.temperature = float(temperature)
        self._lora = None
        self._version = 0

    def set_adapter(self, adapter_dir: str) -> None:
        from vllm.lora.request import LoRARequest

        self._version += 1
        self._lora = LoRARequest(f"policy-v{self._version}", self._version, adapter_dir)

    def sample(self, prompts: Sequence[list[int]], max_new_tokens: Sequence[int], seed: int) -> list[Sample]:
        from vllm import SamplingParams

        params = [
            SamplingParams(temperature=self.temperature, top_p=1.0, top_k=-1, max_tokens=max(1, int(n)),
                           logprobs=0, stop_token_ids=self.eos_ids, seed=seed + i)
            for i, n in enumerate(max_new_tokens)
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 lora_request=self._lora, use_tqdm=False)
        samples = []
        for out in outs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids)]
            samples.append(Sample(ids, lps, bool(ids) and ids[-1] in self.eos_ids))
        return samples
