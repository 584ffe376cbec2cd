"""BurstGPT (CSV): `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.

Columns are found by header name (the 8-column release with `Session ID` and `Elapsed
time` reads too); `Timestamp`, `Request tokens` and `Response tokens` are required, the
others are not read. `timestamp_s` is Timestamp (seconds from the log's start),
`input_tokens` is Request tokens (>= 1), `output_tokens` is Response tokens. BurstGPT logs a
failed request with Response tokens 0: such a row is well formed but not replayable, so it
goes to `excluded`, not `bad`. Line numbers are the file's (the header is line 1).
"""

from __future__ import annotations

from pathlib import Path

from optimizer.workload.traces._fields import (
    Excluded,
    collect,
    csv_records,
    seconds,
    whole,
)
from optimizer.workload.traces.base import TraceRead

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def _row(record: dict) -> dict:
    timestamp = seconds(record["Timestamp"], "Timestamp")
    n_in = whole(record["Request tokens"], "Request tokens", 1)
    n_out = whole(record["Response tokens"], "Response tokens", 0)
    if n_out == 0:
        raise Excluded("logged as a failure (Response tokens 0)")
    return {"output_tokens": n_out, "timestamp_s": timestamp, "input_tokens": n_in}


def read(path: Path) -> TraceRead:
    return collect("burstgpt", csv_records(path, COLUMNS), _row)
