"""A small, deterministic online shop: the built-in tools and tasks of PythonTools-v0.

Its tasks need what long-horizon tool use needs in miniature: looking things up by name,
following ids across calls, paging through lists, and computing from what was fetched.
All data comes from a fixed seed, so answers are known exactly.
"""

from __future__ import annotations

import random
from functools import lru_cache

PAGE_SIZE = 5
CATEGORIES = ("books", "garden", "kitchen", "toys")
_NOUNS = {
    "books": ["atlas", "novel", "cookbook", "almanac", "poetry set", "field guide", "biography", "comic", "dictionary", "travelogue"],
    "garden": ["trowel", "hose", "rake", "planter", "seed kit", "pruner", "watering can", "bird feeder", "lantern", "gloves"],
    "kitchen": ["kettle", "skillet", "whisk", "teapot", "grater", "colander", "ladle", "mixing bowl", "knife block", "scale"],
    "toys": ["kite", "puzzle", "yo-yo", "robot", "train set", "marble run", "drum", "puppet", "glider", "blocks"],
}
_ADJECTIVES = ["blue", "classic", "compact", "deluxe", "golden", "mini", "rustic", "smart"]
_CUSTOMERS = ["Ada Park", "Bruno Silva", "Chen Wei", "Dana Cruz", "Emeka Obi", "Fatima Noor", "Gus Berg", "Hana Sato"]


@lru_cache(maxsize=1)
def _world() -> dict:
    rng = random.Random(20261129)
    products = []
    for category in CATEGORIES:
        for noun in _NOUNS[category]:
            products.append({
                "id": f"P{len(products) + 101}",
                "name": f"{rng.choice(_ADJECTIVES)} {noun}",
                "category": category,
                "price": round(rng.uniform(3, 120), 2),
            })
    customers, orders = [], []
    for i, name in enumerate(_CUSTOMERS):
        cid = f"C{i + 1:02d}"
        first, last = name.lower().split()
        customers.append({"id": cid, "name": name, "email": f"{first}.{last}@example.com"})
        for _ in range(rng.randint(3, 12)):
            items = [{"product_id": p["id"], "quantity": rng.randint(1, 4)} for p in rng.sample(products, rng.randint(1, 4))]
            orders.append({
                "id": f"O{len(orders) + 1001}",
                "customer_id": cid,
                "date": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                "items": items,
            })
    return {"products": products, "customers": customers, "orders": orders}


def _page(items: list, page: int) -> dict:
    if not isinstance(page, int) or page < 1:
        raise ValueError(f"page must be an integer >= 1, got {page!r}")
    pages = max(1, -(-len(items) // PAGE_SIZE))
    start = (page - 1) * PAGE_SIZE
    return {"page": page, "pages": pages, "items": items[start:start + PAGE_SIZE]}


def list_products(category: str | None = None, page: int = 1) -> dict:
    """List products (5 per page), optionally of one category: books, garden, kitchen, toys.
    Returns {"page", "pages", "items": [{"id", "name", "category", "price"}]}."""
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; categories are {list(CATEGORIES)}")
    items = [dict(p) for p in _world()["products"] if category in (None, p["category"])]
    return _page(items, page)


def get_product(product_id: str) -> dict:
    """Look up one product by id, e.g. "P101". Returns {"id", "name", "category", "price"}."""
    for p in _world()["products"]:
        if p["id"] == product_id:
            return dict(p)
    raise LookupError(f"no product with id {product_id!r}")


def find_customer(name: str) -> dict:
    """Look up a customer by full name. Returns {"id", "name", "email"}."""
    for c in _world()["customers"]:
        if c["name"].lower() == str(name).strip().lower():
            return dict(c)
    raise LookupError(f"no customer named {name!r}")


def list_orders(customer_id: str, page: int = 1) -> dict:
    """List a customer's orders (5 per page), by customer id, e.g. "C01".
    Returns {"page", "pages", "items": [{"id", "date", "items": [{"product_id", "quantity"}]}]}."""
    if not any(c["id"] == customer_id for c in _world()["customers"]):
        raise LookupError(f"no customer with id {customer_id!r}")
    items = [{k: v for k, v in o.items() if k != "customer_id"} for o in _world()["orders"] if o["customer_id"] == customer_id]
    return _page(items, page)


def get_order(order_id: str) -> dict:
    """Look up one order by id, e.g. "O1001". Returns {"id", "customer_id", "date", "items"}."""
    for o in _world()["orders"]:
        if o["id"] == order_id:
            return {**o, "items": [dict(i) for i in o["items"]]}
    raise LookupError(f"no order with id {order_id!r}")


TOOLS = [list_products, get_product, find_customer, list_orders, get_order]


def _order_total(order: dict) -> float:
    prices = {p["id"]: p["price"] for p in _world()["products"]}
    return round(sum(prices[i["product_id"]] * i["quantity"] for i in order["items"]), 2)


def _operators(*reads: str) -> dict:
    """The task's operator library for the rule rubric: the lookups its answer needs
    (evidence; a tool name, or a call with the arguments that find the task's own
    record, ``get_product(product_id='P109')``) and ``submit`` (execution)."""
    return {"operators": {"evidence": list(reads), "execution": ["submit"]}}


def tasks() -> list[dict]:
    """24 tasks in four families, each answer computed from the world."""
    world = _world()
    rng = random.Random(7)
    out = []
    for n, order in enumerate(rng.sample(world["orders"], 6), start=1):
        out.append({"id": f"order-total-{n}", "answer": _order_total(order),
                    "metadata": _operators("get_order", "get_product"),
                    "instruction": f"What is the total cost of order {order['id']}? An item costs its product's "
                                   "price times its quantity. Submit the number rounded to 2 decimals."})
    for n, customer in enumerate(rng.sample(world["customers"], 6), start=1):
        count = sum(o["customer_id"] == customer["id"] for o in world["orders"])
        out.append({"id": f"order-count-{n}", "answer": count, "metadata": _operators("find_customer", "list_orders"),
                    "instruction": f"How many orders has {customer['name']} placed? Submit the number."})
    for n, category in enumerate(CATEGORIES + CATEGORIES[:2], start=1):
        products = [p for p in world["products"] if p["category"] == category]
        pick = min if n <= 4 else max
        best = pick(products, key=lambda p: p["price"])
        word = "cheapest" if pick is min else "most expensive"
        out.append({"id": f"{'cheapest' if pick is min else 'priciest'}-{category}", "answer": best["name"],
                    "metadata": _operators("list_products"),
                    "instruction": f"What is the name of the {word} product in the {category} category? Submit the name."})
    for n, customer in enumerate(rng.sample(world["customers"], 6), start=1):
        spent = round(sum(_order_total(o) for o in world["orders"] if o["customer_id"] == customer["id"]), 2)
        out.append({"id": f"customer-spend-{n}", "answer": spent,
                    "metadata": _operators("find_customer", "list_orders", "get_product"),
                    "instruction": f"How much has {customer['name']} spent across all of their orders? "
                                   "Submit the number rounded to 2 decimals."})
    return out


def purchase_tasks() -> list[dict]:
    """The shop's easier tier: 40 one-lookup tasks, "what do N units of product P cost?",
    one per product, with a reference solution (the code blocks that solve it). Solving one
    means calling the right tool with the id from the instruction and computing from its
    result: the habit every harder task builds on. Ids ``purchase-1`` .. ``purchase-40``;
    ``purchase_split`` divides them into train and held-out tasks."""
    rng = random.Random(11)
    out = []
    for n, product in enumerate(_world()["products"], start=1):
        quantity = rng.randint(2, 5)
        out.append({
            "id": f"purchase-{n}",
            "answer": round(product["price"] * quantity, 2),
            "instruction": f"How much do {quantity} units of product {product['id']} cost? "
                           "Submit the number rounded to 2 decimals.",
            "metadata": {**_operators(f"get_product(product_id={product['id']!r})"),
                         "reference": [f"product = get_product(\"{product['id']}\")\n"
                                       f"submit(round(product[\"price\"] * {quantity}, 2))"]},
        })
    return out


ORDINALS = ("first", "second", "third", "fourth", "fifth")


def order_item_tasks() -> list[dict]:
    """The shop's multi-step tier: 40 tasks of four dependent lookups, "what does the first
    item of the k-th order that customer C placed cost in all?". Solving one means finding
    the customer by name, listing their orders with the id that returned, taking the k-th,
    looking up its first item's product with the id in it, then computing price times
    quantity and submitting it: each call needs what the one before returned.

    Five tasks per customer (the first five orders ``list_orders`` gives, page 1), ids
    ``order-item-1`` .. ``order-item-40`` (customer by customer); ``order_item_split`` holds
    out every second customer. The reference solution is four turns, one lookup each and the
    submission last, so a rubric can cite the step a rollout went wrong at; each task
    declares the calls it needs with their arguments (``metadata["operators"]``) for the
    rule rubric."""
    world = _world()
    out = []
    for customer in world["customers"]:
        orders = [o for o in world["orders"] if o["customer_id"] == customer["id"]][:PAGE_SIZE]
        for k, order in enumerate(orders):
            item = order["items"][0]
            price = next(p["price"] for p in world["products"] if p["id"] == item["product_id"])
            out.append({
                "id": f"order-item-{len(out) + 1}",
                "answer": round(price * item["quantity"], 2),
                "instruction": f"{customer['name']} has placed orders with the shop. Take the {ORDINALS[k]} order "
                               "that list_orders gives for them and the first item in it: what does that item "
                               "cost in all (the product's price times the quantity)? Submit the number rounded "
                               "to 2 decimals.",
                "metadata": {
                    "customer_id": customer["id"], "order_id": order["id"],
                    **_operators(f"find_customer(name={customer['name']!r})",
                                 f"list_orders(customer_id={customer['id']!r})",
                                 f"get_product(product_id={item['product_id']!r})"),
                    "reference": [f"customer = find_customer(\"{customer['name']}\")\nprint(customer[\"id\"])",
                                  f"order = list_orders(customer[\"id\"])[\"items\"][{k}]\nprint(order[\"items\"][0])",
                                  "item = order[\"items\"][0]\nproduct = get_product(item[\"product_id\"])\n"
                                  "print(product[\"price\"])",
                                  "submit(round(product[\"price\"] * item[\"quantity\"], 2))"],
                },
            })
    return out


def order_item_split() -> dict[str, list[str]]:
    """``order_item_tasks``' ids by split: every second customer's five tasks are held out
    (``test``), so the splits share no customer and no order (the products in the orders are
    the one catalogue's and recur across customers)."""
    tasks = order_item_tasks()
    customers = list(dict.fromkeys(t["metadata"]["customer_id"] for t in tasks))
    held_out = set(customers[1::2])
    return {"train": [t["id"] for t in tasks if t["metadata"]["customer_id"] not in held_out],
            "test": [t["id"] for t in tasks if t["metadata"]["customer_id"] in held_out]}


def purchase_split() -> dict[str, list[str]]:
    """``purchase_tasks``' ids by split: every second product is held out (``test``), so the
    two splits cover the same categories and price range but share no product or answer."""
    ids = [t["id"] for t in purchase_tasks()]
    return {"train": ids[0::2], "test": ids[1::2]}
