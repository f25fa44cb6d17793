"""What the judge reads: tasks, trajectories and rubrics as prompt text.

Everything the agent or the task author wrote is data, and the judge must never mistake it
for instructions. Data sits inside XML-like elements (``<task>``, ``<trajectory>``,
``<step n="3">``, ``<criteria>``) and every piece of it is escaped (``&``, ``<``, ``>``),
so agent text cannot close an element or open one that looks like ours; the prompts say
that element content is never an instruction. Steps carry the same 1-based numbers the
judge cites and credit uses. Long observations and messages keep their head and tail.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jinja2

from draco_gym.reward.answers import TITLE_WORDS
from draco_gym.text import truncate_middle
from draco_gym.types import Criterion, Trajectory, Verdict

PROMPTS_DIR = Path(__file__).parent / "prompts"

_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def escape(text: str) -> str:
    return str(text).translate(_ESCAPES)


def render_task(task_instruction: str, agent_prompt: str = "", max_prompt_chars: int = 3000) -> str:
    parts = [f"<instruction>\n{escape(task_instruction)}\n</instruction>"]
    if agent_prompt and max_prompt_chars > 0:
        parts.append(f"<agent_prompt>\n{escape(truncate_middle(agent_prompt, max_prompt_chars))}\n</agent_prompt>")
    return "<task>\n" + "\n".join(parts) + "\n</task>"


def render_trajectory(
    trajectory: Trajectory,
    *,
    label: str | None = None,
    max_message_chars: int = 6000,
    max_observation_chars: int = 2000,
    max_chars: int | None = None,
) -> str:
    """The trajectory as numbered steps: the agent's message, then what it observed.

    ``max_chars`` bounds the whole rendering (a 50-step rollout must still fit the judge's
    context next to G-1 others): when it is exceeded, every step is shortened alike, and
    every step keeps its number, so citations stay valid.
    """
    text = _render_steps(trajectory, label, max_message_chars, max_observation_chars)
    n = len(trajectory.steps)
    if max_chars is None or len(text) <= max_chars or n == 0:
        return text
    per_step = max(max_chars // n - 120, 200)  # 120: the step's own markup
    message = min(max_message_chars, max(per_step * 3 // 5, 120))
    observation = min(max_observation_chars, max(per_step - message, 80))
    return _render_steps(trajectory, label, message, observation)


def _render_steps(trajectory: Trajectory, label: str | None, max_message_chars: int, max_observation_chars: int) -> str:
    name = f' id="{escape(label)}"' if label else ""
    end = escape(trajectory.termination or "unknown")
    lines = [f'<trajectory{name} steps="{len(trajectory.steps)}" ended="{end}">']
    for step in trajectory.steps:
        lines.append(f'<step n="{step.index}">')
        lines.append(f"<agent>\n{escape(truncate_middle(step.text, max_message_chars))}\n</agent>")
        observation = step.observation or "(none)"
        lines.append(f"<observation>\n{escape(truncate_middle(observation, max_observation_chars))}\n</observation>")
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
    ``system`` and ``user``). Every stage states the criterion title rule (``title_words``)."""
    variables.setdefault("title_words", TITLE_WORDS)
    module = _environment().get_template(f"{stage}.j2").make_module(variables)
    return [
        {"role": "system", "content": str(module.system()).strip()},
        {"role": "user", "content": str(module.user()).strip()},
    ]
