"""ShareGPT (JSON): an array of `{"id", "conversations": [{"from", "value"}, ...]}`.

Each entry gives one row, from its first "human" turn that is directly followed by a "gpt"
turn: `prompt` is the human text and `output_text` the reply. ShareGPT has no token counts
and no timestamps, so `output_tokens` is 0 and `timestamp_s` is None: the caller tokenizes
`output_text` with the served model's tokenizer to get the output length. `line` is the
entry's index in the array + 1. Later turns are not replayed (one request per entry).
"""

from __future__ import annotations

import json
from pathlib import Path

from optimizer.errors import first_line
from optimizer.workload.traces._fields import Bad, collect, read_text
from optimizer.workload.traces.base import TraceError, TraceRead


def _pair(turns: list) -> tuple[str, str]:
    roles = [t.get("from") if isinstance(t, dict) else None for t in turns]
    for i in range(len(turns) - 1):
        if roles[i] == "human" and roles[i + 1] == "gpt":
            prompt, reply = turns[i].get("value"), turns[i + 1].get("value")
            if not isinstance(prompt, str) or not isinstance(reply, str):
                raise Bad(f"turns {i + 1} and {i + 2}: 'value' must be text")
            return prompt, reply
    raise Bad("no 'human' turn followed by a 'gpt' turn")


def _row(entry) -> dict:
    if not isinstance(entry, dict):
        raise Bad(f"not a JSON object (a {type(entry).__name__})")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        raise Bad("no 'conversations' list")
    prompt, reply = _pair(turns)
    if not prompt.strip():
        raise Bad("empty prompt (the human turn has no text)")
    if not reply.strip():
        raise Bad("empty reply (the gpt turn has no text, so no output length)")
    return {"output_tokens": 0, "prompt": prompt, "output_text": reply}


def read(path: Path) -> TraceRead:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise TraceError(f"trace {path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                         f"a ShareGPT trace is one JSON array") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise TraceError(f"trace {path}: not usable JSON ({first_line(exc, 80)})") from exc
    if not isinstance(data, list):
        raise TraceError(f"trace {path}: a ShareGPT trace is a JSON array of conversations, "
                         f"this file holds a JSON {type(data).__name__}")
    return collect("sharegpt", enumerate(data, 1), _row)
