"""The Ray session a run works in: the cluster a config names, or a local one started here.

``start_ray`` is what ``draco-gym train`` and ``draco-gym eval`` call before any actor
exists; ``ray_session`` wraps it for a block (benchmarks, scripts), shutting Ray down after.
``ship_by_value`` lets actors unpickle classes defined in a script or test module that is
not importable on the workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import ray

from draco_gym.algos.config import ResourcesSection
from draco_gym.algos.memory import allocator_env

# Workers stay quiet (their errors still reach Tune's trial error) and tokenizers do not
# fork-warn in every actor.
_WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               "TOKENIZERS_PARALLELISM": "false"}


class RaySessionOpen(RuntimeError):
    """The calling process already runs Ray, and a command would start a session of its own."""


def require_no_ray_session(command: str) -> None:
    """Raise ``RaySessionOpen`` when this process already runs Ray (``ray.init`` was called):
    ``command`` starts Ray with its own resources and shuts it down when it ends, which would
    take the caller's session with it; Ray itself only says "called ray.init twice"."""
    if ray.is_initialized():
        raise RaySessionOpen(f"{command} starts a Ray session of its own and shuts it down at the end, but this "
                             "process already runs Ray (ray.init was called before): call ray.shutdown() first, "
                             f"run {command} in a process of its own (python -m draco_gym.cli ...), or drive "
                             "GRPOConfig(...).build_algo() inside your session")


def start_ray(resources: ResourcesSection) -> bool:
    """Ray for this run, with GRPO registered for Tune: the cluster at ``ray_address``
    (else ``$RAY_ADDRESS``) when one is given, otherwise a local one this process starts,
    sized by ``ray_num_cpus`` and ``object_store_memory_mb``, its workers started on
    ``resources.allocator`` (Ray's own processes keep the C library's; a cluster's nodes keep
    what they were started with). Returns whether this process started it (a local Ray, whose
    CPUs are all the run's). Raises ``RaySessionOpen`` when this process already runs Ray."""
    from draco_gym.algos.rllib.grpo import register_with_tune

    require_no_ray_session("this command")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 otherwise asks for a token
    runtime_env = {"env_vars": dict(_WORKER_ENV)}
    address = resources.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        if resources.ray_num_cpus is not None:
            print(f"note: resources.ray_num_cpus is ignored: joining the Ray cluster at {address}", flush=True)
        print(f"joining the Ray cluster at {address} ...", flush=True)
        ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
    else:
        runtime_env["env_vars"].update(allocator_env(resources.allocator))
        ray.init(num_cpus=resources.ray_num_cpus, object_store_memory=resources.object_store_memory_mb * 2**20,
                 include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
    register_with_tune()
    return not address


def stop_ray() -> None:
    ray.shutdown()


@contextmanager
def ray_session(resources: ResourcesSection | None = None) -> Iterator[None]:
    """``start_ray`` for the block, ``ray.shutdown`` after it, whatever happens inside."""
    start_ray(resources or ResourcesSection())
    try:
        yield
    finally:
        ray.shutdown()


def ship_by_value(module: ModuleType) -> None:
    """Actors get ``module``'s classes and functions pickled by value, not by import path."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(module)
