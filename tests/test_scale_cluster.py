"""A Ray cluster of two nodes on 127.0.0.1: the run joins it and its env runners work on the
worker node, the one that offers the ``draco_rollout`` resource.

Both nodes are started with ``ray start --block`` in their own process group and stopped by
signalling that group; ``ray stop`` is not used, because it stops every Ray process on the
machine, other users' clusters included. A final sweep ends any process left with this
cluster's temp dir on its command line, and the test fails if there was one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from grpo_fixtures import ParityReward  # noqa: E402  (shipped to the actors by value there)

from draco_gym.algos.config import parse_config  # noqa: E402
from draco_gym.algos.rllib.grpo import GRPOConfig  # noqa: E402
from draco_gym.algos.rllib.session import start_ray  # noqa: E402

pytestmark = pytest.mark.slow

ROLLOUT = "draco_rollout"  # the custom resource only the worker node has


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    """``ray`` of this interpreter (a venv layered over another may not have the script)."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def _ours(temp_dir: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def two_node_cluster(monkeypatch):
    """A head (no rollout resource) and a worker node offering ``draco_rollout``; yields the
    head's address. Short temp dir: Ray's socket paths must fit in 107 characters."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    temp_dir = tempfile.mkdtemp(prefix="dgs", dir="/tmp")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory",
              str(80 * 2**20), "--disable-usage-stats"]
    nodes = []
    try:
        nodes.append(subprocess.Popen(
            [*_ray_cli(), "start", "--head", "--port", str(port), "--temp-dir", temp_dir, "--include-dashboard",
             "false", "--resources", '{"head_only": 1}', *common],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_nodes(address, 1, nodes)
        nodes.append(subprocess.Popen(
            [*_ray_cli(), "start", "--address", address, "--resources", f'{{"{ROLLOUT}": 1}}', *common],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_nodes(address, 2, nodes)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for node in reversed(nodes):
            _stop_group(node)
        leftovers = _ours(temp_dir)
        for proc in leftovers:
            proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftovers, f"processes of the test cluster outlived it: {[p.pid for p in leftovers]}"


def _wait_for_nodes(address: str, n: int, procs, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("`ray start` exited early")
        out = subprocess.run([*_ray_cli(), "status", "--address", address], check=False, capture_output=True, text=True,
                             env=dict(os.environ, RAY_AUTH_MODE="disabled"))
        if out.returncode == 0 and out.stdout.count("node_") >= n:
            return
        time.sleep(2)
    raise TimeoutError(f"the test cluster at {address} did not reach {n} nodes")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the node's process group (``ray start --block`` and the Ray processes it
    started), SIGKILL after a grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
    time.sleep(2)
    try:  # Ray processes that outlived their parent but kept its group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_config(model, **resources):
    return parse_config({
        "name": "cluster", "iterations": 1,
        "env": {"id": "draco_gym/Corridor-v0", "config": {"n_rooms": 2, "max_turns": 2}},
        "policy": {"model": str(model), "lora": {"r": 4, "alpha": 8}, "torch_threads": 1},
        "rollout": {"group_size": 2, "tasks_per_iteration": 2, "max_new_tokens": 8, "max_response_tokens": 80},
        "reward": {"name": "rule"}, "credit": {"name": "draco"},
        "resources": {"num_env_runners": 1, "num_cpus_per_env_runner": 0.5,
                      "custom_resources_per_env_runner": {ROLLOUT: 1}, **resources},
    })


def test_run_joins_a_cluster_and_samples_on_the_worker_node(two_node_cluster, tiny_model, monkeypatch):
    run = run_config(tiny_model, ray_address=two_node_cluster, object_store_memory_mb=100)
    start_ray(run.resources)
    try:
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2, "the run must join the two-node cluster, not start its own Ray"
        worker = next(i for i, n in nodes.items() if ROLLOUT in n["Resources"])
        driver = ray.get_runtime_context().get_node_id()
        assert driver != worker

        config = GRPOConfig.from_run_config(run).training(reward=ParityReward).debugging(seed=3)
        algo = config.build_algo()
        try:
            result = algo.train()
            used = algo.sampled_weights
        finally:
            algo.stop()
        assert result["env_runners"]["num_episodes"] == 4
        assert [u["node_id"] for u in used.values()] == [worker], "the env runner must sample on the worker node"
    finally:
        ray.shutdown()

    # RAY_ADDRESS joins the same cluster when the config names none.
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster)
    start_ray(run_config(tiny_model).resources)
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    finally:
        ray.shutdown()
