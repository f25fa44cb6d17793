"""``sampler: vllm``: the env runner's client of a vLLM engine that runs as its own Ray actor.

Each env runner starts one engine (``vllm_host.EngineHost``) on its own node, in vLLM's
own environment (``vllm_runtime``), and owns it: Ray ends the engine with its runner. The
runner hands it every new LoRA adapter (``set_adapter``: PEFT's files, sent as bytes, so
the engine writes them on its own node), and samples whole batches through it. The engine
sees token ids only: the chat template, the environments and the reward stay here.

On CPU the engine's KV cache is sized explicitly (``VLLM_CPU_KVCACHE_SPACE``, GiB; without
it vLLM reads ``gpu_memory_utilization`` as a share of system RAM; whole GiB only); on GPU the engine takes
one GPU of its own and ``gpu_memory_utilization`` of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import ray

from draco_gym.algos.policy.generation import Sample

# How long an engine may take to load (measured on 2 shared cores: 16-150 s).
STARTUP_TIMEOUT_S = 900.0


def model_max_len(model_path: str) -> int | None:
    """The model's own context length, from its config (None when it does not say)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def start_engine(model_path: str, *, dtype: str = "float32", max_model_len: int = 4096, max_lora_rank: int = 16,
                 seed: int = 0, kv_cache_gib: int = 1, gpu_memory_utilization: float = 0.5,
                 runtime=None):
    """An ``EngineHost`` actor on this node, in vLLM's environment, loaded and ready.

    Raises ``vllm_runtime.SetupError`` (before any actor starts) when there is no vLLM
    environment; the engine's own load error otherwise."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from draco_gym.algos.policy import vllm_host
    from draco_gym.algos.policy.vllm_runtime import VLLMRuntime

    runtime = runtime or VLLMRuntime()
    python, record = runtime.engine_python()
    cap = model_max_len(model_path)
    if cap is not None:
        max_model_len = min(max_model_len, cap)
    # The host module is not importable in vLLM's environment (no draco-gym there): Ray
    # ships the class itself.
    ray.cloudpickle.register_pickle_by_value(vllm_host)  # (session.ship_by_value: an import cycle)
    gpu = bool(record.get("cuda"))
    env_vars = {"VLLM_CACHE_ROOT": str(runtime.cache_dir), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)), "TOKENIZERS_PARALLELISM": "false",
                "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": ""}
    host = ray.remote(vllm_host.EngineHost).options(
        num_cpus=0, num_gpus=1 if gpu else 0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        runtime_env={"py_executable": str(python), "env_vars": env_vars},
    ).remote(model_path, dtype=dtype, max_model_len=max_model_len, max_lora_rank=max_lora_rank, seed=seed,
             gpu_memory_utilization=gpu_memory_utilization)
    info = ray.get(host.ready.remote(), timeout=STARTUP_TIMEOUT_S)
    return host, info


# The ranks vLLM sizes its LoRA slots for (``max_lora_rank`` must be one of them).
LORA_RANK_SLOTS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest LoRA slot of vLLM's that holds an adapter of ``rank``."""
    for slot in LORA_RANK_SLOTS:
        if rank <= slot:
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({LORA_RANK_SLOTS[-1]})")


def adapter_files(adapter_dir: str | Path) -> dict[str, bytes]:
    """PEFT's adapter files (config and weights) as bytes, for an engine on any node."""
    folder = Path(adapter_dir)
    files = {p.name: p.read_bytes() for p in folder.iterdir()
             if p.name.startswith("adapter_") and p.suffix in (".json", ".safetensors", ".bin")}
    if "adapter_config.json" not in files:
        raise FileNotFoundError(f"{folder} holds no PEFT adapter (adapter_config.json)")
    return files


class VLLMSampler:
    """Sampling through a vLLM engine actor, always with the current LoRA adapter.

    ``set_adapter`` must come before the first ``sample``: the trainer's runner hands over
    the initial adapter at once, so no request is ever sent without one."""

    def __init__(self, engine, *, eos_ids: Sequence[int], temperature: float = 1.0, timeout_s: float = 3600.0) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.engine = engine
        self.eos_ids = [int(t) for t in eos_ids]
        self.temperature = float(temperature)
        self.timeout_s = timeout_s
        self.adapter_id: int | None = None

    def with_temperature(self, temperature: float) -> VLLMSampler:
        """The same engine and adapter, sampling at another temperature (evaluation)."""
        other = VLLMSampler(self.engine, eos_ids=self.eos_ids, temperature=temperature, timeout_s=self.timeout_s)
        other.adapter_id = self.adapter_id
        return other

    def set_adapter(self, adapter_dir: str | Path) -> int:
        """The LoRA weights saved in ``adapter_dir`` become the engine's, under a new id."""
        self.adapter_id = ray.get(self.engine.load_adapter.remote(adapter_files(adapter_dir)), timeout=self.timeout_s)
        return self.adapter_id

    def sample(self, prompts: Sequence[list[int]], max_new_tokens: Sequence[int], seed: int) -> list[Sample]:
        if not prompts:
            return []
        outs = ray.get(self.engine.sample.remote([list(map(int, p)) for p in prompts], [int(n) for n in max_new_tokens],
                                                 int(seed), self.temperature, self.eos_ids), timeout=self.timeout_s)
        return [Sample(ids, logprobs, ended) for ids, logprobs, ended in outs]


def call_in_engine(engine, fn, *args, timeout_s: float = 3600.0):
    """``fn(host, *args)`` run inside the engine's actor, where ``host`` is its
    ``EngineHost``, and its result: for measuring vLLM itself, without this sampler's call
    (bench/sampler.py). ``fn`` runs in vLLM's interpreter: it may import vLLM, not draco-gym,
    and returns plain types."""
    return ray.get(engine.__ray_call__.remote(fn, *args), timeout=timeout_s)


def stop_engine(engine, timeout_s: float = 60.0) -> None:
    """Shut the engine down, then end its actor: killed mid-engine, vLLM's shared memory
    would stay in /dev/shm."""
    try:
        ray.get(engine.shutdown.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - the actor may be gone already; it is killed below either way
        pass
    ray.kill(engine)
