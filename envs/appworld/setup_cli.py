"""``draco-gym setup appworld``: create the isolated runtime (and the offline suite) now.

Everything here also happens on first use; running it explicitly moves the wait (about a
minute for the runtime, half a minute for the suite) out of the first training run, and
says clearly what failed, e.g. when the package index cannot be reached.
"""

from __future__ import annotations

import argparse

from draco_gym.envs.appworld.runtime import HOME_ENV, AppWorldRuntime, SetupError, print_progress


def add_arguments(parser) -> None:
    """The options of `setup appworld`, on a parser or an argument group."""
    parser.add_argument("--home", default=None, help=f"runtime location (default: ${HOME_ENV} or the user cache dir)")
    parser.add_argument("--force", action="store_true", help="recreate the runtime even if it is complete")
    parser.add_argument("--no-suite", action="store_true", help="skip building the offline task suite")
    parser.add_argument("--suite-seed", type=int, default=0, help="seed of the offline task suite (default 0)")


def run(args: argparse.Namespace) -> int:
    from draco_gym.envs.appworld.suite import ensure_offline_suite

    runtime = AppWorldRuntime(args.home)
    try:
        runtime.ensure(print_progress, force=args.force)
        print_progress(f"runtime: {runtime.python}")
        if not args.no_suite:
            source = ensure_offline_suite(runtime, seed=args.suite_seed, progress=print_progress)
            sizes = {split: len(source.task_ids(split)) for split in source.splits}
            print_progress(f"offline suite: {source.data_dir} {sizes}")
    except SetupError as exc:
        print_progress(f"setup failed: {exc}")
        return 1
    return 0
