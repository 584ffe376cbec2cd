"""Mooncake (JSONL): `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}`.

`timestamp_s` is timestamp / 1000 (the trace counts milliseconds), `input_tokens` is
input_length (>= 1), `output_tokens` is output_length (>= 1), `hash_ids` the tuple of ids.
Each id names one 512-token block of the prompt, in order; equal leading ids mean a
shared prefix. A row is malformed unless len(hash_ids) == ceil(input_length / 512): the
public traces obey this exactly in every row checked (kvcache-ai/Mooncake
FAST25-release/traces/conversation_trace.jsonl and synthetic_trace.jsonl, and the first
release's mooncake_trace.jsonl: 6758 tokens -> 14 ids, 2752 -> 6, 28 -> 1, 40160 -> 79),
so a count that disagrees means another block size or a damaged line. All four keys are
required and any other key is malformed (a derived format's extra fields would otherwise
be dropped silently). Blank lines are skipped; line numbers are the file's.
"""

from __future__ import annotations

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
from optimizer.workload.traces.base import TraceRead

BLOCK_TOKENS = 512
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _row(obj) -> dict:
    obj = fields(obj, KEYS, KEYS)
    timestamp = seconds(obj["timestamp"], "timestamp") / 1000
    n_in = whole(obj["input_length"], "input_length", 1)
    n_out = whole(obj["output_length"], "output_length", 1)
    if not isinstance(obj["hash_ids"], list):
        raise Bad(f"hash_ids is not a list: {show(obj['hash_ids'])}")
    ids = tuple(whole(h, f"hash_ids[{i}]", 0) for i, h in enumerate(obj["hash_ids"]))
    blocks = -(-n_in // BLOCK_TOKENS)
    if len(ids) != blocks:
        plural = "" if len(ids) == 1 else "s"
        raise Bad(f"hash_ids has {len(ids)} id{plural}, but input_length {n_in} is {blocks} blocks "
                  f"of {BLOCK_TOKENS} tokens (one id per block)")
    return {"output_tokens": n_out, "timestamp_s": timestamp, "input_tokens": n_in, "hash_ids": ids}


def read(path: Path) -> TraceRead:
    return collect("mooncake", json_lines(path), _row)
