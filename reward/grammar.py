"""The answer grammar: each stage's JSON schema tightened where JSON Schema is loose, as
both grammar engines enforce it.

A small judge decoding under a schema still goes wrong where the schema leaves room: it
repeats a criterion, writes a title of one endless word, or keeps writing until
``max_tokens`` cuts its JSON open. ``grammar_schema`` closes those gaps (one verdict per
criterion in rubric order, bounded titles and lists), ``string_budget`` shares the token
budget among the answer's free-text strings, and ``grammar_ready`` turns both into the form
a server grammar takes (llama.cpp's ``json_object`` + ``schema``: string lengths as
``maxLength``, step numbers as enums). The in-process constrained judge (``local_judge``)
and the HTTP judge's llama.cpp rung (``judge_servers``) read the same rules from here, so
neither depends on the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from draco_gym.reward.answers import TITLE_WORDS


class DoesNotFit(ValueError):
    """A judge call cannot fit its token budgets; the message names the setting to raise."""


class AnswerTooLong(DoesNotFit):
    """``max_tokens`` cannot hold a complete answer of the stage's schema."""


OPEN_LIST_ITEMS = 4
"""The grammar's cap on a list the schema leaves open (grounding references, cited steps):
every item of every list takes its share of the answer's token budget."""


TITLE_WORD_CHARS = 24
"""The longest word the grammar lets a criterion title have."""

NONEMPTY_STAGES = ("propose", "merge")
"""Stages whose criteria list may not be empty (``answers.check_proposed``, ``check_merged``)."""


def grammar_schema(schema: dict, stage: str = "") -> dict:
    """The schema the grammar enforces: the stage's schema made tighter where JSON Schema is
    loose. No object takes keys the schema does not name. A verdict list that must cover every criterion once (an enum of titles, exactly
    that many items) becomes one item per title in rubric order, so no title is repeated or
    missed, and each PASS or FAIL cites a step; open lists get at most ``OPEN_LIST_ITEMS`` items (cited steps at most the step
    range). Criterion titles have ``TITLE_WORDS`` words, and propose and merge name at least
    one criterion. The answer checks keep the stage's own rules."""
    schema = json.loads(json.dumps(schema))
    criteria = schema.get("properties", {}).get("criteria")
    if isinstance(criteria, dict) and isinstance(criteria.get("items"), dict):
        low, high = TITLE_WORDS
        title = criteria["items"].get("properties", {}).get("title")
        if isinstance(title, dict) and "enum" not in title:
            # Words of bounded length: an unbounded word lets a small model write one "word"
            # until max_tokens cuts the answer mid-string (seen: a propose answer cut at its title).
            title["pattern"] = rf"^[^\s]{{1,{TITLE_WORD_CHARS}}}( [^\s]{{1,{TITLE_WORD_CHARS}}}){{{low - 1},{high - 1}}}$"
        if stage in NONEMPTY_STAGES:
            criteria["minItems"] = max(criteria.get("minItems", 0), 1)

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if node.get("type") == "object":
            node.setdefault("additionalProperties", False)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            item = node["items"]
            titles = item.get("properties", {}).get("criterion", {}).get("enum")
            if titles and node.get("minItems") == node.get("maxItems") == len(titles):
                node["prefixItems"] = [
                    _cited({**item, "properties": {**item["properties"], "criterion": {"const": t}}}) for t in titles]
                node["items"] = False
            elif "maxItems" not in node:
                cap = min(int(item["maximum"]), OPEN_LIST_ITEMS) if "maximum" in item else OPEN_LIST_ITEMS
                node["maxItems"] = max(node.get("minItems", 0), cap)
        for value in node.values():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, list):
                for v in value:
                    walk(v)

    walk(schema)
    return schema


def _cited(item: dict) -> dict:
    """A verdict item whose PASS or FAIL cites at least one step and whose NOT_APPLICABLE
    cites none (``answers._citation_errors``): two alternatives of the same item."""
    props = item.get("properties", {})
    verdict, steps = props.get("verdict"), props.get("steps")
    if not (isinstance(verdict, dict) and isinstance(steps, dict) and "NOT_APPLICABLE" in verdict.get("enum", [])):
        return item
    judged = {**item, "properties": {**props, "verdict": {"enum": ["PASS", "FAIL"]},
                                     "steps": {**steps, "minItems": 1}}}
    inapplicable = {**item, "properties": {**props, "verdict": {"const": "NOT_APPLICABLE"},
                                           "steps": {**steps, "maxItems": 0}}}
    return {"anyOf": [judged, inapplicable]}


def string_budget(schema: dict, max_tokens: int, count_tokens: Callable[[str], int]) -> int:
    """The tokens one free-text string may take so that a complete answer under the grammar
    schema fits ``max_tokens``: the answer's skeleton (keys, enums, numbers, punctuation,
    every list at its longest) is measured with the judge's tokenizer, and the rest is
    shared among its strings. A model that rambles inside a string would otherwise run out
    of tokens mid-answer and leave unparseable JSON."""
    slots = 0

    def example(node: Any) -> Any:
        nonlocal slots
        if not isinstance(node, dict):
            return None
        if "const" in node:
            return node["const"]
        if "enum" in node:
            return max(node["enum"], key=lambda v: len(json.dumps(v)))
        if "anyOf" in node:
            return example(node["anyOf"][0])
        kind = node.get("type")
        if kind == "object":
            return {k: example(v) for k, v in node.get("properties", {}).items()}
        if kind == "array":
            if "prefixItems" in node:
                return [example(v) for v in node["prefixItems"]]
            return [example(node.get("items")) for _ in range(node.get("maxItems", 1))]
        if kind == "string":
            slots += 1
            return ""
        return node.get("maximum", 10)

    skeleton = count_tokens(json.dumps(example(schema), ensure_ascii=False, separators=(", ", ": ")))
    room = int(0.95 * max_tokens) - skeleton - 2
    if room < 4 * slots:
        raise AnswerTooLong(f"max_tokens={max_tokens} cannot hold a complete answer of this stage: its keys, titles "
                            f"and step lists alone take about {skeleton} tokens and it has {slots} texts to write; "
                            f"raise the reward's max_tokens to at least {int((skeleton + 24 * slots) / 0.95)}")
    return room // max(slots, 1)


_TITLE_WORD = rf"[A-Za-z0-9][A-Za-z0-9,'/()&:-]{{0,{TITLE_WORD_CHARS - 1}}}"
"""A word of a criterion title: a letter or digit first, at most ``TITLE_WORD_CHARS``, no period
(SmolLM2 wrote "but..." to end a title copied from the prompt's "..." placeholder)."""
# ~3 characters a token: fewer characters per token than English prose takes, so strings
# sized by it fit the token budget
_CHARS_PER_TOKEN = 3


def grammar_ready(schema: dict, stage: str, max_tokens: int) -> dict:
    """The stage's schema as llama.cpp's grammar should enforce it (its ``json_object`` +
    ``schema`` form): ``grammar_schema``'s tightening (one verdict per criterion in rubric order, each PASS
    or FAIL citing a step, no unnamed keys, open lists capped), a criterion title of
    ``TITLE_WORDS`` words that start with a letter or digit (so a small model cannot copy
    the prompt's "..." placeholder as a title), and every string short enough that a whole
    answer fits ``max_tokens`` (60 to 300 characters each, and fewer criteria in an open
    list when 60 would not fit: ``_fit_answer``). The title pattern names its characters (no quote, no
    backslash, no control character): llama.cpp turns a pattern into grammar verbatim, so a
    negated class would let a raw quote end the JSON string early."""
    tight = grammar_schema(schema, stage)
    title = tight.get("properties", {}).get("criteria", {}).get("items", {}).get("properties", {}).get("title")
    if isinstance(title, dict) and "pattern" in title:
        low, high = TITLE_WORDS
        title["pattern"] = rf"^{_TITLE_WORD}( {_TITLE_WORD}){{{low - 1},{high - 1}}}$"
    chars = _fit_answer(tight, max_tokens)  # first: it may shorten the criteria list in place
    return _bounded_strings(_enumerated_steps(tight), chars)


def _enumerated_steps(schema: Any) -> Any:
    """Bounded integers (a rollout's step numbers) as an enum: llama-cpp-python's grammar
    converter ignores ``minimum`` and ``maximum`` (a live attribute answer cited step 4 of a
    2-step rollout), every converter honours an enum."""
    if isinstance(schema, list):
        return [_enumerated_steps(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _enumerated_steps(v) for k, v in schema.items()}
    low, high = out.get("minimum"), out.get("maximum")
    if out.get("type") == "integer" and isinstance(low, int) and isinstance(high, int) and 0 <= high - low < 1000:
        out = {"enum": list(range(low, high + 1))}
    return out


_MIN_STRING_CHARS = 60
"""Below this a criterion's title or a piece of evidence no longer fits."""


def _fit_answer(schema: dict, max_tokens: int) -> int:
    """The character cap of every string such that the longest answer the grammar allows
    fits ``max_tokens``; when even strings of ``_MIN_STRING_CHARS`` would not fit, the
    open list of criteria (propose, augment, merge) is shortened first, in place. A small
    model under a grammar keeps adding criteria until it is stopped: a merge answer cut by
    max_tokens is unterminated JSON."""

    def budget() -> int:
        try:
            return string_budget(schema, max_tokens, lambda text: len(text) // _CHARS_PER_TOKEN + 1) * _CHARS_PER_TOKEN
        except DoesNotFit:
            return 0

    criteria = schema.get("properties", {}).get("criteria")
    chars = budget()
    while chars < _MIN_STRING_CHARS and isinstance(criteria, dict) and criteria.get("maxItems", 0) > 1:
        criteria["maxItems"] -= 1
        chars = budget()
    return max(_MIN_STRING_CHARS, min(300, chars))


def _bounded_strings(schema: Any, max_chars: int = 300) -> Any:
    """The schema with every string capped (``maxLength``, which llama.cpp's grammar
    enforces): a small model that rambles inside a string would otherwise run into
    max_tokens and leave its JSON unterminated."""
    if isinstance(schema, dict):
        out = {k: _bounded_strings(v, max_chars) for k, v in schema.items()}
        if out.get("type") == "string" and "enum" not in out:
            out.setdefault("maxLength", max_chars)
        return out
    if isinstance(schema, list):
        return [_bounded_strings(v, max_chars) for v in schema]
    return schema
