"""What the judge reads: tasks, trajectories and rubrics as prompt text.

Everything the agent or the task author wrote is data, and the judge must never mistake it
for instructions. Data sits inside XML-like elements (``<task>``, ``<trajectory>``,
``<step n="3">``, ``<criteria>``) and every piece of it is escaped (``&``, ``<``, ``>``),
so agent text cannot close an element or open one that looks like ours. Beside the
escaping, every span of agent text and every observation is fenced: it sits between a line
``BEGIN-DATA <code>`` and a line ``END-DATA <code>``, where the code is the rollout's own
(``<trajectory fence="<code>">``), drawn from the rendered rollout and redrawn until it
occurs in none of its spans, so no agent text can hold the line that ends its span. The
judge's rules name the fence, and each stage names its prompt's codes. A code drawn from
the content rather than a fresh random one keeps one rollout's rendering identical in each
of its prompts (the judge's cache and the server's prefix cache reuse it); agent text cannot
aim at its code, which is a hash of the very text that would have to contain it.

Steps carry the same 1-based numbers the judge cites and credit uses. By default the judge
reads every message, observation and agent prompt as the agent saw it (the paper's judges read
the whole rollout); a cap (``max_message_chars``, ``max_observation_chars``,
``max_prompt_chars``: characters, None for none) keeps the head and tail of a longer text, to
save judge tokens. Only the whole rollout has a bound by default, the judged rubrics'
``max_trajectory_chars``: over it, every step is shortened alike.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import jinja2

from draco_gym.reward.answers import TITLE_WORDS
from draco_gym.text import split_middle, truncate_middle
from draco_gym.types import Criterion, Trajectory, Verdict

PROMPTS_DIR = Path(__file__).parent / "prompts"

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def escape(text: str) -> str:
    return str(text).translate(_ESCAPES)


FENCE_OPEN = "BEGIN-DATA"
FENCE_CLOSE = "END-DATA"
_FENCE_ATTRIBUTE = re.compile(r'<trajectory\b[^>]*\bfence="([0-9a-f]+)"')


def data_fence(spans: Sequence[str]) -> str:
    """The fence code of a rollout whose data is ``spans``: 8 hex digits of a hash of the
    spans, redrawn (with a counter) until it occurs in none of them."""
    joined = "\x00".join(spans)
    for salt in itertools.count():
        code = hashlib.sha256(f"{salt}\x00{joined}".encode()).hexdigest()[:8]
        if code not in joined:
            return code
    raise AssertionError("unreachable")


def fenced(data: str, code: str) -> str:
    return f"{FENCE_OPEN} {code}\n{data}\n{FENCE_CLOSE} {code}"


def fences_in(text: str) -> list[str]:
    """The fence codes of the rollouts rendered in ``text``, in order (agent text, being
    escaped, cannot hold a ``<trajectory`` element)."""
    return list(dict.fromkeys(_FENCE_ATTRIBUTE.findall(text)))


def truncate_fenced(body: str, limit: int, code: str) -> str:
    """``truncate_middle`` of a rendered rollout's body that keeps all its data fenced: a cut
    inside a span closes the fence before the cut marker and opens it again after, and a
    piece of markup the cut split (a tag, a fence line) is dropped."""
    head, marker, tail = split_middle(body, limit)
    if not marker:
        return body
    begin, end = f"{FENCE_OPEN} {code}", f"{FENCE_CLOSE} {code}"
    # the line the cut split, on each side ("" where the cut fell on a line break)
    head_cut = "" if body[len(head)] == "\n" else head[head.rfind("\n") + 1:]
    tail_start = len(body) - len(tail)
    tail_cut = "" if tail_start == 0 or body[tail_start - 1] == "\n" else tail.partition("\n")[0]
    head, tail = head[:len(head) - len(head_cut)], tail[len(tail_cut):].removeprefix("\n") if tail_cut else tail
    if head.rfind(begin) > head.rfind(end):  # cut inside a span: head_cut is data, or the start of its end line
        kept = "" if end.startswith(head_cut) else head_cut
        head = (head + kept).rstrip("\n") + "\n" + end
    first_end, first_begin = tail.find(end), tail.find(begin)
    if first_end != -1 and (first_begin == -1 or first_end < first_begin):  # the tail starts inside a span
        kept = "" if begin.endswith(tail_cut) else tail_cut + "\n"
        tail = begin + "\n" + kept + tail
    return head.rstrip("\n") + marker + tail


def render_task(task_instruction: str, agent_prompt: str = "", max_prompt_chars: int | None = None) -> str:
    """The task as the judge reads it; ``max_prompt_chars`` caps the agent prompt (None: whole;
    0: left out)."""
    parts = [f"<instruction>\n{escape(task_instruction)}\n</instruction>"]
    if agent_prompt and max_prompt_chars != 0:
        shown = agent_prompt if max_prompt_chars is None else truncate_middle(agent_prompt, max_prompt_chars)
        parts.append(f"<agent_prompt>\n{escape(shown)}\n</agent_prompt>")
    return "<task>\n" + "\n".join(parts) + "\n</task>"


def render_trajectory(
    trajectory: Trajectory,
    *,
    label: str | None = None,
    max_message_chars: int | None = None,
    max_observation_chars: int | None = None,
    max_chars: int | None = None,
) -> str:
    """The trajectory as numbered steps: the agent's message, then what it observed, each
    whole unless ``max_message_chars`` / ``max_observation_chars`` cap it.

    ``max_chars`` bounds the whole rendering (a 50-step rollout must still fit the judge's
    context next to G-1 others): when it is exceeded, every step is shortened alike, and
    every step keeps its number, so citations stay valid.
    """
    text = _render_steps(trajectory, label, max_message_chars, max_observation_chars)
    n = len(trajectory.steps)
    if max_chars is None or len(text) <= max_chars or n == 0:
        return text
    per_step = max(max_chars // n - 200, 200)  # 200: the step's own markup and fences
    message = min(max_message_chars or per_step, max(per_step * 3 // 5, 120))
    observation = min(max_observation_chars or per_step, max(per_step - message, 80))
    return _render_steps(trajectory, label, message, observation)


def _render_steps(trajectory: Trajectory, label: str | None, max_message_chars: int | None,
                  max_observation_chars: int | None) -> str:
    spans = []
    for step in trajectory.steps:  # a limit of 0 is truncate_middle's "none"
        spans.append(escape(truncate_middle(step.text, max_message_chars or 0)))
        spans.append(escape(truncate_middle(step.observation or "(none)", max_observation_chars or 0)))
    code = data_fence(spans)
    name = f' id="{escape(label)}"' if label else ""
    end = escape(trajectory.termination or "unknown")
    lines = [f'<trajectory{name} steps="{len(trajectory.steps)}" ended="{end}" fence="{code}">']
    for step, message, observation in zip(trajectory.steps, spans[0::2], spans[1::2]):
        lines.append(f'<step n="{step.index}">')
        lines.append(f"<agent>\n{fenced(message, code)}\n</agent>")
        lines.append(f"<observation>\n{fenced(observation, code)}\n</observation>")
        lines.append("</step>")
    if not trajectory.steps:
        lines.append("(the agent took no steps)")
    lines.append("</trajectory>")
    return "\n".join(lines)


def criteria_json(criteria: list[Criterion], *, with_evidence: bool = False) -> str:
    """The rubric as the judge sees it: a JSON list inside ``<criteria>``, escaped."""
    rows = []
    for c in criteria:
        row = {"title": c.title, "description": c.description, "evaluator_instruction": c.evaluator_instruction}
        if with_evidence:
            row["origin"] = c.origin
            if c.trajectory_evidence:
                row["trajectory_evidence"] = c.trajectory_evidence
        rows.append(row)
    return escape(json.dumps(rows, indent=1, ensure_ascii=False))


def verdicts_json(verdicts: list[Verdict]) -> str:
    label = {1: "PASS", -1: "FAIL", 0: "NOT_APPLICABLE"}
    rows = [{"criterion": v.criterion, "verdict": label[v.score], "evidence": v.evidence} for v in verdicts]
    return escape(json.dumps(rows, indent=1, ensure_ascii=False))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROMPTS_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # data is escaped by the functions above, once
    )


def stage_messages(stage: str, **variables) -> list[dict[str, str]]:
    """System and user message of ``stage`` from ``prompts/<stage>.j2`` (macros
    ``system`` and ``user``). Every stage states the criterion title rule (``title_words``)
    and names the fence codes of the rollouts it shows (``fences``), and, unless
    ``closing_turn=False`` (an environment under ``end_rule: task_completed``), opens with the
    paper's caveat that a brief closing turn without code is correct."""
    variables.setdefault("title_words", TITLE_WORDS)
    variables.setdefault("closing_turn", True)
    variables.setdefault("fences", list(dict.fromkeys(
        code for value in variables.values() for text in _texts(value) for code in fences_in(text))))
    module = _environment().get_template(f"{stage}.j2").make_module(variables)
    return [
        {"role": "system", "content": str(module.system()).strip()},
        {"role": "user", "content": str(module.user()).strip()},
    ]


def _texts(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []
