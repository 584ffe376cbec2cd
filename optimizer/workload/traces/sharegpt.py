"""ShareGPT (JSON): an array of `{"id", "conversations": [{"from", "value"}, ...]}`.

Each entry gives one row, from its first "human" turn that is directly followed by a "gpt"
turn: `prompt` is the human text and `output_text` the reply. ShareGPT has no token counts
and no timestamps, so `output_tokens` is 0 and `timestamp_s` is None: the caller tokenizes
`output_text` with the served model's tokenizer to get the output length. `line` is the
entry's index in the array + 1. Later turns are not replayed (one request per entry).

An entry that is well formed but is no request to replay goes to `excluded`, as BurstGPT's
failed requests do: no turns, a human turn with no gpt answer after it (a single turn, or a
conversation cut after a question), no human turn at all, or an empty prompt or reply. Only
an entry of the wrong shape (not an object, no `conversations` list, a turn that is not an
object or whose `from` or `value` is not text) is malformed.
"""

from __future__ import annotations

import json
from pathlib import Path

from optimizer.errors import first_line
from optimizer.workload.traces._fields import Bad, Excluded, collect, read_text, show
from optimizer.workload.traces.base import TraceError, TraceRead


def _pair(turns: list) -> tuple[str, str]:
    roles = [t.get("from") if isinstance(t, dict) else None for t in turns]
    for i in range(len(turns) - 1):
        if roles[i] == "human" and roles[i + 1] == "gpt":
            prompt, reply = turns[i].get("value"), turns[i + 1].get("value")
            if not isinstance(prompt, str) or not isinstance(reply, str):
                raise Bad(f"turns {i + 1} and {i + 2}: 'value' must be text")
            return prompt, reply
    for i, turn in enumerate(turns, 1):  # no pair: a conversation of the wrong shape is malformed...
        if not isinstance(turn, dict):
            raise Bad(f"turn {i}: not a JSON object (a {type(turn).__name__})")
        if not isinstance(turn.get("from"), str) or not isinstance(turn.get("value"), str):
            raise Bad(f"turn {i}: 'from' and 'value' must be text, got {show(turn.get('from'))} and "
                      f"{show(turn.get('value'))}")
    if not turns:  # ...a well-formed one is simply no request to replay
        raise Excluded("no turns (an empty conversation)")
    if len(turns) == 1 and roles[0] == "human":
        raise Excluded("a single 'human' turn with no 'gpt' answer, so no output length")
    if "human" in roles:
        raise Excluded("no 'human' turn is followed by a 'gpt' answer, so no output length")
    raise Excluded(f"no 'human' turn (its turns are from: {', '.join(dict.fromkeys(roles))}), so no prompt")


def _row(entry) -> dict:
    if not isinstance(entry, dict):
        raise Bad(f"not a JSON object (a {type(entry).__name__})")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        raise Bad("no 'conversations' list")
    prompt, reply = _pair(turns)
    if not prompt.strip():
        raise Excluded("empty prompt (the human turn has no text)")
    if not reply.strip():
        raise Excluded("empty reply (the gpt turn has no text, so no output length)")
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
