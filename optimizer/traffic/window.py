"""The traffic of a time window, as the watched servers counted it: what the daemon tunes on.

A `Window` holds, for [start, end]: the requests finished, the prompt and output length
histograms, the prefix-cache lookups and hits (tokens), the finished requests per sub-window,
the mean number of requests running plus waiting, and the production latency histograms
(TTFT, inter-token, end-to-end). From those:

    rate             arrivals / (end - start); arrivals = the requests finished plus the growth of
                     those running or waiting (vLLM counts finished requests, not arrivals: a
                     server falling behind finishes fewer than arrive)
    saturation()     why the servers are past what they can serve, whichever holds (saturated: any):
                     - the backlog (running + waiting) grew by at least SATURATED_MIN requests and
                       SATURATED_SHARE of the arrivals: they are falling behind;
                     - requests waited (vllm:num_requests_waiting > 0) in at least WAITING_MOST of
                       the reads: a queue that stays full, as it does when clients cap how many
                       requests they keep in flight and the backlog cannot grow;
                     - the median TTFT or queue time is past the TTFT SLO the window is judged
                       against (`ttft_slo_s`, set by the daemon from the study's SLOs)
    rejected         requests the API answered 4xx or 5xx (http_requests_total): never counted by
                     the engine, so neither finished nor in the backlog; `rejected_share` of all
    prompt_lengths() the prompt histogram of the finished requests; when the requests prefilled in
                     the window (TTFT observations, made at the first token) have a mean prompt
                     (vllm:prompt_tokens_total / their count) more than PREFILL_DIFFERS away
                     from it, that histogram's shape scaled to the prefilled mean: a server
                     falling behind finishes the old traffic's requests while it prefills the new
    prefix_hit_rate  hits / queries (None when the servers looked nothing up: caching off)
    burstiness       the gamma shape vLLM's benchmark uses (1 = Poisson, < 1 burstier):
                     1 / D, D = variance / mean of the per-sub-window counts (the index of
                     dispersion; for a renewal process it tends to the squared coefficient of
                     variation of the gaps, 1 / shape). None with fewer than 4 sub-windows.
    production()     p50/p95 TTFT, ITL and E2E in ms, interpolated as histogram_quantile does

`from_polls` builds one from successive /metrics reads of one or more servers (counter and
histogram deltas per server, a restart read as a restart); the Prometheus source builds one
from PromQL. A window is written to and read from a JSON file (`write`, `read`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from optimizer.errors import ConfigError
from optimizer.traffic.exposition import Reading
from optimizer.traffic import lengths
from optimizer.traffic.histogram import Histogram, counter_delta

MIN_SUB_WINDOWS = 4
SATURATED_MIN = 10  # requests: the backlog of a steady server wanders by several (5 in 20 s was seen at 2 req/s)
SATURATED_SHARE = 0.2  # of the window's arrivals
WAITING_MOST = 0.5  # of the window's reads with requests waiting: the queue stood, not a passing burst
PREFILL_DIFFERS = 0.25  # the prefilled requests' mean prompt this far from the finished ones' (relative)
BURSTINESS_RANGE = (0.05, 20.0)  # beyond these a gamma shape is "a burst" or "a metronome"
QUANTILES = (("p50", 0.5), ("p95", 0.95))
LATENCIES = ("ttft", "itl", "e2e", "queue", "tpot")


@dataclass(frozen=True)
class Window:
    source: dict  # {"kind": "vllm_metrics", "urls": [...]} or {"kind": "prometheus", "url", "selector"}
    start: float
    end: float
    requests: float
    prompt: Histogram
    output: Histogram
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    sub_s: float = 0.0
    counts: tuple[float, ...] = ()
    concurrency: float | None = None
    latencies: dict[str, Histogram] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    backlog_growth: float = 0.0  # requests running + waiting at the end, minus at the start
    prompt_tokens: float = 0.0  # prompt tokens prefilled in the window (counted before requests finish)
    waiting_share: float | None = None  # of the reads, those with requests waiting (None: no waiting gauge)
    rejected_4xx: float = 0.0
    rejected_5xx: float = 0.0
    ttft_slo_s: float | None = None  # the TTFT SLO saturation is judged against (None: none given)

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def arrivals(self) -> float:
        """Requests that arrived in the window: finished, plus the growth of those in flight (a
        server falling behind finishes fewer than arrive; vLLM counts no arrivals itself)."""
        return max(self.requests + self.backlog_growth, 0.0)

    @property
    def rate(self) -> float:
        """Arrivals per second."""
        return self.arrivals / self.duration if self.duration > 0 else 0.0

    @property
    def rejected(self) -> float:
        return self.rejected_4xx + self.rejected_5xx

    @property
    def rejected_share(self) -> float:
        """Of the requests sent in the window (arrived or rejected), the share rejected."""
        sent = self.arrivals + self.rejected
        return self.rejected / sent if sent > 0 else 0.0

    def saturation(self) -> list[str]:
        """Each reason the window is saturated, as a phrase (module docstring); empty when it is not."""
        out = []
        if self.backlog_growth >= max(SATURATED_MIN, SATURATED_SHARE * self.arrivals):
            out.append(f"the backlog grew by {self.backlog_growth:.0f}")
        if self.waiting_share is not None and self.waiting_share >= WAITING_MOST:
            out.append(f"requests waited in {self.waiting_share:.0%} of the reads")
        if self.ttft_slo_s is not None:
            for name, what in (("ttft", "TTFT"), ("queue", "queue time")):
                h = self.latencies.get(name)
                median = h.quantile(0.5) if h is not None and h.count > 0 else None
                if median is not None and not math.isnan(median) and median > self.ttft_slo_s:
                    out.append(f"the median {what} ({median * 1000:,.0f} ms) is past the TTFT SLO "
                               f"({self.ttft_slo_s * 1000:,.0f} ms)")
                    break
        return out

    @property
    def saturated(self) -> bool:
        """The servers are past what they can serve (module docstring)."""
        return bool(self.saturation())

    @property
    def prefilled(self) -> float:
        """Requests whose first token came in the window (vLLM's TTFT observations)."""
        ttft = self.latencies.get("ttft")
        return ttft.count if ttft is not None else 0.0

    @property
    def prefill_prompt_mean(self) -> float | None:
        """The mean prompt of the requests prefilled in the window; None when vLLM did not count it."""
        return self.prompt_tokens / self.prefilled if self.prefilled > 0 and self.prompt_tokens > 0 else None

    def prompt_lengths(self) -> tuple[Histogram, str]:
        """The prompt lengths the workload is drawn from, and where they come from (module docstring)."""
        finished, prefilled = self.prompt.mean, self.prefill_prompt_mean
        said = f"the {self.prompt.count:.0f} finished requests"
        if finished is None or prefilled is None or abs(prefilled / finished - 1) <= PREFILL_DIFFERS:
            return self.prompt, said
        scale = prefilled / finished
        bounds = tuple(b * scale for b in self.prompt.bounds)
        return (Histogram(bounds, self.prompt.counts, self.prompt.total * scale),
                f"{said}' shape, scaled x{scale:.2f} to the mean prompt of the {self.prefilled:.0f} requests "
                "prefilled in the window (vllm:prompt_tokens_total, counted before they finish)")

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries > 0 else None

    @property
    def burstiness(self) -> float | None:
        if len(self.counts) < MIN_SUB_WINDOWS:
            return None
        mean = statistics.fmean(self.counts)
        if mean <= 0:
            return None
        dispersion = statistics.variance(self.counts) / mean
        low, high = BURSTINESS_RANGE
        return high if dispersion <= 1 / high else min(max(1 / dispersion, low), high)

    def production(self) -> dict[str, float]:
        """{"ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", ..., "e2e_p95_ms"}: what the watched servers
        measured in this window (histogram interpolation, so within a bucket's width)."""
        out = {}
        for name in LATENCIES:
            h = self.latencies.get(name)
            for label, q in QUANTILES:
                value = h.quantile(q) if h is not None else None
                if value is not None and not math.isnan(value):
                    out[f"{name}_{label}_ms"] = round(value * 1000, 1)
        return out

    def describe(self) -> str:
        hit = self.prefix_hit_rate
        burst = self.burstiness
        return (f"{self.requests:.0f} requests finished in {self.duration:.0f} s ({self.rate:.2f} req/s arriving"
                + (f", burstiness {burst:.2f}" if burst is not None else "")
                + (f"; saturated: {'; '.join(self.saturation())}" if self.saturated else "")
                + (f"; {self.rejected:.0f} rejected ({self.rejected_share:.0%})" if self.rejected else "")
                + "), prompt p50 " + f"{_tokens(lengths.quantile(self.prompt_lengths()[0], 0.5))}, output p50 "
                + f"{_tokens(lengths.quantile(self.output, 0.5))}"
                + (f", prefix-cache hit rate {hit:.0%}" if hit is not None else ""))

    def to_dict(self) -> dict:
        return {"source": self.source, "start": self.start, "end": self.end, "requests": self.requests,
                "prompt": self.prompt.to_dict(), "output": self.output.to_dict(),
                "prefix_queries": self.prefix_queries, "prefix_hits": self.prefix_hits, "sub_s": self.sub_s,
                "counts": list(self.counts), "concurrency": self.concurrency,
                "latencies": {k: h.to_dict() for k, h in self.latencies.items()}, "cache_config": self.cache_config,
                "backlog_growth": self.backlog_growth, "prompt_tokens": self.prompt_tokens,
                "waiting_share": self.waiting_share, "rejected_4xx": self.rejected_4xx,
                "rejected_5xx": self.rejected_5xx, "ttft_slo_s": self.ttft_slo_s,
                "derived": {"rate": self.rate, "arrivals": self.arrivals, "saturated": self.saturated,
                            "saturation": self.saturation(), "rejected_share": self.rejected_share,
                            "burstiness": self.burstiness,
                            "prefix_hit_rate": self.prefix_hit_rate, "production": self.production()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Window":
        return cls(d["source"], float(d["start"]), float(d["end"]), float(d["requests"]),
                   Histogram.from_dict(d["prompt"]), Histogram.from_dict(d["output"]),
                   float(d.get("prefix_queries", 0)), float(d.get("prefix_hits", 0)), float(d.get("sub_s", 0)),
                   tuple(float(c) for c in d.get("counts", ())), d.get("concurrency"),
                   {k: Histogram.from_dict(h) for k, h in (d.get("latencies") or {}).items()},
                   dict(d.get("cache_config") or {}), float(d.get("backlog_growth", 0.0)),
                   float(d.get("prompt_tokens", 0.0)), _optional(d.get("waiting_share")),
                   float(d.get("rejected_4xx", 0.0)), float(d.get("rejected_5xx", 0.0)), _optional(d.get("ttft_slo_s")))


def _optional(value) -> float | None:
    return None if value is None else float(value)


def _tokens(value: lengths.Length | None) -> str:
    return "-" if value is None else f"{value.text()} tokens"


def length_quantiles(h: Histogram) -> dict[str, str]:
    """{"p10", "p50", "p90"} of the fitted lengths (traffic/lengths.py), as text ("-" without any)."""
    return {label: (lambda v: "-" if v is None else v.text())(lengths.quantile(h, q))
            for label, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}


def write(window: Window, path: Path) -> Path:
    """Write the window as JSON (atomically: a reader never sees half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(window.to_dict(), indent=1))
    tmp.replace(path)
    return path


def read(path: str | Path) -> Window:
    """The window a `write` wrote; ConfigError naming the file when it is missing or damaged."""
    p = Path(path)
    try:
        return Window.from_dict(json.loads(p.read_text()))
    except FileNotFoundError as exc:
        raise ConfigError(f"traffic window {p}: no such file; point workload.path at a window the daemon wrote") from exc
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"traffic window {p}: cannot read it ({type(exc).__name__}); "
                          "let the daemon observe the traffic again") from exc


Poll = tuple[float, dict[str, "Reading | None"]]  # (when, {url: its reading, None when the read failed})


def _grow(total: dict, key: str, delta) -> None:
    if key not in total:
        total[key] = delta
    else:
        total[key] = total[key].plus(delta) if key.startswith("h:") else total[key] + delta


def from_polls(polls: list[Poll], source: dict) -> Window | None:
    """The window from the first poll to the last: per server, the sum of the deltas between its
    successive successful reads (a restart counts from zero, never negative). The sub-windows
    (burstiness) are the polls at which every server was read, right after a poll at which every
    server was read too: a delta that spans a missed read would land in one sub-window twice as
    long. Requests in flight: each server's mean over its own reads, summed. None with fewer than
    two polls or without two reads of any server."""
    if len(polls) < 2:
        return None
    last: dict[str, Reading] = {}
    grown: dict = {}
    counts: list[float] = []
    in_flight: dict[str, list[float]] = {}
    waited: list[bool] = []  # per poll with any read: were requests waiting on any server
    cache: dict[str, str] = {}
    whole_before = False
    for i, (_, reads) in enumerate(polls):
        finished = 0.0
        whole = all(r is not None for r in reads.values())
        if any(r is not None and "waiting" in r.gauges for r in reads.values()):
            waited.append(any(r is not None and r.gauges.get("waiting", 0.0) > 0 for r in reads.values()))
        for url, r in reads.items():
            if r is None:
                continue
            in_flight.setdefault(url, []).append(r.gauges.get("running", 0.0) + r.gauges.get("waiting", 0.0))
            cache = cache or r.cache_config
            prev = last.get(url)
            if prev is not None:
                for key, value in r.counters.items():
                    delta = counter_delta(value, prev.counters.get(key))
                    _grow(grown, key, float(delta))
                    finished += delta if key == "requests" else 0.0
                for key, h in r.histograms.items():
                    _grow(grown, "h:" + key, h.since(prev.histograms.get(key)))
            else:
                whole = False  # its first read: nothing to count yet
            last[url] = r
        if i and whole and whole_before:
            counts.append(finished)
        whole_before = whole or (i == 0 and all(r is not None for r in reads.values()))
    if "h:prompt" not in grown:
        return None
    start, end = polls[0][0], polls[-1][0]
    hist = {k[2:]: v for k, v in grown.items() if k.startswith("h:")}
    output = hist.get("output") or Histogram.empty(hist["prompt"].bounds)
    sub_s = (end - start) / (len(polls) - 1)
    return Window(source, start, end, grown.get("requests", hist["prompt"].count), hist["prompt"], output,
                  grown.get("prefix_queries", 0.0), grown.get("prefix_hits", 0.0), sub_s, tuple(counts),
                  sum(statistics.fmean(v) for v in in_flight.values()) if in_flight else None,
                  {k: hist[k] for k in LATENCIES if k in hist}, cache,
                  sum(v[-1] - v[0] for v in in_flight.values()), grown.get("prompt_tokens", 0.0),
                  sum(waited) / len(waited) if waited else None, grown.get("rejected_4xx", 0.0),
                  grown.get("rejected_5xx", 0.0))
