"""Knobs written as text ('kv-cache-dtype=fp8 max-num-seqs=32', as `regress --candidate` and
`sensitivity --to` take them) -> parameters typed as the search space types each knob. A name
that is not exactly a knob's is refused (config/space.py, Knobs.named), never passed to vLLM.
"""

from __future__ import annotations

import json

from optimizer.config.flags import from_cli_args
from optimizer.config.space import KNOBS
from optimizer.engine import speculative_config as speculation
from optimizer.errors import ConfigError


def parse_candidate(text: str, flag: str = "--candidate") -> dict:
    """'kv-cache-dtype=fp8 max-num-seqs=32' -> {'kv-cache-dtype': 'fp8', 'max-num-seqs': 32}: typed as
    the space types each knob (true/false for an on/off knob); raises ConfigError naming `flag`."""
    out = {}
    for item in _items(text):
        key, eq, value = item.removeprefix("--").partition("=")
        if not eq or not key or not value:
            raise ConfigError(f"{flag} '{text}': '{item}' is not knob=value; write e.g. 'kv-cache-dtype=fp8'")
        out[key] = _typed(key, value, f"{flag} '{text}'")
    if not out:
        raise ConfigError(f"{flag} '': give the knobs that differ from the baseline, e.g. 'kv-cache-dtype=fp8'")
    return out


def _items(text: str) -> list[str]:
    """'a=1, b=2' -> ['a=1', 'b=2']; a value that opens with '{' is one JSON object, spaces and commas
    inside it included (speculative-config='{"method": "ngram", ...}')."""
    items, i, seps = [], 0, " ,\t\n"
    while i < len(text):
        if text[i] in seps:
            i += 1
            continue
        j = i
        while j < len(text) and text[j] not in seps and text[j] != "=":
            j += 1
        if text[j:j + 2] == "={":
            try:
                obj, end = json.JSONDecoder().raw_decode(text, j + 1)
                items.append(text[i:j + 1] + json.dumps(obj))
                i = end
                continue
            except ValueError:
                pass  # not JSON after all: the value runs to the next separator, and is judged as such
        while j < len(text) and text[j] not in seps:
            j += 1
        items.append(text[i:j])
        i = j
    return items


def _typed(key: str, value: str, where: str):
    knob = KNOBS.named(key, where)
    if key == speculation.KNOB:
        return speculation.choice(value, where)  # "off" or a config vLLM can start
    if knob.kind == "bool":
        if value.lower() not in BOOLS:
            raise ConfigError(f"{where}: {key} is on or off; write {key}=true or {key}=false")
        return BOOLS[value.lower()]
    try:
        return from_cli_args([f"--{key}", value])[key]
    except ValueError:
        raise ConfigError(f"{where}: {key}={value} is not a {'whole number' if knob.kind == 'int' else 'number'}"
                          f"; write e.g. {key}={'32' if knob.kind == 'int' else '0.5'}") from None


BOOLS = {"true": True, "on": True, "1": True, "yes": True, "false": False, "off": False, "0": False, "no": False}
