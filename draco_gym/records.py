"""JSON Lines files that a kill cannot leave half-readable: ``metrics.jsonl``, ``rollouts.jsonl``.

A writer appends each record as one whole line in one ``write`` call on a file opened for
appending (unbuffered: a line is in the kernel the moment the call returns, so a killed
process loses no line it finished), then ``fsync``s the batch. A line is therefore complete
or, if the machine itself went down mid-write, the file's last one and without its newline:
"torn". A reader skips a torn last line and counts it; a damaged line anywhere else (bytes
that are not UTF-8, text that is not a JSON object) is an error naming the file and line.

``cut_after`` is how a resumed run continues a log: the records after a point, and a torn
tail, are moved to a file under ``set-aside/`` and the log is truncated there, so every
record appears once and none is lost.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


class RecordError(ValueError):
    """A JSON Lines file with a damaged line: the message names the file, the line and why."""


class RecordReader:
    """The records of a JSON Lines file in order, as ``(line number, record)``; ``torn`` counts
    the unfinished last line skipped (0 or 1), once the iteration has reached the end.

    ``prepare`` rewrites a line's text before it is parsed (the report drops token arrays
    it never shows, unparsed)."""

    def __init__(self, path: str | Path, prepare: Callable[[str], str] | None = None) -> None:
        self.path = Path(path)
        self.prepare = prepare
        self.torn = 0

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        self.torn = 0
        with open(self.path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                record = self._parse(raw, number)
                if record is None:  # torn: only a file's last line lacks its newline
                    self.torn = 1
                    return
                yield number, record

    def _parse(self, raw: bytes, number: int) -> dict[str, Any] | None:
        finished = raw.endswith(b"\n")
        try:
            text = raw.decode("utf-8")
            record = json.loads(self.prepare(text) if self.prepare else text)
        except UnicodeDecodeError as exc:
            if not finished:
                return None
            raise RecordError(f"{self.path} line {number} is not UTF-8 text (byte {exc.start}: "
                              f"{raw[exc.start:exc.start + 4]!r}): the file is damaged") from None
        except json.JSONDecodeError as exc:
            if not finished:
                return None
            raise RecordError(f"{self.path} line {number} is not JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(record, dict):
            raise RecordError(f"{self.path} line {number} is not a JSON object")
        return record


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Every record of ``path`` and the count of torn last lines skipped (0 or 1)."""
    reader = RecordReader(path)
    records = [record for _, record in reader]
    return records, reader.torn


def append_records(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Append each record as one line, one ``write`` each, then ``fsync``; returns the count.

    A torn tail the file already ends in (a write the machine never finished) is first moved
    aside (``set_aside_torn_tail``), so a new line never glues onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    set_aside_torn_tail(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    written = 0
    try:
        for record in records:
            _write_all(fd, (json.dumps(record) + "\n").encode("utf-8"))
            written += 1
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a regular file takes the whole line in one call; a full disk may take less
        view = view[os.write(fd, view):]


SET_ASIDE = "set-aside"


def stamp() -> str:
    """A set-aside folder's time label, UTC (``20250101T120000Z``)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside_torn_tail(path: Path) -> Path | None:
    """A last line without its newline moved to ``set-aside/torn-<time>/<name>`` beside the
    file and cut off it; returns where it went (None: the file ends cleanly)."""
    if not path.is_file():
        return None
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size == 0 or _byte_at(fh, size - 1) == b"\n":
            return None
        start = _line_start(fh, size)
    return move_tail(path, start, path.parent / SET_ASIDE / f"torn-{stamp()}")[0]


def cut_point(path: str | Path, beyond: Callable[[bytes], bool]) -> tuple[int, int]:
    """(lines kept, byte offset) of the cut before the first line for which ``beyond(line)``
    holds, or before a torn tail (the file's size: no cut). ``beyond`` raises ``ValueError``
    for a line it cannot read: ``RecordError`` then names the file and line."""
    path = Path(path)
    kept, offset = 0, 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                break
            if raw.strip():
                try:
                    if beyond(raw):
                        break
                except (ValueError, UnicodeDecodeError) as exc:
                    raise RecordError(f"{path} line {number} is damaged ({exc}); move the file aside or repair "
                                      "that line, then resume again") from None
                kept += 1
            offset += len(raw)
    return kept, offset


def cut_after(path: str | Path, beyond: Callable[[bytes], bool], aside: Path) -> tuple[int, int, Path | None]:
    """Move everything from ``cut_point`` on to ``aside/<name>`` and truncate ``path`` there.
    Returns the lines kept, the lines moved and where they went (None: nothing moved).

    The moved part is written and synced before the log is truncated: a kill in between
    leaves both copies, never neither."""
    path = Path(path)
    if not path.is_file():
        return 0, 0, None
    kept, offset = cut_point(path, beyond)
    if offset == path.stat().st_size:
        return kept, 0, None
    target, moved = move_tail(path, offset, aside)
    return kept, moved, target


def move_tail(path: Path, offset: int, aside: Path) -> tuple[Path, int]:
    """Bytes from ``offset`` on appended to ``aside/<name>`` (synced), then cut off ``path``;
    returns the file and the lines (newline-ended pieces, a last unfinished one included)
    moved."""
    aside.mkdir(parents=True, exist_ok=True)
    target = aside / path.name
    lines, last = 0, b"\n"
    with open(path, "rb") as src, open(target, "ab") as dst:
        src.seek(offset)
        while chunk := src.read(_CHUNK):
            dst.write(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
        dst.flush()
        os.fsync(dst.fileno())
    os.truncate(path, offset)
    return target, lines + (last != b"\n")


def _byte_at(fh, offset: int) -> bytes:
    fh.seek(offset)
    return fh.read(1)


def _line_start(fh, end: int) -> int:
    """Offset just after the last newline before ``end`` (0 if none)."""
    pos = end
    while pos > 0:
        step = min(_CHUNK, pos)
        fh.seek(pos - step)
        block = fh.read(step)
        at = block.rfind(b"\n")
        if at >= 0:
            return pos - step + at + 1
        pos -= step
    return 0


def write_json(path: str | Path, value: Any) -> None:
    """A whole JSON file (a run's ``summary.json``, ``memory.json``), replaced in one step: a
    reader, or a kill mid-write, sees the old file or the new one, never half of either."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(value, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
