"""The `trace` scenario: a recorded trace, replayed with its own timestamps (or any arrival process).

Prompts are built to the trace's exact token counts: text is encoded with the served model's
tokenizer; a bare count becomes that many seeded token ids; Mooncake `hash_ids` become
shared 512-token blocks (equal ids, equal blocks: the prefix cache sees what the trace saw).
Malformed rows stop the build unless `skip_bad_rows`; rows that are well formed but no
request to replay (a failed request, a question with no answer) are left out and never stop
it. Both are listed in the workload's notes, every one of them by line (ShareGPT: by entry)
in a compact form ("entries 3, 7, 12-15"), never dropped in silence.
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
_PLURAL = {"line": "lines", "entry": "entries"}  # a ShareGPT row is an entry of its array


def _lines(rows: list[BadRow]) -> str:
    shown = "; ".join(f"line {b.line}: {b.reason}" for b in rows[:SHOWN_LINES])
    return shown + (f"; and {len(rows) - SHOWN_LINES} more" if len(rows) > SHOWN_LINES else "")


def spans(numbers) -> str:
    """Sorted numbers with runs folded: [3, 7, 12, 13, 14, 15] -> "3, 7, 12-15"."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _count(n: int, unit: str) -> str:
    return unit if n == 1 else _PLURAL[unit]


def _named(rows: list[BadRow], unit: str) -> str:
    """Every row's number, in one compact list: "lines 3, 7, 12-15" (one: "line 3")."""
    return f"{_count(len(rows), unit)} {spans(b.line for b in rows)}"


def skipped_note(bad: list[BadRow]) -> str:
    """The note for malformed rows skipped with --skip-bad-rows: the first few with their reasons,
    and when there are more, every line named."""
    note = f"{len(bad)} malformed rows skipped ({_lines(bad)})"
    return note + (f"; all of them: {_named(bad, 'line')}" if len(bad) > SHOWN_LINES else "")


def left_out_note(excluded: list[BadRow], unit: str) -> str:
    """The note for rows that are no request to replay, grouped by reason, every row named:
    "3 entries left out, not replayable: entries 4, 9-10: a single 'human' turn with no 'gpt'
    answer, so no output length"."""
    groups: dict[str, list[BadRow]] = {}
    for b in excluded:
        groups.setdefault(b.reason, []).append(b)
    return (f"{len(excluded)} {_count(len(excluded), unit)} left out, not replayable: "
            + "; ".join(f"{_named(rows, unit)}: {reason}" for reason, rows in groups.items()))


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


GAP_FACTOR = 10_000  # a gap this many times the trace's median gap...
GAP_FLOOR_S = 86_400.0  # ...and longer than a day is a timestamp in another unit or origin, not a night's lull


def _check_gaps(path, stamps: list[tuple[int, float]]) -> None:
    """Refuse a trace whose largest gap between consecutive timestamps (in time order) is past
    GAP_FACTOR x its median gap and GAP_FLOOR_S: one epoch time among relative ones would
    otherwise have the replay sleep for decades. The line names the row after the gap."""
    ordered = sorted(stamps, key=lambda s: s[1])
    gaps = [(b[1] - a[1], b[0]) for a, b in zip(ordered, ordered[1:])]
    if len(gaps) < 2:
        return
    positive = sorted(g for g, _ in gaps if g > 0)
    median = positive[len(positive) // 2] if positive else 0.0
    gap, line = max(gaps)
    if gap > GAP_FLOOR_S and gap > GAP_FACTOR * max(median, 1e-3):
        raise ConfigError(f"trace {path}: line {line}'s timestamp comes {gap:,.0f} s after the one before it "
                          f"(the trace's median gap is {median:.3g} s): a timestamp in another unit or from "
                          "another origin (an epoch time among relative ones?); fix or remove that row")


def trace_workload(spec: TraceSpec, vocab: Vocabulary) -> Workload:
    read = read_trace(spec.path, spec.format)
    bad = list(read.bad)
    built: list[tuple[TraceRow, tuple[int, ...], int]] = []
    limit = vocab.max_positions
    cut = None  # the line of the first row past max_requests: excluded rows from there on are not left out
    for row in read.rows:
        if spec.max_requests and len(built) >= spec.max_requests:
            cut = row.line
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
        notes.append(skipped_note(bad))
    excluded = [b for b in read.excluded if cut is None or b.line < cut]
    if excluded:
        notes.append(left_out_note(excluded, "entry" if read.format == "sharegpt" else "line"))
    stamps = [r.timestamp_s for r, _, _ in built]
    if spec.arrival.process == "trace" and any(t is None for t in stamps):
        raise ConfigError(f"trace {spec.path} ({read.format}) has no timestamps; set workload.arrival, "
                          "e.g. {process: poisson, rate: 2}")
    if spec.arrival.process == "trace":
        _check_gaps(spec.path, [(r.line, r.timestamp_s) for r, _, _ in built])
    rng = random.Random(spec.seed)
    offs = offsets(spec.arrival, len(built), rng, stamps if spec.arrival.process == "trace" else None)
    reqs = tuple(Request(f"line-{r.line}", ids, out, offs[i]) for i, (r, ids, out) in enumerate(built))
    warm = tuple(Request(f"warmup-{i}", vocab.random_ids(rng, len(built[i % len(built)][1])),
                         built[i % len(built)][2], 0.0) for i in range(spec.warmup_requests))
    return Workload(name="trace", requests=reqs, warmup=warm, concurrency=closed_concurrency(spec.arrival),
                    description=f"trace {spec.path} ({read.format}): {len(reqs)} requests, "
                                f"{describe_arrival(spec.arrival)}", notes=tuple(notes))
