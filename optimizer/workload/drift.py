"""Workload drift: has the traffic changed enough to tune again?

After a study's budget is spent the daemon keeps watching its workload source (a trace file,
or a directory where new trace files appear). This module says what the traffic looks like
(`Shape`: length quantiles, arrival rate, burstiness, and for traffic observed on live servers
the prefix-cache hit rate and the requests in flight), whether two shapes differ beyond a threshold
(`changes`), and which file in the watched path is the current trace (`current_source`,
`fingerprint`). Building workloads and starting studies is the daemon's job, not this one's.

Quantiles of a workload interpolate linearly between closest ranks (`statistics.quantiles` with
method="inclusive", numpy's default); those of an observed window are the quantiles of the
distribution the `observed` workload draws from (traffic/lengths.py), so the line that reports a
change and the workload built on it agree; a quantile the fit cannot place in the top bucket
prints as `>= edge (top bucket)`, never as a bare bucket edge. A length quantile or the rate changed when its
symmetric relative change, max(new/old, old/new) - 1, exceeds the threshold. The prefix-cache
hit rate changed when it moved by more than half the threshold in absolute terms (0.25: 12.5
points). The others are noisier, and the daemon compares every poll, so they get wider bands:
the mean requests in flight changed beyond twice the threshold, a mean below 4 counting as 4
(a mean of a few gauge reads of a small count wanders); burstiness changed when it grew or
shrank more than 4x, and only between estimates that rest on 20 sub-windows or more (on steady
Poisson traffic, two 20-sub-window estimates differ by 4x in 0.3% of comparisons, by 2x in
12%). A quantity one side does not know (None) is not compared. The request count alone is
never a change (a longer trace of the same traffic is the same traffic).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from optimizer.errors import ConfigError, first_line
from optimizer.traffic import lengths
from optimizer.traffic.window import BURSTINESS_RANGE, Window
from optimizer.workload.base import Workload
from optimizer.workload.stats import mean_rate

TRACE_SUFFIXES = (".jsonl", ".json", ".csv")
BURSTINESS_FACTOR = 4.0  # burstiness moved when it changed more than 4x...
BURSTINESS_MIN_SUB_WINDOWS = 20  # ...between estimates resting on at least this many sub-windows
CONCURRENCY_FLOOR = 4.0
_EPS = 1e-9  # a ratio computed from offsets is not exact: "at the threshold" must stay at it


@dataclass(frozen=True)
class Shape:
    """What 'the traffic' looks like, for change detection: request count, length quantiles, rate."""

    requests: int
    input_p10: float  # prompt tokens
    input_p50: float
    input_p90: float
    output_p10: float  # output tokens (Request.max_tokens)
    output_p50: float
    output_p90: float
    rate: float | None  # mean requests/s of an open-loop schedule (inf: all at once); None: closed loop
    burstiness: float | None = None  # gamma shape of the gaps (1 Poisson, < 1 burstier); None: unknown
    prefix_hit_rate: float | None = None  # prefix-cache hits / prompt tokens (observed traffic only)
    concurrency: float | None = None  # requests running + waiting (observed), or a closed loop's
    input_unplaced: float | None = None  # observed: prompts in the top bucket the fit could not place lie above this
    output_unplaced: float | None = None  # the same for outputs

    def to_dict(self) -> dict:
        """Plain JSON values (an Optuna user attribute); an infinite rate is the string "inf"."""
        d = asdict(self)
        if d["rate"] == math.inf:
            d["rate"] = "inf"  # strict JSON has no Infinity
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Shape":
        """The inverse of `to_dict`; raises KeyError when a field is missing."""
        values = {f.name: d[f.name] for f in fields(cls) if f.name not in _OPTIONAL or f.name in d}
        count, rate = int(values.pop("requests")), values.pop("rate")
        return cls(count, **{k: None if v is None else float(v) for k, v in values.items()},
                   rate=None if rate is None else float(rate))

    def describe(self) -> str:
        """One line, e.g. "240 requests, input p50 180 (p10 40, p90 900) tokens, output p50 128, 2.50 req/s"."""
        more = "".join(f", {label} {fmt(v)}" for label, v, fmt in (
            ("burstiness", self.burstiness, lambda x: f"{x:.2f}"),
            ("prefix-cache hit rate", self.prefix_hit_rate, lambda x: f"{x:.0%}"),
            ("in flight", self.concurrency, lambda x: f"{x:.1f}")) if v is not None)
        def length(side: str, q: str) -> str:
            return _length(getattr(self, f"{side}_{q}"), getattr(self, f"{side}_unplaced"))
        return (f"{self.requests} requests, input p50 {length('input', 'p50')} (p10 {length('input', 'p10')}, "
                f"p90 {length('input', 'p90')}) tokens, output p50 {length('output', 'p50')}, {_arrival(self.rate)}"
                + more)


_OPTIONAL = ("burstiness", "prefix_hit_rate", "concurrency", "input_unplaced", "output_unplaced")  # shapes stored before they existed lack them


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 or x == int(x) else f"{x:.1f}"


def _length(x: float, unplaced: float | None) -> str:
    """A length quantile; one the fit could not place inside the top bucket reads `>= edge (top bucket)`."""
    return f">= {_num(x)} (top bucket)" if unplaced is not None and x >= unplaced else _num(x)


def _rate(r: float) -> str:
    return "all at once" if r == math.inf else f"{r:.2f} req/s" if r >= 0.1 else f"{r:.3g} req/s"


def _arrival(rate: float | None) -> str:
    return "closed loop" if rate is None else _rate(rate)


def _quantiles(values: list[int]) -> tuple[float, float, float]:
    if not values:
        return 0.0, 0.0, 0.0
    if len(values) == 1:
        return (float(values[0]),) * 3
    q = statistics.quantiles(values, n=10, method="inclusive")
    return q[0], q[4], q[8]


def shape_of(workload: Workload) -> Shape:
    """The shape of the measured requests (not the warm-up). The rate is taken over requests
    without `after` (agent follow-ups wait for a reply, their offset is a delay); None for a
    closed loop or when fewer than two such requests remain; inf when they all start at once."""
    reqs = workload.requests
    inp = _quantiles([len(r.prompt_token_ids) for r in reqs])
    out = _quantiles([r.max_tokens for r in reqs])
    roots = [r.offset_s for r in reqs if r.after is None]
    rate = mean_rate(roots) if workload.concurrency is None and len(roots) >= 2 else None
    return Shape(len(reqs), *inp, *out, rate, burstiness=_gap_shape(sorted(roots)) if rate else None,
                 concurrency=workload.concurrency)


def _gap_shape(offsets: list[float]) -> float | None:
    """1 / CV^2 of the gaps between arrivals (a gamma shape; clamped to BURSTINESS_RANGE); None
    with fewer than BURSTINESS_MIN_SUB_WINDOWS gaps or all at once."""
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    if len(gaps) < BURSTINESS_MIN_SUB_WINDOWS or statistics.fmean(gaps) <= 0:
        return None
    cv2 = statistics.variance(gaps) / statistics.fmean(gaps) ** 2
    low, high = BURSTINESS_RANGE
    return high if cv2 <= 1 / high else min(max(1 / cv2, low), high)


def shape_of_window(window: Window) -> Shape:
    """The shape of traffic observed on live servers: length quantiles of the distribution the
    `observed` workload draws from (traffic/lengths.py; never a bare bucket edge), the rate and
    prefix-cache hit rate of the window, the mean requests in flight, and its burstiness when it
    rests on BURSTINESS_MIN_SUB_WINDOWS sub-windows or more."""
    sides = {}
    for side, h in (("input", window.prompt_lengths()[0]), ("output", window.output)):
        got = [lengths.quantile(h, p) for p in (0.1, 0.5, 0.9)]
        sides[side] = [0.0 if g is None else g.value for g in got]
        edges = [g.value for g in got if g is not None and g.unplaced]
        sides[side + "_unplaced"] = min(edges) if edges else None
    return Shape(round(window.requests), *sides["input"], *sides["output"], window.rate,
                 burstiness=window.burstiness if len(window.counts) >= BURSTINESS_MIN_SUB_WINDOWS else None,
                 prefix_hit_rate=window.prefix_hit_rate, concurrency=window.concurrency,
                 input_unplaced=sides["input_unplaced"], output_unplaced=sides["output_unplaced"])


def _moved(old: float, new: float, threshold: float) -> bool:
    if old == new:
        return False
    if min(old, new) <= 0 or max(old, new) == math.inf:
        return True  # 0 -> anything or finite <-> all at once: no ratio, always a change
    return max(new / old, old / new) - 1 > threshold + _EPS


def _factor(old: float, new: float) -> str:
    return f" (x{new / old:.2f})" if 0 < old < math.inf and new < math.inf else ""


def changes(old: Shape, new: Shape, threshold: float = 0.25) -> list[str]:
    """What moved beyond `threshold` (a symmetric relative change) from `old` to `new`, one
    readable entry each, e.g. "input p50 180 -> 720 tokens (x4.00)"; empty: the same traffic.
    Compares the input and output p10/p50/p90 and the rate (a switch between open and closed
    loop is a change), then burstiness, prefix-cache hit rate and concurrency where both sides
    know them. The request count is not compared."""
    out = []
    for side in ("input", "output"):
        for q in ("p10", "p50", "p90"):
            a, b = getattr(old, f"{side}_{q}"), getattr(new, f"{side}_{q}")
            if _moved(a, b, threshold):
                was, now = getattr(old, f"{side}_unplaced"), getattr(new, f"{side}_unplaced")
                out.append(f"{side} {q} {_length(a, was)} -> {_length(b, now)} tokens"
                           + ("" if was is not None or now is not None else _factor(a, b)))
    a, b = old.rate, new.rate
    if (a is None) != (b is None):
        out.append(f"arrival {_arrival(a)} -> {_arrival(b)}")
    elif a is not None and _moved(a, b, threshold):
        out.append(f"rate {_rate(a).removesuffix(' req/s')} -> {_rate(b)}{_factor(a, b)}")
    return out + _live_changes(old, new, threshold)


def _live_changes(old: Shape, new: Shape, threshold: float) -> list[str]:
    out = []
    a, b = old.burstiness, new.burstiness
    if a is not None and b is not None and _moved(a, b, BURSTINESS_FACTOR - 1):
        out.append(f"burstiness {a:.2f} -> {b:.2f}{_factor(a, b)}")
    a, b = old.prefix_hit_rate, new.prefix_hit_rate
    if a is not None and b is not None and abs(a - b) > threshold / 2 + _EPS:
        out.append(f"prefix-cache hit rate {a:.0%} -> {b:.0%}")
    a, b = old.concurrency, new.concurrency
    floor = CONCURRENCY_FLOOR
    if a is not None and b is not None and _moved(max(a, floor), max(b, floor), 2 * threshold):
        out.append(f"in flight {a:.1f} -> {b:.1f}{_factor(max(a, floor), max(b, floor))}")
    return out


def _settled(entry: Path, settle_s: float, now: float) -> tuple[int, str] | None:
    """(mtime_ns, name) of a trace file old enough to be complete; None to skip it."""
    if entry.name.startswith(".") or entry.suffix not in TRACE_SUFFIXES:
        return None
    try:
        if not entry.is_file():
            return None
        mtime_ns = entry.stat().st_mtime_ns
    except OSError:  # removed between the listing and the stat
        return None
    return (mtime_ns, entry.name) if now - mtime_ns / 1e9 >= settle_s else None


def current_source(watch: str | Path, settle_s: float = 2.0, now: float | None = None) -> Path | None:
    """The trace file to build the workload from. A file: that file. A directory: its newest
    regular file (by mtime, ties by name) with a suffix in TRACE_SUFFIXES, skipping hidden files
    and files modified less than `settle_s` before `now` (still being written); None if there
    is none. Raises ConfigError when `watch` does not exist or cannot be listed."""
    path = Path(watch).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        what = "no such file or directory" if not path.exists() else "not a file or a directory"
        raise ConfigError(f"watch {path}: {what}; give a trace file or a directory where trace files appear")
    now = time.time() if now is None else now
    try:
        entries = list(path.iterdir())
    except OSError as exc:
        raise ConfigError(f"watch {path}: cannot list it ({first_line(exc)}); check its permissions") from exc
    keyed = [(key, e) for e in entries if (key := _settled(e, settle_s, now)) is not None]
    return max(keyed, key=lambda ke: ke[0])[1] if keyed else None


def fingerprint(path: Path) -> str:
    """"<resolved path>:<size>:<mtime_ns>": changes when the file is replaced or appended to.
    Raises OSError when the file is gone."""
    path = Path(path).resolve()
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"
