"""``draco-gym report RUN_DIR``: what the judge saw, decided and cited, as one HTML file.

The report reads only the run directory's files (``metrics.jsonl``, ``rollouts.jsonl``, one
``draco_gym.types.RolloutRecord`` a line, ``summary.json``), never the trainer or the judge,
so it works on any run, finished or not, copied from another machine. It writes one self-contained HTML page: data,
script and styles inline, charts as plain SVG drawn by the page's own script, no request to
anything, so it opens from disk and can be attached to an issue.

Agent output is hostile. Nothing from a rollout ever reaches the page as markup: the data is
JSON inside ``<script type="application/json">`` with ``<``, ``>`` and ``&`` written as
``\\u003c`` escapes (so ``</script>`` in an observation cannot close the element), the page's
script inserts every string as text, never as HTML, and a Content-Security-Policy admits only
the page's own script (by hash) and no network.

A large run stays usable: the summary of every group (rewards, advantages, verdict matrix,
terminations, env success) loads at once; the steps, verdict evidence and credit of each group
are gzip-compressed into their own block, decompressed only when that group is opened.
Embedded observations, messages and code are capped (head and tail kept) with a pointer to
the full text: the ``rollouts.jsonl`` line that holds it.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from draco_gym.metrics import difference, finite_number, group_advantages, learned_episodes
from draco_gym.records import RecordError, RecordReader
from draco_gym.text import truncate_middle
from draco_gym.types import RolloutRecord, Step

# What the judge reads of a step by default (draco_gym.reward.render.render_trajectory's
# max_message_chars and max_observation_chars; a test keeps the two in step): None, the
# whole text. Under a cap (the judged rubrics' options of the same names, given to the report
# as --judge-message-chars and --judge-observation-chars), a longer message or observation
# was shortened for the judge, and the report marks it.
JUDGE_MESSAGE_CHARS: int | None = None
JUDGE_OBSERVATION_CHARS: int | None = None

# The marker CodeStepEnv leaves where it truncated an observation (envs.base.truncate_middle).
_ENV_TRUNCATION = re.compile(r"\[\.\.\. \d+ characters truncated \.\.\.\]")

# Alternative names of the run-at-a-glance quantities in metrics.jsonl, first match wins. A
# key also matches under any prefix ("env_runners/reward_mean" for "reward_mean").
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "rubric_reward_mean", "episode_return_mean"),
    "reward_std": ("reward_std", "episode_return_std"),
    "pass_rate": ("rubric_pass_rate", "pass_rate"),
    "env_success": ("env/success", "env_success", "success_rate", "env/success_rate"),
    "criteria_before": ("criteria_before_dropout", "criteria/before_dropout"),
    "criteria_after": ("criteria_after_dropout", "criteria/after_dropout"),
    "inert_share": ("inert_credit_share", "credit/inert_share"),
    "paper_inert_share": ("paper_inert_share", "credit/paper_inert_share"),
    "uncredited_citations": ("uncredited_citations", "credit/uncredited_citations"),
    "judge_cost": ("judge_cost", "judge/cost"),
    "judge_prompt_tokens": ("judge_prompt_tokens", "judge/prompt_tokens"),
    "judge_completion_tokens": ("judge_completion_tokens", "judge/completion_tokens"),
    "judge_calls": ("judge_calls", "judge/calls"),
    "fallbacks": ("reward_fallbacks", "judge/fallbacks", "fallbacks"),
    "iteration": ("training_iteration", "iteration"),
}
_SUCCESS_KEYS = ("success", "task_success", "is_success", "solved")

_ASSETS = "report_assets"

# The token arrays of a trajectory (a 50-step episode holds tens of thousands of entries in
# each) are most of a rollout line and the report never shows them: they are cut out of the
# line before it is parsed. Inside a JSON string every quote is escaped, so the pattern
# matches only the keys themselves.
_TOKEN_ARRAYS = re.compile(r',\s*"token_(?:ids|step|logprobs)"\s*:\s*\[[^\]]*\]')


class ReportError(ValueError):
    """The run directory cannot be reported on; the message says what is wrong with it."""


# -- reading the run ---------------------------------------------------------------------------


def _flatten(row: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def find_metric(keys: list[str], names: tuple[str, ...]) -> str | None:
    """The first key that is one of ``names``, exactly or under a prefix."""
    for name in names:
        if name in keys:
            return name
        for key in keys:
            if key.endswith("/" + name):
                return key
    return None


def read_metrics(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``, flattened. A torn last line (a write cut short) is
    skipped and said in ``notes``, and so is an iteration that appears twice."""
    reader = RecordReader(path)
    try:
        rows = [_flatten(row) for _, row in reader]
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    if notes is not None:
        if reader.torn:
            notes.append(f"{path.name}: its last line is torn (a write cut short, e.g. by a kill) and was skipped")
        key = find_metric(sorted({k for r in rows for k in r}), METRIC_NAMES["iteration"])
        seen = Counter(r.get(key) for r in rows if key and finite_number(r.get(key)) is not None)
        repeated = sorted(it for it, n in seen.items() if n > 1)
        if repeated:
            notes.append(f"{path.name} repeats iteration(s) {_shown(repeated)}: a run resumed without cutting its "
                         "log (draco-gym train --resume moves what came after the checkpoint to set-aside/); the "
                         "charts show each row")
    return rows


def _shown(values: list) -> str:
    return ", ".join(str(int(v)) for v in values[:10]) + (f" (and {len(values) - 10} more)" if len(values) > 10 else "")


def env_success(metrics: dict[str, Any]) -> bool | None:
    """The environment's own verdict on an episode, if it gave one (AppWorld's tests,
    PythonTools' checked answer, tau-bench's reward of 1)."""
    for key in _SUCCESS_KEYS:
        if key in metrics and metrics[key] is not None:
            return bool(metrics[key])
    passed, total = metrics.get("passed", metrics.get("tests_passed")), metrics.get("total", metrics.get("tests_total"))
    if finite_number(passed) is not None and finite_number(total):
        return passed == total
    return None


def cap_text(text: str, limit: int, where: str) -> str:
    """``text`` cut in its middle to ``limit`` characters, the cut saying where the full text is."""
    return truncate_middle(text, limit, cut=f"not embedded: full text in {where}")


@dataclass
class Limits:
    """How much of each rollout's text the page embeds (characters, head and tail kept)."""

    observation: int = 1000
    message: int = 4000
    code: int = 4000
    instruction: int = 4000
    evidence: int = 1000
    judge_message: int | None = JUDGE_MESSAGE_CHARS
    judge_observation: int | None = JUDGE_OBSERVATION_CHARS


@dataclass
class _Group:
    iteration: int
    task_id: str
    rows: list[tuple[int, RolloutRecord]] = field(default_factory=list)  # (line number, record)


def as_record(raw: dict[str, Any], path: Path, number: int) -> RolloutRecord:
    """One parsed ``rollouts.jsonl`` line as its ``RolloutRecord``; a line that does not fit
    the schema is a ``ReportError`` naming the file, the line and the field."""
    try:
        return RolloutRecord.model_validate(raw)
    except ValidationError as exc:
        raise ReportError(f"{path} line {number} {_schema_problem(exc)}") from None


def _schema_problem(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    if any(e["type"] == "missing" and e["loc"] == ("trajectory",) for e in errors):
        return "has no 'trajectory' object: not a draco-gym rollout record"
    problems = [f"{'.'.join(map(str, e['loc'])) or 'the record'}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "does not fit the rollout record schema: " + "; ".join(problems) + more


def read_groups(path: Path, notes: list[str] | None = None):
    """Yield the groups of ``rollouts.jsonl`` in file order. A group is a run of lines with
    the same iteration and task whose rollout index keeps rising (a task drawn twice in one
    iteration makes two groups). A torn last line is skipped, and said in ``notes``, and so
    is an iteration that comes back after a later one."""
    current: _Group | None = None
    last_index = -1
    reader = RecordReader(path, prepare=lambda line: _TOKEN_ARRAYS.sub("", line))
    passed: set[int] = set()
    returned: set[int] = set()
    try:
        for number, raw in reader:
            record = as_record(raw, path, number)
            iteration = record.iteration or 0
            if current is None or (iteration, record.task_id) != (current.iteration, current.task_id) \
                    or record.index <= last_index:
                if current is not None:
                    yield current
                    if iteration != current.iteration:
                        passed.add(current.iteration)
                if iteration in passed:
                    returned.add(iteration)
                current = _Group(iteration, record.task_id)
            current.rows.append((number, record))
            last_index = record.index
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    if current is not None:
        yield current
    if notes is not None:
        if reader.torn:
            notes.append(f"{path.name}: its last line is torn (a write cut short, e.g. by a kill) and was skipped")
        if returned:
            notes.append(f"{path.name} repeats iteration(s) {_shown(sorted(returned))} (they come back after a later "
                         "one): a run resumed without cutting its log")


def _fallback_stage(reason: str) -> str:
    """The stage a fallback reason names: ``augment[3]: ...`` -> ``augment``."""
    return re.split(r"[\[:]", reason, maxsplit=1)[0].strip() or "other"


_DROPOUT_REASON = "no rollout of the group failed it (discriminative dropout): it could not tell the rollouts apart"


def _rubric(records: list[RolloutRecord]) -> tuple[list[list], list[list]]:
    """The group's surviving criteria as [title, origin, description] (a verdict on a title
    the saved list lacks still shows, of unknown origin) and its dropped ones as [title,
    origin, reason]."""
    criteria = [[c, None, ""] if isinstance(c, str) else [c.title, c.origin, c.description[:300]]
                for c in records[0].criteria]
    titles = {c[0] for c in criteria}
    for record in records:
        for v in record.score.verdicts if record.score else []:
            if v.criterion not in titles:
                titles.add(v.criterion)
                criteria.append([v.criterion, None, ""])
    return criteria, [[title, None, _DROPOUT_REASON] for title in records[0].dropped]


def _step_detail(step: Step, last: bool, termination: str | None, where: str, limits: Limits) -> dict:
    """One step as the page shows it: capped text, and marks where what the judge or the
    policy saw was shortened."""
    text, obs, code = step.text, step.observation, step.code
    marks = []
    if limits.judge_message is not None and len(text) > limits.judge_message:
        marks.append(f"judge saw the message shortened to {limits.judge_message} of {len(text)} characters")
    if limits.judge_observation is not None and len(obs) > limits.judge_observation:
        marks.append(f"judge saw the observation shortened to {limits.judge_observation} of {len(obs)} characters")
    if _ENV_TRUNCATION.search(obs):
        marks.append("the environment truncated this observation")
    if last and termination == "length":
        marks.append("the episode hit its token budget here: this message may be cut off")
    return {"text": cap_text(text, limits.message, where), "obs": cap_text(obs, limits.observation, where),
            "code": None if code is None else cap_text(code, limits.code, where),
            "nocode": None if code is not None else without_code(step, last), "n": step.n_tokens, "marks": marks}


def without_code(step: Step, last: bool) -> str:
    """What a turn without a code block was: a malformed reply (the parse error the agent was
    shown: a block opened but never closed, several blocks, an empty one), the closing
    message (the episode's last turn), or a message mid-episode (to a user, in tau-bench)."""
    parse = step.info.get("parse")
    error = parse.get("error") if isinstance(parse, dict) else None
    if error:
        return f"malformed reply ({error})"
    return "closing message" if last else "message without code"


def summarise_group(group: _Group, gid: int, source: str, limits: Limits) -> tuple[dict, dict, dict]:
    """The group's summary (always loaded), its detail (loaded when opened), and the
    per-rollout figures the run-level series are derived from."""
    records = [r for _, r in group.rows]
    criteria, dropped = _rubric(records)
    column = {c[0]: j for j, c in enumerate(criteria)}
    fallbacks = list(records[0].fallbacks)
    rewards = [r.score.reward if r.score else 0.0 for r in records]
    advantages = [0.0] * len(records)  # as training's: env_error episodes take no part (learned_episodes)
    kept = learned_episodes(r.trajectory.termination for r in records)
    for i, a_i in zip(kept, group_advantages([rewards[i] for i in kept])):
        advantages[i] = a_i
    summary_rows, detail_rows = [], []
    for (line, record), r_i, a_i in zip(group.rows, rewards, advantages):
        traj, score = record.trajectory, record.score
        steps, verdicts = traj.steps, score.verdicts if score else []
        step_adv = [finite_number(a) for a in record.step_advantages or []]  # None where not finite
        where = f"{source} line {line}"
        matrix: list[int | None] = [None] * len(criteria)
        for v in verdicts:
            matrix[column[v.criterion]] = v.score
        detail_rows.append({
            "line": line,
            "steps": [_step_detail(step, j == len(steps) - 1, traj.termination, where, limits)
                      for j, step in enumerate(steps)],
            "verdicts": [{"c": column[v.criterion], "s": v.score, "cite": list(v.cited_steps),
                          "ev": cap_text(v.evidence, limits.evidence, where),
                          "just": cap_text(v.justification, limits.evidence, where)}
                         for v in verdicts],
            "adv": step_adv,
            "metrics": {k: v for k, v in traj.metrics.items() if isinstance(v, (str, int, float, bool)) or v is None},
        })
        summary_rows.append({
            "line": line, "R": r_i, "A": a_i, "ok": env_success(traj.metrics), "term": traj.termination or "unknown",
            "ns": len(steps), "p": score.p if score else 0, "f": score.f if score else 0, "v": matrix,
            "tok": sum(s.n_tokens for s in steps),
        })
    instruction = cap_text(records[0].trajectory.task.instruction, limits.instruction,
                           f"{source} line {group.rows[0][0]}")
    summary = {"id": gid, "it": group.iteration, "task": group.task_id, "crit": criteria,
               "drop": dropped, "fb": fallbacks, "roll": summary_rows, "dis": disagreements(summary_rows)}
    if summary["dis"] and not any(advantages):
        summary["dis"].append("every rollout has A_i = 0 (the rewards tie): the group teaches nothing either way")
    detail = {"instruction": instruction, "rollouts": detail_rows}
    derived = {"fb_stages": Counter(_fallback_stage(f) for f in fallbacks),
               "before": len(criteria) + len(dropped), "after": len(criteria)}
    return summary, detail, derived


def disagreements(rows: list[dict]) -> list[str]:
    """Where the judge's reward and the environment's own success disagree in a group:
    a failed rollout the judge rewards (R > 0), a successful one it punishes (R < 0), or a
    failed rollout ranked at or above a successful one. The reward-hacking lens."""
    out = []
    for i, r in enumerate(rows):
        if r["ok"] is False and r["R"] > 0:
            out.append(f"#{i + 1} failed in the environment but the judge rewarded it (R={r['R']:+.2f})")
        elif r["ok"] is True and r["R"] < 0:
            out.append(f"#{i + 1} succeeded in the environment but the judge punished it (R={r['R']:+.2f})")
    failed = [(i, r["R"]) for i, r in enumerate(rows) if r["ok"] is False]
    passed = [(i, r["R"]) for i, r in enumerate(rows) if r["ok"] is True]
    if failed and passed:
        worst_pass = min(passed, key=lambda x: x[1])
        best_fail = max(failed, key=lambda x: x[1])
        if best_fail[1] >= worst_pass[1]:
            out.append(f"#{best_fail[0] + 1} failed yet ranks at or above #{worst_pass[0] + 1}, which succeeded "
                       f"(R={best_fail[1]:+.2f} vs {worst_pass[1]:+.2f})")
    return out


def _read_summary(run: Path) -> dict | None:
    """The evaluation: ``summary.json``'s before/after section (``draco-gym train
    --before-after``), else ``eval/summary.json`` (``draco-gym eval``), as a table."""
    for path in (run / "summary.json", run / "eval" / "summary.json"):
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ReportError(f"{path} is not UTF-8 text: the file is damaged") from None
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path} is not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            continue
        section = data.get("eval") if isinstance(data.get("eval"), dict) else None
        columns = ({name: v for name, v in section.items() if isinstance(v, dict)} if section is not None
                   else _eval_columns(data))
        notes = data.get("notes") if isinstance(data.get("notes"), list) else []
        return {"file": path.relative_to(run).as_posix(), **evaluation_table(columns),
                "notes": [str(n) for n in notes]}
    return None


def _eval_columns(data: dict) -> dict[str, dict]:
    """``draco-gym eval``'s summary: a column per checkpoint (per split and checkpoint when
    it evaluated several splits), else the file's own figures as one column."""
    splits = data.get("splits") if isinstance(data.get("splits"), dict) else {}
    columns = {}
    for split, figures in splits.items():
        runs = figures.get("checkpoints") if isinstance(figures, dict) else None
        for label, figures_of_one in (runs.items() if isinstance(runs, dict) else ()):
            if isinstance(figures_of_one, dict):
                columns[label if len(splits) == 1 else f"{split}: {label}"] = figures_of_one
    return columns or {str(data.get("checkpoint", "checkpoint")): data}


def _is_rate(value) -> bool:
    """A share with its interval (``draco_gym.metrics.share``): {mean, k, n, ci95}."""
    return (isinstance(value, dict) and finite_number(value.get("mean")) is not None
            and isinstance(value.get("n"), int) and isinstance(value.get("ci95"), list) and len(value["ci95"]) == 2
            and all(finite_number(x) is not None for x in value["ci95"]))


def _cells(figures: dict, prefix: str = "") -> dict[str, Any]:
    """One column's cells by row name: a rate as {v, ci, k, n}, a nested dict's values under
    ``key/...``, anything else as it is. ``rates`` (``draco-gym eval``'s rates with their
    intervals) fills the rows of the same names."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        if key == "rates" and isinstance(value, dict) and not prefix:
            out.update(_cells(value))
        elif _is_rate(value):
            out[prefix + str(key)] = {"v": value["mean"], "ci": value["ci95"], "k": value.get("k"), "n": value["n"],
                                      **({"outcomes": value["outcomes"]} if isinstance(value.get("outcomes"), dict) else {})}
        elif isinstance(value, dict):
            out.update(_cells(value, f"{prefix}{key}/"))
        else:
            out[prefix + str(key)] = value
    return out


def evaluation_table(columns: dict[str, dict]) -> dict:
    """Rows of cells, a column per evaluation; with a ``before`` and an ``after`` column, a
    rate's row also gets after - before with its 95% interval (``draco_gym.metrics.difference``,
    paired where both name the same episodes; none for a rate at 0 or 1 on both sides, which
    has no spread).
    A setting or a count (tasks, temperature, episodes) gets none: it is not a result."""
    cells = {name: _cells(figures) for name, figures in columns.items()}
    keys = list(dict.fromkeys(k for column in cells.values() for k in column))
    both = "before" in cells and "after" in cells
    rows = []
    for key in keys:
        row = {"key": key, "cells": [column.get(key) for column in cells.values()], "diff": None}
        before, after = (cells["before"].get(key), cells["after"].get(key)) if both else (None, None)
        if isinstance(before, dict) and isinstance(after, dict):
            diff = difference(*({"mean": c["v"], "n": c["n"], "outcomes": c.get("outcomes")} for c in (before, after)))
            # At 0 (or 1) on both sides the difference has no spread: its interval, [0, 0], says nothing.
            flat = before["v"] == after["v"] and before["v"] in (0, 1)
            row["diff"] = {"v": diff["delta"], "ci": None if flat else diff["ci95"]}
        rows.append(row)
    for column in cells.values():  # the pairing is read; the page shows rates, not episodes
        for cell in column.values():
            if isinstance(cell, dict):
                cell.pop("outcomes", None)
    return {"columns": list(cells), "rows": rows, "diff": both}


# -- the page ----------------------------------------------------------------------------------


def embed_json(data) -> str:
    """JSON that is inert inside an HTML ``<script>`` element: no ``<``, ``>`` or ``&`` is
    left to end the element or open a comment, and JSON.parse reads the escapes back."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _pack(detail: dict) -> str:
    raw = json.dumps(detail, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=5, mtime=0)).decode("ascii")


def _asset(name: str) -> str:
    return resources.files("draco_gym").joinpath(_ASSETS, name).read_text(encoding="utf-8")


def _series(rows: list[dict]) -> tuple[list[float], dict[str, list[float | None]]]:
    keys = sorted({k for r in rows for k, v in r.items() if finite_number(v) is not None})
    it_key = find_metric(keys, METRIC_NAMES["iteration"])
    xs = [(finite_number(r.get(it_key)) if it_key else None) or float(i + 1) for i, r in enumerate(rows)]
    return xs, {k: [finite_number(r.get(k)) for r in rows] for k in keys if k != it_key}


def build_report(run_dir: str | Path, out: str | Path | None = None, *, limits: Limits | None = None,
                 title: str | None = None, notes: list[str] | None = None) -> Path:
    """Write the HTML report of ``run_dir``; returns its path (default RUN_DIR/report.html).
    What the page warns about (a torn last line skipped, an iteration logged twice) is also
    appended to ``notes``. Damaged input raises ``ReportError`` naming the file and line."""
    notes = notes if notes is not None else []
    run = Path(run_dir)
    if not run.is_dir():
        raise ReportError(f"{run}: no such run directory")
    metrics_path, rollouts_path = run / "metrics.jsonl", run / "rollouts.jsonl"
    if not metrics_path.is_file() and not rollouts_path.is_file():
        raise ReportError(f"{run} has neither metrics.jsonl nor rollouts.jsonl: is it a draco-gym run directory "
                          "(the output_dir of `draco-gym train`)?")
    limits = limits or Limits()
    target = Path(out) if out else run / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)

    rows = read_metrics(metrics_path, notes) if metrics_path.is_file() else []
    xs, series = _series(rows)
    names = {what: find_metric(list(series), alts) for what, alts in METRIC_NAMES.items() if what != "iteration"}

    groups, chunks = [], []
    per_iteration: dict[int, dict] = {}
    if rollouts_path.is_file():
        for gid, group in enumerate(read_groups(rollouts_path, notes)):
            try:
                summary, detail, derived = summarise_group(group, gid, rollouts_path.name, limits)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ReportError(f"{rollouts_path} line {group.rows[0][0]}: not a draco-gym rollout record "
                                  f"({type(exc).__name__}: {exc})") from None
            groups.append(summary)
            chunks.append(_pack(detail))
            agg = per_iteration.setdefault(group.iteration, {"R": [], "ok": [], "p": 0, "f": 0, "before": [], "after": [],
                                                             "fb": Counter(), "term": Counter()})
            for r in summary["roll"]:
                agg["R"].append(r["R"])
                agg["p"] += r["p"]
                agg["f"] += r["f"]
                agg["term"][r["term"]] += 1
                if r["ok"] is not None:
                    agg["ok"].append(float(r["ok"]))
            agg["before"].append(derived["before"])
            agg["after"].append(derived["after"])
            agg["fb"].update(derived["fb_stages"])

    # Rollouts count iterations from 0 (the trainer's count before the step), metrics.jsonl
    # from 1 (training_iteration): shift so that both name an iteration alike.
    shift = 1 if per_iteration and min(per_iteration) == 0 else 0
    for g in groups:
        g["it"] += shift
    derived_series = _derived_series({k + shift: v for k, v in per_iteration.items()})
    notes.extend(_more_rollouts_than_episodes(rows, {k + shift: len(v["R"]) for k, v in per_iteration.items()}))

    index = {
        "title": title or run.resolve().name,
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "files": {"metrics": metrics_path.name if metrics_path.is_file() else None,
                  "rollouts": rollouts_path.name if rollouts_path.is_file() else None,
                  # Where the full records are, relative to the report, for a link beside each pointer.
                  "rollouts_href": Path(os.path.relpath(rollouts_path.resolve(), target.parent.resolve())).as_posix()
                  if rollouts_path.is_file() else None},
        "metrics": {"x": xs, "series": series, "names": names},
        "derived": derived_series,
        "eval": _read_summary(run),
        "groups": groups,
        "warnings": notes,
        "limits": {"observation": limits.observation, "message": limits.message, "code": limits.code},
    }
    html = render_html(index, chunks)
    target.write_text(html, encoding="utf-8")
    return target


def _more_rollouts_than_episodes(rows: list[dict], rollouts: dict[int, int]) -> list[str]:
    """An iteration with more rollouts than the episodes its metrics row counts was written
    twice (a resumed run that appended to the log instead of cutting it)."""
    keys = sorted({k for r in rows for k in r})
    it_key, n_key = find_metric(keys, METRIC_NAMES["iteration"]), find_metric(keys, ("num_episodes",))
    if not it_key or not n_key:
        return []
    episodes = {int(r[it_key]): finite_number(r.get(n_key)) for r in rows if finite_number(r.get(it_key)) is not None}
    over = sorted(it for it, n in rollouts.items() if episodes.get(it) is not None and n > episodes[it])
    if not over:
        return []
    return [f"rollouts.jsonl holds more rollouts of iteration(s) {_shown(over)} than metrics.jsonl counts episodes: "
            "an iteration written twice (a run resumed without cutting its log)"]


def _derived_series(per_iteration: dict[int, dict]) -> dict:
    """Run-level series computed from rollouts.jsonl itself, for runs whose metrics lack them.
    Credit's measures (the inert shares, uncredited citations) are not among them: the
    trainer's ``CreditedBatch`` computes them, against each rule's own base, and the report
    reads them from metrics.jsonl only."""
    its = sorted(per_iteration)
    out: dict[str, Any] = {"x": its}

    def mean(values):
        return sum(values) / len(values) if values else None

    aggs = [per_iteration[i] for i in its]
    out["reward"] = [mean(a["R"]) for a in aggs]
    out["pass_rate"] = [a["p"] / (a["p"] + a["f"]) if a["p"] + a["f"] else None for a in aggs]
    out["env_success"] = [mean(a["ok"]) for a in aggs]
    out["criteria_before"] = [mean(a["before"]) for a in aggs]
    out["criteria_after"] = [mean(a["after"]) for a in aggs]
    modes = sorted({m for a in aggs for m in a["term"]})
    out["termination"] = {m: [a["term"][m] / max(sum(a["term"].values()), 1) for a in aggs] for m in modes}
    stages = sorted({s for a in aggs for s in a["fb"]})
    out["fallbacks"] = {s: [a["fb"][s] for a in aggs] for s in stages}
    return out


def render_html(index: dict, chunks: list[str]) -> str:
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
           "connect-src 'none'; form-action 'none'; base-uri 'none'")
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>draco-gym report</title>",
        "<style>", _asset("report.css"), "</style></head><body>",
        '<noscript>This report needs JavaScript to draw its views.</noscript>',
        '<div id="app"><p class="loading">Loading the run…</p></div>',
        '<script type="application/json" id="run-index">', embed_json(index), "</script>",
    ]
    # Base64 has no character that could end the element.
    parts.extend(f'<script type="application/octet-stream" id="g{i}">{chunk}</script>' for i, chunk in enumerate(chunks))
    parts.extend(["<script>", script, "</script></body></html>\n"])
    return "".join(parts)


# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's output_dir (metrics.jsonl, rollouts.jsonl, ...)")
    parser.add_argument("-o", "--output", help="where to write the HTML (default RUN_DIR/report.html)")
    parser.add_argument("--title", help="the report's title (default: the run directory's name)")
    parser.add_argument("--max-observation-chars", type=int, default=Limits.observation, metavar="N",
                        help="embed at most N characters of each observation, head and tail (default %(default)s); "
                             "the rest is named by its rollouts.jsonl line")
    parser.add_argument("--max-message-chars", type=int, default=Limits.message, metavar="N",
                        help="the same for each message and code block (default %(default)s)")
    parser.add_argument("--judge-message-chars", type=int, default=JUDGE_MESSAGE_CHARS, metavar="N",
                        help="the judge's message cap, if the run set one, to mark steps it saw shortened "
                             "(default: none, the judge read every message whole)")
    parser.add_argument("--judge-observation-chars", type=int, default=JUDGE_OBSERVATION_CHARS, metavar="N",
                        help="the judge's observation cap, if the run set one (default: none)")


def run(args: argparse.Namespace) -> int:
    for name in ("max_observation_chars", "max_message_chars", "judge_message_chars", "judge_observation_chars"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    limits = Limits(observation=args.max_observation_chars, message=args.max_message_chars,
                    code=args.max_message_chars, judge_message=args.judge_message_chars,
                    judge_observation=args.judge_observation_chars)
    started = time.perf_counter()
    notes: list[str] = []
    try:
        path = build_report(args.run_dir, args.output, limits=limits, title=args.title, notes=notes)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unreadable input or unwritable output: named, not a traceback
        print(f"error: {exc.filename or args.run_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    size = path.stat().st_size / 2**20
    print(f"report: {path} ({size:.1f} MiB, {time.perf_counter() - started:.1f} s); open it in a browser")
    return 0
