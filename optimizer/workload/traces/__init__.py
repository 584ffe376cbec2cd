"""Trace importers: read a public or hand-written request trace into `TraceRow`s.

    sharegpt   JSON array of conversations: prompt text + reply text, no timestamps
    burstgpt   CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`
    azure      CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (wall-clock times)
    mooncake   JSONL `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
    jsonl      generic JSONL: `timestamp`, `prompt` or `input_tokens`, `output_tokens`

One module per format, each with `read(path) -> TraceRead`; `detect` names the format
from the file's content and `read_trace` is the entry point. Malformed rows are returned
as `BadRow`s with line numbers, never dropped silently; a file that cannot be used at all
raises `TraceError` (one line). Field by field: examples/traces/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from optimizer.errors import first_line
from optimizer.workload.traces import azure, burstgpt, jsonl, mooncake, sharegpt
from optimizer.workload.traces.base import BadRow, TraceError, TraceRead, TraceRow

FORMATS = {"sharegpt": sharegpt.read, "burstgpt": burstgpt.read, "azure": azure.read,
           "mooncake": mooncake.read, "jsonl": jsonl.read}
_NAMES = ", ".join(FORMATS)


def _head(path: Path) -> str:
    """The file's first 64 KiB without leading blanks; for JSONL, at least its whole first line."""
    try:
        with path.open(encoding="utf-8-sig") as f:
            text = f.read(1 << 16).lstrip()
            if text.startswith("{") and "\n" not in text:  # never a whole one-line ShareGPT file
                text += f.readline()
            return text
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace {path}: cannot read it ({first_line(exc)}); check the path") from exc


def detect(path) -> str:
    """The format of the trace at `path`, by content: '[' ShareGPT, a CSV header, or JSONL."""
    path = Path(path)
    text = _head(path)
    if not text.strip():
        raise TraceError(f"trace {path}: the file is empty")
    if text.startswith("["):
        return "sharegpt"
    first = text.split("\n", 1)[0].strip()
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):  # a bad first line: the JSONL reader reports it
            obj = None
        return "mooncake" if isinstance(obj, dict) and "hash_ids" in obj else "jsonl"
    header = [name.strip().strip('"') for name in first.split(",")]
    if "Request tokens" in header:
        return "burstgpt"
    if "ContextTokens" in header:
        return "azure"
    raise TraceError(f"trace {path}: unknown format; set workload.format to one of {_NAMES}")


def read_trace(path, fmt: str = "auto") -> TraceRead:
    """Read the trace at `path` in format `fmt` ("auto": `detect` it); at least one usable row."""
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; set workload.format to auto or one of {_NAMES}")
    if not path.exists():
        raise TraceError(f"trace {path}: no such file; check the path")
    if path.is_dir():
        raise TraceError(f"trace {path}: is a directory; give the path of the trace file")
    name = detect(path) if fmt == "auto" else fmt
    got = FORMATS[name](path)
    if not got.rows:
        first = (f"; first: line {got.bad[0].line}: {got.bad[0].reason}" if got.bad else
                 f"; first excluded: line {got.excluded[0].line}: {got.excluded[0].reason}" if got.excluded else "")
        raise TraceError(f"trace {path}: no usable rows as {name} ({len(got.bad)} malformed, "
                         f"{len(got.excluded)} excluded){first}")
    return got


__all__ = ["FORMATS", "detect", "read_trace", "TraceRow", "BadRow", "TraceRead", "TraceError"]
