"""What the readers share: the file's text, records with line numbers, and field checks.

A field check that fails raises `Bad` with the reason, a well-formed row that cannot be
replayed raises `Excluded`; `collect` turns both into `BadRow`s with the line number, so a
reader is a record source plus one function from a record to a `TraceRow`.

Numbers come from JSON (int, float) or CSV (text). A bool is not a number, NaN and
infinities are refused, and a count given with a fraction (12.5 tokens) is malformed;
12.0 is accepted as 12.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from optimizer.errors import first_line
from optimizer.workload.traces.base import BadRow, TraceError, TraceRead, TraceRow

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


class Bad(ValueError):
    """This row is malformed; the message is the reason."""


class Excluded(ValueError):
    """This row is well formed but not replayable (e.g. logged as a failure); the message says why."""


MAX_BYTES = 2 << 30  # a trace is read whole: past this it would hold the driver's memory hostage


def read_text(path: Path) -> str:
    """The whole file as text (UTF-8, a BOM allowed, newlines as \\n), or a one-line TraceError
    (a file past MAX_BYTES included)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise TraceError(f"trace {path}: {size / 2**30:.1f} GiB, past the {MAX_BYTES >> 30} GiB a trace may "
                             "hold (it is read whole); cut it to the span to replay (e.g. head -n 1000000)")
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace {path}: cannot read it ({first_line(exc)}); check the path") from exc


def json_lines(path: Path) -> Iterator[tuple[int, object]]:
    """(line, parsed value) for each non-blank line; a line that is not JSON gives a `Bad`."""
    for line, text in enumerate(read_text(path).split("\n"), 1):
        if not text.strip():
            continue
        try:
            yield line, json.loads(text)
        except json.JSONDecodeError as exc:
            yield line, Bad(f"not valid JSON ({exc.msg} at column {exc.colno})")
        except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
            yield line, Bad(f"not usable JSON ({first_line(exc, 80)})")


def csv_records(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, object]]:
    """(line, {column: text}) for each non-blank record after the header (line 1).

    The header must name every `required` column (any order, extra columns allowed); a
    record with a different number of fields than the header gives a `Bad`.
    """
    reader = csv.reader(io.StringIO(read_text(path)))
    try:
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in required if name not in header]
        if missing:
            found = ",".join(header) if header else "an empty file"
            raise TraceError(f"trace {path}: the CSV header has no {' / '.join(map(repr, missing))} column "
                             f"(found {found}); expected a header with {', '.join(required)}")
        end = reader.line_num
        for cells in reader:
            line, end = end + 1, reader.line_num
            if not cells:
                continue
            if len(cells) != len(header):
                yield line, Bad(f"expected {len(header)} comma-separated fields, found {len(cells)}")
            else:
                yield line, dict(zip(header, cells))
    except csv.Error as exc:
        raise TraceError(f"trace {path}: not readable as CSV near line {reader.line_num} ({exc})") from exc


def collect(fmt: str, records: Iterable[tuple[int, object]],
            make: Callable[[object], dict]) -> TraceRead:
    """One `TraceRow(line, **make(record))` per record; `Bad` and `Excluded` are reported by line."""
    rows, bad, excluded = [], [], []
    for line, record in records:
        try:
            if isinstance(record, Bad):
                raise record
            rows.append(TraceRow(line=line, **make(record)))
        except Excluded as exc:
            excluded.append(BadRow(line, str(exc)))
        except Bad as exc:
            bad.append(BadRow(line, str(exc)))
    return TraceRead(fmt, tuple(rows), tuple(bad), tuple(excluded))


def show(value) -> str:
    """repr() of a value, cut to 40 characters for a one-line reason."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number(value, name: str) -> int | float:
    """A finite int or float from JSON or CSV text."""
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit() and len(text) < 19:  # the common case, fast
            return int(text)
        if _NUMBER.fullmatch(text) and len(text) < 400:
            value = int(text) if text.lstrip("+-").isdigit() else float(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise Bad(f"{name} is not a number: {show(value)}")
    return value


def whole(value, name: str, minimum: int) -> int:
    """A whole number >= minimum (12.0 is 12; 12.5 is malformed)."""
    n = number(value, name)
    if isinstance(n, float):
        if not n.is_integer():
            raise Bad(f"{name} must be a whole number, got {show(value)}")
        n = int(n)
    if n < minimum:
        raise Bad(f"{name} must be >= {minimum}, got {n}")
    return n


def seconds(value, name: str) -> float:
    """A non-negative time as a float."""
    n = number(value, name)
    if n < 0:
        raise Bad(f"{name} must be >= 0, got {show(value)}")
    return float(n)


def fields(obj, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict:
    """A JSON object whose keys are all `allowed` and include every `required` one."""
    if not isinstance(obj, dict):
        raise Bad(f"not a JSON object (a {type(obj).__name__})")
    for key in obj:
        if key not in allowed:
            raise Bad(f"unknown key {show(key)} (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in obj:
            raise Bad(f"missing key {key!r}")
    return obj
