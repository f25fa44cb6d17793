"""``draco-gym setup TARGET``: prepare now what a first run would otherwise prepare on its way.

``appworld`` builds the AppWorld engine's isolated runtime and the offline task suite;
``model`` fetches the quickstart policy's weights (SmolLM2-135M-Instruct) into the cache and
converts them once; ``vllm`` builds vLLM's own environment (``sampler: vllm``). Each target lives with its layer; its module is imported by name, as
the CLI's subcommands are, so the core depends on no layer.
"""

from __future__ import annotations

import argparse
import importlib

TARGETS: dict[str, tuple[str, str]] = {
    "appworld": ("draco_gym.envs.appworld.setup_cli", "the AppWorld engine's runtime and its offline task suite"),
    "model": ("draco_gym.algos.cli.setup_model", "the SmolLM2-135M-Instruct weights of the quickstart policy"),
    "vllm": ("draco_gym.algos.cli.setup_vllm", "vLLM's own environment for `sampler: vllm` (CPU or GPU build, or --python)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=list(TARGETS),
                        help="; ".join(f"{name}: {summary}" for name, (_, summary) in TARGETS.items()))
    for name, (module, _) in TARGETS.items():
        importlib.import_module(module).add_arguments(parser.add_argument_group(f"setup {name}"))


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(TARGETS[args.target][0]).run(args)
