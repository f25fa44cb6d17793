"""What the judge must answer at each stage, and the checks an answer must pass.

Each stage has a pydantic model (the shape) and a check function (the rules the shape
cannot express: limits, titles that match the rubric, step numbers inside the trajectory,
every PASS or FAIL citing a step). Both produce plain error strings, because they are sent
back to the judge in a repair request: the judge sees exactly what was wrong.

The JSON schema sent to the server is built per call from the same models, with the
rubric's titles as an enum and the trajectory's step range as bounds, so a server that
enforces schemas (vLLM guided decoding, OpenAI structured output) cannot produce the most
common mistakes in the first place; the checks still run on every answer.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draco_gym.types import Criterion, Verdict

STAGES = ("propose", "augment", "merge", "score", "attribute", "score_attribute")

TITLE_WORDS = (3, 8)
"""A criterion title has 3 to 8 words (DRACO's propose rule)."""

VERDICT_SCORES = {"PASS": 1, "FAIL": -1, "NOT_APPLICABLE": 0}


class InvalidAnswer(ValueError):
    """The judge's answer cannot be used; ``errors`` are sent back to it for repair."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DraftCriterion(_Answer):
    title: str = Field(min_length=1)
    description: str = Field(min_length=1)
    evaluator_instruction: str = Field(min_length=1)
    grounding_references: list[str] = Field(default_factory=list)


class ProposeAnswer(_Answer):
    criteria: list[DraftCriterion]


class AugmentedCriterion(DraftCriterion):
    trajectory_evidence: str = Field(min_length=1)


class AugmentAnswer(_Answer):
    criteria: list[AugmentedCriterion]


class MergedCriterion(DraftCriterion):
    origin: Literal["instruction", "trajectory"]
    trajectory_evidence: str | None = None


class MergeAnswer(_Answer):
    criteria: list[MergedCriterion]


class ScoreItem(_Answer):
    criterion: str
    score: Literal[-1, 0, 1]
    evidence: str
    justification: str


class ScoreAnswer(_Answer):
    verdicts: list[ScoreItem]


class AttributionItem(_Answer):
    criterion: str
    verdict: Literal["PASS", "FAIL", "NOT_APPLICABLE"]
    steps: list[int]
    reason: str = ""


class AttributeAnswer(_Answer):
    attributions: list[AttributionItem]


class FusedItem(_Answer):
    criterion: str
    verdict: Literal["PASS", "FAIL", "NOT_APPLICABLE"]
    steps: list[int]
    evidence: str
    justification: str


class FusedAnswer(_Answer):
    verdicts: list[FusedItem]


ANSWER_MODELS: dict[str, type[_Answer]] = {
    "propose": ProposeAnswer,
    "augment": AugmentAnswer,
    "merge": MergeAnswer,
    "score": ScoreAnswer,
    "attribute": AttributeAnswer,
    "score_attribute": FusedAnswer,
}


# -- parsing -------------------------------------------------------------------------------

MAX_ANSWER_CHARS = 200_000
"""The longest judge answer read: a verdict on every criterion fits in a few thousand."""
THINK_START, THINK_END = "<think>", "</think>"


def extract_json(text: str) -> Any:
    """The judge's answer: the whole reply as one JSON value, or the whole reply as one
    Markdown-fenced JSON block (```json ... ```), after a leading ``<think>...</think>``
    (the judge's own reasoning) is set aside. Nothing else is read: a brace span found inside
    prose may be the agent's own fake verdict that the judge quoted ("The agent wrote
    {...PASS...} but it failed"), so prose around an answer fails the answer, and the
    client's repair asks for the object alone. A raw line break or tab inside a string is
    read as that character (``strict=False``): llama.cpp's JSON grammar lets them through,
    and the text is evidence, not syntax.

    Work is linear in the reply's length and the reply is capped, so a runaway judge (a
    loop of fences or brackets) costs milliseconds and an ``InvalidAnswer``, not minutes."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidAnswer(["the answer is empty; reply with one JSON object"])
    if len(text) > MAX_ANSWER_CHARS:
        raise InvalidAnswer([f"the answer is {len(text):,} characters long; at most {MAX_ANSWER_CHARS:,} are read"])
    body = text.strip()
    if body.startswith(THINK_START) and THINK_END in body:
        body = body[body.index(THINK_END) + len(THINK_END):].strip()
    # A fence: ``` and an optional language tag, a line break, the body, a last line of ```.
    if body.startswith("```") and body.endswith("\n```"):
        tag_end = 3
        while tag_end < len(body) and body[tag_end].isascii() and body[tag_end].isalpha():
            tag_end += 1
        space_end = tag_end
        while space_end < len(body) and body[space_end].isspace():
            space_end += 1
        newline = body.find("\n", tag_end, space_end)
        if newline != -1 and newline + 1 <= len(body) - 4:
            body = body[newline + 1 : len(body) - 4].strip()
    try:
        return json.loads(body, strict=False)
    except RecursionError:
        raise InvalidAnswer(["the answer is nested too deeply to be a verdict"]) from None
    except ValueError as first:  # JSONDecodeError, or an integer too long to convert
        where = (f" ({first.msg} at line {first.lineno} column {first.colno})"
                 if isinstance(first, json.JSONDecodeError) else f" ({first})")
        raise InvalidAnswer([f"the answer is not valid JSON{where}: the reply must be the JSON object alone, "
                             "no text before or after it"]) from None


def parse_answer(stage: str, text: str) -> _Answer:
    """Text -> the stage's answer model, or InvalidAnswer naming each wrong field."""
    data = extract_json(text)
    if not isinstance(data, dict):
        raise InvalidAnswer([f"the answer must be a JSON object, got {type(data).__name__}"])
    try:
        return ANSWER_MODELS[stage].model_validate(data)
    except ValidationError as exc:
        errors = []
        for err in exc.errors()[:12]:
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            errors.append(f"{where}: {err['msg']}")
        raise InvalidAnswer(errors) from None


# -- JSON schemas sent to the server --------------------------------------------------------


def _inline(schema: dict) -> dict:
    """Resolve local $refs: some servers' schema engines do not follow them."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_titles(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_titles(v) for v in node]
    return node


def answer_schema(
    stage: str,
    *,
    titles: list[str] | None = None,
    n_steps: int | None = None,
    max_items: int | None = None,
) -> dict:
    """The stage's JSON schema, narrowed to this call: criterion titles as an enum, step
    numbers bounded by the trajectory, the list length bounded by the stage limit."""
    schema = copy.deepcopy(_base_schema(stage))
    (list_key,) = schema["properties"]
    array = schema["properties"][list_key]
    if max_items is not None:
        array["maxItems"] = max_items
    if titles is not None:
        array["minItems"] = array["maxItems"] = len(titles)
    item = array["items"]
    item["additionalProperties"] = False
    props = item["properties"]
    if titles is not None and "criterion" in props:
        props["criterion"] = {"type": "string", "enum": list(titles)}
    if n_steps is not None and "steps" in props:
        props["steps"] = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": max(n_steps, 1)}}
    return schema


@functools.lru_cache(maxsize=None)
def _base_schema(stage: str) -> dict:
    return _strip_titles(_inline(ANSWER_MODELS[stage].model_json_schema()))


# -- rules the schema cannot carry -----------------------------------------------------------


def _title_errors(title: str, where: str) -> list[str]:
    words = len(title.split())
    low, high = TITLE_WORDS
    if not low <= words <= high:
        return [f"{where}: title {title!r} has {words} words; use {low} to {high}"]
    return []


def first_of_each(criteria: list, known: set[str] = frozenset()) -> list:
    """``criteria`` without repeats: the first of each title (case and spacing aside), and
    none already in ``known``. A schema cannot forbid repeats and small judges make them
    (SmolLM2 restates a title within one answer, or re-proposes a criterion the rubric has),
    yet a repeat adds nothing to the rubric, so it is dropped rather than failing the answer."""
    seen, kept = set(known), []
    for criterion in criteria:
        key = normalize_title(criterion.title)
        if key not in seen:
            seen.add(key)
            kept.append(criterion)
    return kept


def normalize_title(title: str) -> str:
    return " ".join(title.lower().split())


def check_proposed(answer: ProposeAnswer, limit: int) -> list[Criterion]:
    criteria = first_of_each(answer.criteria)
    errors = [] if criteria else ["criteria: empty; propose at least one criterion"]
    if len(criteria) > limit:
        errors.append(f"criteria: {len(criteria)} given, at most {limit} allowed")
    for i, c in enumerate(answer.criteria):
        errors += _title_errors(c.title, f"criteria.{i}")
    if errors:
        raise InvalidAnswer(errors)
    return [
        Criterion(origin="instruction", **c.model_dump(include={"title", "description", "evaluator_instruction", "grounding_references"}))
        for c in criteria
    ]


def check_augmented(answer: AugmentAnswer, existing: list[Criterion], limit: int) -> list[Criterion]:
    """The new criteria only: one the rubric already has is dropped (an empty answer is
    fine, when the rollout shows nothing the rubric misses)."""
    criteria = first_of_each(answer.criteria, known={normalize_title(c.title) for c in existing})
    errors = []
    if len(criteria) > limit:
        errors.append(f"criteria: {len(criteria)} given, at most {limit} allowed")
    for i, c in enumerate(answer.criteria):
        errors += _title_errors(c.title, f"criteria.{i}")
    if errors:
        raise InvalidAnswer(errors)
    return [Criterion(origin="trajectory", **c.model_dump()) for c in criteria]


def check_merged(answer: MergeAnswer, limit: int) -> list[Criterion]:
    criteria = first_of_each(answer.criteria)
    errors = []
    if not criteria:
        errors.append("criteria: empty; keep every criterion that separates the rollouts")
    if len(criteria) > limit:
        errors.append(f"criteria: {len(criteria)} given, at most {limit} allowed")
    if errors:
        raise InvalidAnswer(errors)
    return [Criterion(**c.model_dump()) for c in criteria]


def _match_titles(items: list, titles: list[str]) -> list:
    """Items reordered to follow ``titles``; an error for each missing, unknown or
    repeated title. Matching ignores case and spacing, nothing else."""
    wanted = {normalize_title(t): i for i, t in enumerate(titles)}
    ordered: list = [None] * len(titles)
    errors = []
    for item in items:
        key = normalize_title(item.criterion)
        if key not in wanted:
            errors.append(f"criterion {item.criterion!r} is not in the rubric; use the titles exactly as given")
        elif ordered[wanted[key]] is not None:
            errors.append(f"criterion {item.criterion!r} is answered more than once")
        else:
            ordered[wanted[key]] = item
    missing = [t for t, item in zip(titles, ordered, strict=True) if item is None]
    if missing:
        errors.append(f"no answer for {len(missing)} criteria: {missing}")
    if errors:
        raise InvalidAnswer(errors)
    return ordered


def _citation_errors(verdict: str, steps: list[int], n_steps: int, title: str) -> list[str]:
    errors = []
    bad = [s for s in steps if not 1 <= s <= n_steps]
    if bad:
        errors.append(f"{title!r}: steps {bad} are outside the trajectory (1..{n_steps})")
    if verdict != "NOT_APPLICABLE" and not steps and n_steps > 0:
        errors.append(f"{title!r}: a {verdict} must cite at least one step (cite an omission where it mattered most)")
    return errors


def check_scores(answer: ScoreAnswer, titles: list[str]) -> list[ScoreItem]:
    return _match_titles(answer.verdicts, titles)


def _cited_in_title_order(items: list, titles: list[str], n_steps: int) -> list:
    """Items in ``titles`` order, each PASS/FAIL citing steps within 1..n_steps."""
    ordered = _match_titles(items, titles)
    errors = []
    for title, item in zip(titles, ordered, strict=True):
        errors += _citation_errors(item.verdict, item.steps, n_steps, title)
    if errors:
        raise InvalidAnswer(errors)
    return ordered


def check_attributions(answer: AttributeAnswer, titles: list[str], n_steps: int) -> list[AttributionItem]:
    return _cited_in_title_order(answer.attributions, titles, n_steps)


def check_fused(answer: FusedAnswer, titles: list[str], n_steps: int) -> list[Verdict]:
    ordered = _cited_in_title_order(answer.verdicts, titles, n_steps)
    return [
        Verdict(
            criterion=title,
            score=VERDICT_SCORES[item.verdict],
            cited_steps=item.steps if item.verdict != "NOT_APPLICABLE" else [],
            evidence=item.evidence,
            justification=item.justification,
        )
        for title, item in zip(titles, ordered, strict=True)
    ]
