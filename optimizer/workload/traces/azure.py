"""Azure LLM inference trace (CSV): `TIMESTAMP,ContextTokens,GeneratedTokens`.

TIMESTAMP is a wall-clock time such as `2023-11-16 18:15:46.6805900` (the public traces
have 7 fractional digits, 100 ns ticks, which `datetime` cannot parse: the fraction is
read separately). Fewer digits, no fraction, a `T` separator, a `Z` or `+HH:MM` suffix, or a
plain number of seconds are accepted too. Times without an offset are taken as UTC;
`timestamp_s` is seconds since the epoch (only differences matter). `input_tokens` is
ContextTokens (>= 1), `output_tokens` is GeneratedTokens; a row with GeneratedTokens 0
produced nothing to replay and goes to `excluded`. Line numbers are the file's.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from optimizer.workload.traces._fields import (
    Bad,
    Excluded,
    collect,
    csv_records,
    seconds,
    show,
    whole,
)
from optimizer.workload.traces.base import TraceRead

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_WALL = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
                   r"(Z|[+-]\d\d:?\d\d)?", re.ASCII)


def wall_clock(text: str) -> float:
    """Seconds since the epoch of a TIMESTAMP cell (a date-time or a number of seconds)."""
    match = _WALL.fullmatch(text.strip())
    if match is None:
        try:
            return seconds(text, "TIMESTAMP")
        except Bad:
            raise Bad(f"TIMESTAMP is neither a date-time nor a number of seconds: {show(text)}") from None
    *parts, fraction, offset = match.groups()
    try:
        zone = timezone.utc
        if offset and offset != "Z":
            sign = -1 if offset[0] == "-" else 1
            zone = timezone(sign * timedelta(hours=int(offset[1:3]), minutes=int(offset[-2:])))
        moment = datetime(*map(int, parts), tzinfo=zone)
    except ValueError as exc:
        raise Bad(f"TIMESTAMP {show(text)} is not a valid date-time ({exc})") from None
    return moment.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _row(record: dict) -> dict:
    timestamp = wall_clock(record["TIMESTAMP"])
    n_in = whole(record["ContextTokens"], "ContextTokens", 1)
    n_out = whole(record["GeneratedTokens"], "GeneratedTokens", 0)
    if n_out == 0:
        raise Excluded("logged with no output (GeneratedTokens 0)")
    return {"output_tokens": n_out, "timestamp_s": timestamp, "input_tokens": n_in}


def read(path: Path) -> TraceRead:
    return collect("azure", csv_records(path, COLUMNS), _row)
