"""The ``draco-gym`` command.

Each subcommand lives with the layer it belongs to and is imported only when it runs, so
``draco-gym --help`` stays fast and a layer's heavy dependencies load only for its own
commands. A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Order is the order of --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("draco_gym.algos.cli.train", "train a policy with GRPO and step credit from a YAML config (RLlib + Tune)"),
    "sft": ("draco_gym.algos.cli.sft", "supervised LoRA warm start on the train tasks' reference solutions, before GRPO"),
    "eval": ("draco_gym.algos.cli.eval", "evaluate a checkpoint on the config's eval tasks: success, pass@k, pass^k"),
    "report": ("draco_gym.report", "write a run's HTML report: metrics, each group's rubric and verdicts, each rollout's cited steps and credit"),
    "demo": ("draco_gym.algos.cli.demo", "score a group of scripted PythonTools episodes with the rule rubric and print their step credit"),
    "bench": ("draco_gym.bench.credit_quality", "benchmarks: `bench credit` compares the credit rules on synthetic tasks"),
    "setup": ("draco_gym.setup_cli", "prepare now what a first run needs: `setup appworld` (the AppWorld engine and its offline task suite), `setup model` (the quickstart policy's weights), `setup vllm` (vLLM's own environment)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draco-gym", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in SUBCOMMANDS.items():
        sub.add_parser(name, help=summary, description=summary).set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Parse the command name first; the subcommand's own arguments are added once its
    # module is imported, so one command's dependencies never load for another.
    known, _ = parser.parse_known_args(argv[:1])
    if known.command is None:
        parser.print_help()
        return 2
    module_name, summary = SUBCOMMANDS[known.command]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"draco-gym {known.command}", description=summary)
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
