"""The parts of ``sampler: vllm`` that need no vLLM: finding vLLM's environment and the
errors when there is none, the checks of a user's install, LoRA slots, adapter files, and the
engine's refusal to sample without an adapter (seconds; ``tests/test_vllm.py`` runs vLLM)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from draco_gym.algos.policy.vllm_runtime import SetupError, VLLMRuntime


def test_no_vllm_environment_says_how_to_build_one(tmp_path):
    with pytest.raises(SetupError, match="draco-gym setup vllm"):
        VLLMRuntime(tmp_path).engine_python()


def test_a_python_without_vllm_is_refused_and_not_recorded(tmp_path):
    runtime = VLLMRuntime(tmp_path)
    with pytest.raises(SetupError, match="cannot import vllm"):
        runtime.use_python(sys.executable)
    with pytest.raises(SetupError, match="there is none"):
        runtime.engine_python()


def test_a_recorded_python_that_is_gone_is_named(tmp_path):
    (tmp_path / "user-python.json").write_text('{"python": "/nonexistent/bin/python", "ray": "x"}')
    with pytest.raises(SetupError, match="/nonexistent/bin/python.*is gone"):
        VLLMRuntime(tmp_path).engine_python()


def test_a_build_with_another_ray_is_refused(tmp_path):
    import json

    runtime = VLLMRuntime(tmp_path)
    venv = runtime.venv_dir("cpu") / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (runtime.venv_dir("cpu") / ".draco-gym-ready").write_text(json.dumps({"ray": "0.0.1", "vllm": "0.32.0"}))
    with pytest.raises(SetupError, match="ray 0.0.1.*must match"):
        runtime.engine_python()


def test_setup_vllm_with_a_python_lacking_vllm_fails_with_the_reason(tmp_path):
    done = subprocess.run([sys.executable, "-m", "draco_gym.cli", "setup", "vllm", "--python", sys.executable,
                           "--vllm-home", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "setup failed" in done.stderr and "cannot import vllm" in done.stderr


def test_the_trainer_refuses_sampler_vllm_without_its_environment_in_the_driver(tmp_path, monkeypatch, tiny_model):
    pytest.importorskip("ray")
    from draco_gym.algos.config import ConfigError
    from draco_gym.algos.rllib.grpo import GRPOConfig

    monkeypatch.setenv("DRACO_GYM_VLLM_HOME", str(tmp_path))
    config = (GRPOConfig().environment("draco_gym/PythonTools-v0").policy(model=str(tiny_model), sampler="vllm"))
    with pytest.raises(ConfigError, match="policy.sampler: .*draco-gym setup vllm"):
        config.validate()


def test_lora_ranks_map_to_vllms_slots():
    from draco_gym.algos.rllib.vllm_sampler import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 8, 9, 16, 17, 64, 512)] == [8, 8, 16, 16, 32, 64, 512]
    with pytest.raises(ValueError, match="above"):
        lora_rank_slot(513)


def test_adapter_files_are_peft_s_and_a_folder_without_them_is_named(tmp_path):
    from draco_gym.algos.rllib.vllm_sampler import adapter_files

    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        adapter_files(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x")
    (tmp_path / "README.md").write_text("model card")
    assert set(adapter_files(tmp_path)) == {"adapter_config.json", "adapter_model.safetensors"}


def test_the_engine_never_samples_without_an_adapter():
    """A base-only request in a batch with adapter ones would get the adapter (vLLM CPU)."""
    from draco_gym.algos.policy.vllm_host import EngineHost

    host = EngineHost.__new__(EngineHost)  # no engine needed to reach the guard
    host._lora = None
    with pytest.raises(RuntimeError, match="no LoRA adapter loaded"):
        host.sample([[1, 2]], [4], 0, 1.0, [2])
