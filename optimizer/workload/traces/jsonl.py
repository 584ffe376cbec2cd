"""The generic JSONL trace: one object per line, the format to write your own traces in.

Keys: `output_tokens` (int >= 1, required); exactly one of `prompt` (non-empty text,
tokenized with the served model's tokenizer) or `input_tokens` (int >= 1); `timestamp`
(seconds, >= 0, any origin; optional, but given on every row or on none: the first
usable row decides, a row that disagrees is malformed). Any other key is malformed, so a
typo is reported rather than ignored. Blank lines are skipped; line numbers are the
file's. The user-facing spec is examples/traces/README.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from optimizer.workload.traces._fields import (
    Bad,
    collect,
    fields,
    json_lines,
    seconds,
    show,
    whole,
)
from optimizer.workload.traces.base import BadRow, TraceRead

KEYS = ("timestamp", "prompt", "input_tokens", "output_tokens")


def _row(obj) -> dict:
    obj = fields(obj, KEYS, ("output_tokens",))
    row = {"output_tokens": whole(obj["output_tokens"], "output_tokens", 1)}
    if ("prompt" in obj) == ("input_tokens" in obj):
        raise Bad("give exactly one of 'prompt' (text) or 'input_tokens' (a count)")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise Bad(f"prompt must be non-empty text, got {show(obj['prompt'])}")
        row["prompt"] = obj["prompt"]
    else:
        row["input_tokens"] = whole(obj["input_tokens"], "input_tokens", 1)
    if "timestamp" in obj:
        row["timestamp_s"] = seconds(obj["timestamp"], "timestamp")
    return row


def read(path: Path) -> TraceRead:
    got = collect("jsonl", json_lines(path), _row)
    if not got.rows:
        return got
    first = got.rows[0]
    timed = first.timestamp_s is not None
    odd = {r.line for r in got.rows if (r.timestamp_s is not None) != timed}
    if not odd:
        return got
    why = (f"no timestamp, but line {first.line} has one (give it on every row or on none)" if timed
           else f"has a timestamp, but line {first.line} has none (give it on every row or on none)")
    bad = sorted(got.bad + tuple(BadRow(line, why) for line in odd), key=lambda b: b.line)
    return replace(got, rows=tuple(r for r in got.rows if r.line not in odd), bad=tuple(bad))
