"""Fixtures shared by the trainer and credit tests (Ray, the tiny local model)."""

import pytest

pytest_plugins = ["strict_imports"]  # DRACO_GYM_STRICT_IMPORTS=1: a skipped CI dependency fails


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random-init Llama with a byte-level BPE tokenizer trained here: no download."""
    from draco_gym.algos.policy.models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny"))
