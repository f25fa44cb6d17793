"""``draco-gym setup vllm``: vLLM's own environment now (``policy.vllm_runtime``), or a
user's vLLM install recorded, so the first ``sampler: vllm`` run finds it."""

from __future__ import annotations

from draco_gym.algos.policy.vllm_runtime import BUILDS, HOME_ENV, SetupError, VLLMRuntime


def add_arguments(parser) -> None:
    """The options of `setup vllm` (``--force`` is the one `setup appworld` declares)."""
    parser.add_argument("--python", default=None, help="use this python's vLLM install (it needs this ray's version) "
                                                       "instead of building one")
    parser.add_argument("--build", choices=BUILDS, default=None, help="vLLM build (default: gpu where nvidia-smi "
                                                                     "lists a GPU, else cpu)")
    parser.add_argument("--vllm-home", default=None, help=f"where vLLM's environment goes (default: ${HOME_ENV} or "
                                                          "the user cache dir)")


def run(args) -> int:
    from draco_gym.envs.appworld.runtime import print_progress

    runtime = VLLMRuntime(args.vllm_home)
    try:
        if args.python:
            runtime.use_python(args.python, print_progress)
        else:
            runtime.ensure(print_progress, build=args.build, force=getattr(args, "force", False))
        python, record = runtime.engine_python()
    except SetupError as exc:
        print_progress(f"setup failed: {exc}")
        return 1
    print_progress(f"vllm: {python} (vllm {record['vllm']}, torch {record['torch']}, ray {record['ray']})")
    return 0
