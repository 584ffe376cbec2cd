"""The `trace` scenario: a recorded trace, replayed with its own timestamps (or any arrival process).

Prompts are built to the trace's exact token counts: text is encoded with the served model's
tokenizer; a bare count becomes that many seeded token ids; Mooncake `hash_ids` become
shared 512-token blocks (equal ids, equal blocks: the prefix cache sees what the trace saw).
Malformed rows stop the build unless `skip_bad_rows`; skipped and excluded rows are listed
in the workload's notes, never dropped in silence.
"""

from __future__ import annotations

import random

from optimizer.config.workload_spec import TraceSpec
from optimizer.errors import ConfigError
from optimizer.workload.arrivals import closed_concurrency, describe_arrival, offsets
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary
from optimizer.workload.traces import BadRow, TraceRow, read_trace

MOONCAKE_BLOCK = 512
SHOWN_LINES = 5


def _lines(rows: list[BadRow]) -> str:
    shown = "; ".join(f"line {b.line}: {b.reason}" for b in rows[:SHOWN_LINES])
    return shown + (f"; and {len(rows) - SHOWN_LINES} more" if len(rows) > SHOWN_LINES else "")


def _prompt(row: TraceRow, vocab: Vocabulary, seed: int) -> tuple[int, ...]:
    if row.prompt is not None:
        return vocab.encode(row.prompt)
    n = row.input_tokens
    if row.hash_ids:
        ids = tuple(t for h in row.hash_ids for t in vocab.block(f"mooncake-{h}", MOONCAKE_BLOCK))[:n]
        return ids + vocab.random_ids(random.Random(f"{seed}:{row.line}"), n - len(ids))
    return vocab.random_ids(random.Random(f"{seed}:{row.line}"), n)


def _output(row: TraceRow, vocab: Vocabulary, cap: int | None) -> int:
    n = row.output_tokens if row.output_text is None else len(vocab.encode(row.output_text))
    return min(n, cap) if cap else n


def trace_workload(spec: TraceSpec, vocab: Vocabulary) -> Workload:
    read = read_trace(spec.path, spec.format)
    bad = list(read.bad)
    built: list[tuple[TraceRow, tuple[int, ...], int]] = []
    limit = vocab.max_positions
    for row in read.rows:
        if spec.max_requests and len(built) >= spec.max_requests:
            break  # rows past the cut are never built (a 1.4M-row trace stays cheap)
        if limit and row.input_tokens is not None and row.input_tokens + row.output_tokens > limit:
            bad.append(BadRow(row.line, f"{row.input_tokens} + {row.output_tokens} tokens exceed the model's "
                                        f"{limit} positions"))
            continue
        ids, out = _prompt(row, vocab, spec.seed), _output(row, vocab, spec.max_output_tokens)
        if not ids or out < 1:
            bad.append(BadRow(row.line, "prompt encodes to no tokens" if not ids else "reply encodes to no tokens"))
            continue
        if limit and len(ids) + out > limit:
            bad.append(BadRow(row.line, f"{len(ids)} + {out} tokens exceed the model's {limit} positions"))
            continue
        built.append((row, ids, out))
    bad.sort(key=lambda b: b.line)
    if bad and not spec.skip_bad_rows:
        raise ConfigError(f"trace {spec.path}: {len(bad)} malformed rows ({_lines(bad)}); fix them or pass "
                          "--skip-bad-rows to replay the rest")
    if not built:
        raise ConfigError(f"trace {spec.path}: no usable rows; check the file and workload.format")
    notes = []
    if bad:
        notes.append(f"{len(bad)} malformed rows skipped ({_lines(bad)})")
    if read.excluded:
        notes.append(f"{len(read.excluded)} rows left out ({_lines(list(read.excluded))})")
    stamps = [r.timestamp_s for r, _, _ in built]
    if spec.arrival.process == "trace" and any(t is None for t in stamps):
        raise ConfigError(f"trace {spec.path} ({read.format}) has no timestamps; set workload.arrival, "
                          "e.g. {process: poisson, rate: 2}")
    rng = random.Random(spec.seed)
    offs = offsets(spec.arrival, len(built), rng, stamps if spec.arrival.process == "trace" else None)
    reqs = tuple(Request(f"line-{r.line}", ids, out, offs[i]) for i, (r, ids, out) in enumerate(built))
    warm = tuple(Request(f"warmup-{i}", vocab.random_ids(rng, len(built[i % len(built)][1])),
                         built[i % len(built)][2], 0.0) for i in range(spec.warmup_requests))
    return Workload(name="trace", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival),
                    description=f"trace {spec.path} ({read.format}): {len(reqs)} requests, "
                                f"{describe_arrival(spec.arrival)}", notes=tuple(notes))
