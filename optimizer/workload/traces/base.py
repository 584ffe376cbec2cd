"""What a trace reader returns: rows with line numbers, and the malformed rows it found.

A reader never drops a row silently: every line it cannot use becomes a `BadRow` with its
line number and the reason, and the caller decides (refuse, or skip with `--skip-bad-rows`
and report them).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ConfigError


class TraceError(ConfigError):
    """The trace cannot be used at all: unreadable file, unknown format, no usable rows."""


@dataclass(frozen=True)
class TraceRow:
    line: int  # 1-based line (JSONL/CSV) or array index + 1 (ShareGPT JSON)
    output_tokens: int
    timestamp_s: float | None = None  # seconds, any origin (the replay starts at the first)
    input_tokens: int | None = None  # a token count (BurstGPT, Azure, Mooncake, generic JSONL)
    prompt: str | None = None  # text to tokenize with the served model's tokenizer (ShareGPT, JSONL)
    output_text: str | None = None  # ShareGPT: the reply, tokenized for the output length
    hash_ids: tuple[int, ...] = ()  # Mooncake: 512-token blocks, equal ids = shared prefix


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str


@dataclass(frozen=True)
class TraceRead:
    format: str
    rows: tuple[TraceRow, ...]
    bad: tuple[BadRow, ...]
    excluded: tuple[BadRow, ...] = ()  # well formed, not replayable (a failed request, an unanswered turn), reported
