"""The rule rubric against the cheapest ways to look busy, through the real environments: on
every shipped task family with reference solutions, the reference must outrank a no-op, a
print-only and a comment-only attempt (the reference commented out, then a wrong answer
submitted) on at least 95% of tasks, the four scored as one group, dropout included (the
attempts and episodes: ``rubric_hacks.py``).

And against near-misses (``bench/evaluator_mutations.py``'s, played there: a right lookup
then a wrong submit, a wrong id then ``submit(0)``, ``list_products()`` then ``submit(0)``,
every product looked up then ``submit(0)``, a wrong unit count, a neighbouring task's answer,
a wrong door, a τ² write left out or made twice): under every judge-free reward a shipped
config trains on (``rule``, ``outcome``, ``weighted`` of them), the reference outranks every
near-miss of its task on at least 95% of tasks, each task's reference and near-misses scored
as one group. The default pass plays a few tasks per family; the slow pass plays them all.

AppWorld's near-misses (``bench/appworld_mutations.py``'s: untag instead of delete, a request
instead of a payment, one record more or fewer, a record the task never named changed, the
neighbouring task's solution, completing without acting, a wrong answer) are played through
``draco_gym/AppWorld-v0`` in bwrap and held to the same bar: the default pass plays the first
task of its ``FAST_FAMILIES`` (~30 s on a loaded 2-core CPU: the engine's start is ~20 s, an
episode then under a second), the slow pass every task of every family.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401 - registers the ids
from rubric_hacks import RANKED_SHARE, sweep
from sandbox_marks import needs_bwrap


def check(misses: list[str], rewards: dict[str, list[float]]) -> None:
    ranked = 1 - len(misses) / len(rewards)
    detail = {t: rewards[t] for t in misses}
    assert ranked >= RANKED_SHARE, (f"the reference outranks [no-op, print-only, comment-only] on {ranked:.0%} of "
                                    f"{len(rewards)} tasks; rewards [reference, no-op, print, comment]: {detail}")


@pytest.mark.slow
def test_shop_purchase_tier_reference_outranks_cheap_attempts():
    """The quickstart's env: the shop's purchase tier, ending at submit()."""
    env = gym.make("draco_gym/PythonTools-v0", tools=["draco_gym.envs.shop:get_product",
                                                      "draco_gym.envs.shop:list_products"],
                   tasks="draco_gym.envs.shop:purchase_tasks", end_rule="task_completed", max_turns=2)
    try:
        misses, rewards = sweep(env, env.unwrapped.task_ids, "submit(0)", [])
    finally:
        env.close()
    assert len(rewards) == 40
    check(misses, rewards)


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_appworld_offline_suite_reference_outranks_cheap_attempts(split):
    """Every task of the offline suite, under DRACO's no_code end rule."""
    from draco_gym.envs.appworld import ensure_offline_suite
    from draco_gym.envs.appworld.env import CLOSING_MESSAGE
    from draco_gym.envs.appworld.runtime import AppWorldRuntime

    source = ensure_offline_suite(AppWorldRuntime())
    env = gym.make("draco_gym/AppWorld-v0", split=split, data_root=source.data_dir, end_rule="no_code",
                   max_turns=12, show_progress=False)
    try:
        misses, rewards = sweep(env, env.unwrapped.task_ids, "apis.supervisor.complete_task(answer=0)",
                                [CLOSING_MESSAGE])
    finally:
        env.close()
    assert len(rewards) == {"train": 24, "dev": 12, "test": 12}[split]
    check(misses, rewards)


# -- the near-misses of bench/evaluator_mutations.py, under every shipped judge-free reward -----

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import appworld_mutations as am  # noqa: E402
import evaluator_mutations as em  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
JUDGE_FREE = {"rule", "outcome"}
"""The rewards that read only what ran; ``weighted`` sums of them are judge-free too. Judged
rewards need a judge server (their ranking is the judge's, bench/judge_quality.py), the
random control ranks nothing on purpose, Corridor's reward is a simulated judge."""
ISSUE_ATTEMPTS = ("the right lookup, then submit(0)", "a wrong id, then submit(0)", "list_products(), then submit(0)",
                  "every product looked up, then submit(0)")
"""Issue 36's wrong-answer attempts on the purchase tier, which each earned the reference's
rule reward on 40/40 tasks (the right lookup then a wrong submit also as "the unit price only",
"one unit more" and the others)."""
ISSUE_APPWORLD_ATTEMPTS = ("a wrong note deleted instead of a tagged one", "untagged instead of deleted")
"""Issue 36's AppWorld attempts on delete-tagged-notes: the wrong note deleted (at or above the
reference under ``rule`` alone), the tag removed instead of the notes deleted (passed the suite)."""
FEW = 1
"""Tasks per family in the default pass."""

SUITES = dict(zip(["shop/purchase", "shop/tiers", "shop/order-item", "corridor/treasure", "corridor/locks", "tau2/mock"],
                  em.suites(("shop", "corridor", "tau2"), ("mock",)), strict=True))
"""Every shipped family with references but AppWorld's (``appworld_played``)."""


def judge_free(name: object, options: dict) -> bool:
    if name == "weighted":
        return all(judge_free(p.get("name"), p.get("options") or {}) for p in options.get("parts", []))
    return name in JUDGE_FREE


def shipped_rewards() -> dict[str, tuple[str, dict]]:
    """label (the configs that ship it) -> (reward name, options): every distinct judge-free
    reward of configs/*.yaml."""
    from draco_gym.algos.config import load_config

    found: dict[str, tuple[str, dict]] = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        reward = load_config(path).reward
        spec = (reward.name, dict(reward.options))
        if judge_free(*spec):
            label = next((k for k, v in found.items() if v == spec), None)
            found.pop(label, None)
            found[f"{label}, {path.stem}" if label else f"{path.stem}: {reward.name}"] = spec
    return found


def test_the_sweep_covers_the_shipped_rewards_and_the_issue_attempts():
    """The configs still ship rule alone, outcome alone and their weighted sum, and the
    purchase tier's near-misses still hold the issue's wrong-answer attempts."""
    names = sorted(name for name, _ in shipped_rewards().values())
    assert names == ["outcome", "rule", "weighted"], names
    case = next(em.purchase_cases())
    assert set(ISSUE_ATTEMPTS) <= set(case.near_misses) - case.equivalent


_PLAYED: dict[tuple[str, bool], list] = {}


def played(suite: str, every: bool) -> list:
    """The suite's cases (all, or the first ``FEW`` of each family) played through its
    environment, once per test session."""
    if (suite, every) not in _PLAYED:
        built = SUITES[suite]
        env = built.make("auto")
        try:
            taken: dict[str, int] = {}
            out = []
            for case in built.cases(env.unwrapped):
                taken[case.family] = taken.get(case.family, 0) + 1
                if every or taken[case.family] <= FEW:
                    out.append(em.play_case(env, case, built.state))
            _PLAYED[(suite, every)] = out
        finally:
            env.close()
    return _PLAYED[(suite, every)]


def appworld_played(families: tuple[str, ...] | None, every: bool = False) -> list:
    """The tasks of ``families`` (every family: None) of the offline AppWorld suite, the first
    of each family or ``every`` one, each task's reference and near-misses played through
    ``draco_gym/AppWorld-v0`` in bwrap, once per test session."""
    key = ("appworld", families, every)
    if key not in _PLAYED:
        source = am.offline_source()
        chosen: dict[str, am.Case] = {}
        for case in am.cases(source, list(families) if families else None):
            chosen.setdefault(case.task_id if every else case.family, case)
        env = am.make_env(source)
        try:
            _PLAYED[key] = [
                em.play_case(env, em.Case(c.family, c.task_id, am.messages(c.reference),
                                          {name: am.messages(blocks) for name, blocks in c.near_misses.items()}))
                for c in chosen.values()]
        finally:
            env.close()
    return _PLAYED[key]


def unranked(cases: list, name: str, options: dict) -> dict[str, dict[str, float]]:
    """task -> the near-misses the reward ranks at or above the reference, with their reward
    less the reference's (each task's reference and near-misses scored as one group)."""
    from draco_gym.reward import build_reward

    reward = build_reward(name, **options)
    out = {}
    for case in cases:
        assert case.reference is not None, f"{case.case.task_id}: the reference fails its own check"
        rewards = reward.score_group(case.reference.task, [case.reference, *case.near_misses.values()]).rewards
        beaten = {n: round(r - rewards[0], 3) for n, r in zip(case.near_misses, rewards[1:]) if r >= rewards[0]}
        if beaten:
            out[case.case.task_id] = beaten
    return out


def sweep_near_misses(suite: str, cases: list) -> None:
    assert cases and sum(len(c.near_misses) for c in cases) >= len(cases)
    failures = {}
    for label, (name, options) in shipped_rewards().items():
        misses = unranked(cases, name, options)
        if 1 - len(misses) / len(cases) < RANKED_SHARE:
            failures[label] = {t: dict(list(m.items())[:4]) for t, m in list(misses.items())[:4]}
    assert not failures, (f"{suite}: the reference does not outrank every near-miss on >= {RANKED_SHARE:.0%} of "
                          f"{len(cases)} tasks under {sorted(failures)}; near-miss reward - reference's: {failures}")


@pytest.mark.parametrize("suite", list(SUITES))
def test_reference_outranks_every_near_miss_on_a_few_tasks(suite):
    """The first tasks of each family, under every shipped judge-free reward."""
    sweep_near_misses(suite, played(suite, every=False))


@pytest.mark.slow
@pytest.mark.parametrize("suite", list(SUITES))
def test_reference_outranks_every_near_miss_on_every_task(suite):
    """Every task of every family, under every shipped judge-free reward."""
    sweep_near_misses(suite, played(suite, every=True))


@needs_bwrap
def test_appworld_reference_outranks_every_near_miss_on_the_fast_families():
    """The first task of an action on notes, of one that moves money, and of a question,
    under every shipped judge-free reward."""
    cases = appworld_played(am.FAST_FAMILIES)
    assert [c.case.family for c in cases] == sorted(am.FAST_FAMILIES)
    assert set(ISSUE_APPWORLD_ATTEMPTS) <= set(cases[0].near_misses), cases[0].near_misses.keys()
    sweep_near_misses("appworld", cases)


@pytest.mark.slow
@needs_bwrap
def test_appworld_reference_outranks_every_near_miss_on_every_task():
    """Every task of every family of the offline suite, under every shipped judge-free
    reward."""
    cases = appworld_played(None, every=True)
    assert len({c.case.family for c in cases}) == 16 and len(cases) == len(am.task_ids(am.offline_source()))
    sweep_near_misses("appworld", cases)
