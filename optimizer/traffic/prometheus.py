"""The `prometheus` traffic source: a Prometheus server that scrapes the vLLM fleet, asked over
its HTTP API (`/api/v1/query`, `/api/v1/query_range`) for the last `window_s` seconds of the
series a label selector picks, e.g. `{job="vllm", model_name="llama"}`:

    requests        sum(increase(vllm:request_success_total{S}[W])), and the same of
                    vllm:prompt_tokens_total (prompt tokens counted at prefill)
    histograms      sum by (instance, le) (increase(<name>_bucket{S}[W])) and of <name>_sum, added
                    up across servers on the bucket bounds they share
    prefix cache    sum(increase(vllm:prefix_cache_{queries,hits}_total{S}[W]))
    concurrency     avg_over_time((sum(vllm:num_requests_running{S}) + sum(vllm:num_requests_waiting{S}))[W:step]),
                    and the same sum at the window's end minus at its start (the backlog's growth)
    waiting share   avg_over_time((sum(vllm:num_requests_waiting{S}) > bool 0)[W:step]): the share of
                    the window's steps with requests waiting
    rejected        sum(increase(http_requests_total{S, method="POST", handler=~"/v1/.*", status="4xx"}[W]))
                    and the same of "5xx" (the API server's own counter, which has no model_name
                    label: a model_name matcher in S is left out of this one query)
    sub-windows     sum(increase(vllm:request_success_total{S}[step])) over [now - W, now] by step
    cache config    vllm:cache_config_info{S}

`increase()` handles counter resets (a restarted server) and extrapolates to the window's edges,
so counts are not whole numbers; a step of a few scrape intervals or more keeps the sub-window
counts from being mostly extrapolation. Quantiles are then taken as histogram_quantile takes
them (traffic/histogram.py). The daemon only queries; it never writes to Prometheus.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse

from optimizer.errors import ConfigError
from optimizer.traffic.exposition import COUNTERS, GAUGES, HISTOGRAMS, HTTP, REJECTED
from optimizer.traffic.histogram import Histogram
from optimizer.traffic.scrape import SourceError, http_get
from optimizer.traffic.window import LATENCIES, Window

TIMEOUT_S = 10.0


def check_selector(selector: str) -> str:
    """The selector as given ("" for none); ConfigError unless it is `{...}`."""
    s = (selector or "").strip()
    if s and not (s.startswith("{") and s.endswith("}")):
        raise ConfigError(f"daemon.watch.selector {selector!r} is not a label selector; "
                          "write it in braces, e.g. '{job=\"vllm\"}'")
    return s


class PrometheusSource:
    kind = "prometheus"

    def __init__(self, url: str, selector: str, window_s: float, step_s: float, timeout_s: float = TIMEOUT_S):
        self.url, self.selector = url.rstrip("/"), check_selector(selector)
        self.window_s, self.step_s, self.timeout_s = window_s, step_s, timeout_s
        self._last: Window | None = None

    @property
    def source(self) -> dict:
        return {"kind": self.kind, "url": self.url, "selector": self.selector}

    def describe(self) -> str:
        return f"Prometheus {self.url} {self.selector or '(all series)'}"

    def _m(self, name: str) -> str:
        return f"{name}{self.selector}"

    def _http(self, status: str) -> str:
        """The API server's counter of inference requests answered `status`, under the selector's target
        labels: it carries no model_name (vLLM's engine series do), so a model_name matcher is left out."""
        kept = re.sub(r',?\s*model_name\s*(=~|!~|!=|=)\s*"[^"]*"', "", self.selector[1:-1] if self.selector else "")
        inner = kept.strip().strip(",").strip()
        return f"{HTTP}_total{{{inner + ', ' if inner else ''}{_rejected(status)}}}"

    def _api(self, path: str, **params) -> list:
        query = urllib.parse.urlencode(params)
        body = http_get(f"{self.url}{path}?{query}", self.timeout_s, "a Prometheus server", named=self.url)
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise SourceError(f"{self.url} answers but not as Prometheus' HTTP API (no JSON); "
                              "point daemon.watch.prometheus at http://<host>:9090") from exc
        if not isinstance(answer, dict) or answer.get("status") != "success":
            why = answer.get("error", "no reason given") if isinstance(answer, dict) else "not an API answer"
            raise SourceError(f"{self.url}: Prometheus refused {params.get('query')!r} ({why}); "
                              "check daemon.watch.selector")
        result = (answer.get("data") or {}).get("result") if isinstance(answer.get("data"), dict) else None
        if not isinstance(result, list):
            raise SourceError(f"{self.url} answers but not as Prometheus' HTTP API (no data.result); "
                              "point daemon.watch.prometheus at http://<host>:9090")
        return result

    def _scalar(self, query: str, at: float) -> float:
        result = self._api("/api/v1/query", query=query, time=f"{at:.3f}")
        value = float(result[0]["value"][1]) if result else 0.0
        return 0.0 if math.isnan(value) else value

    def _histogram(self, name: str, w: str, at: float) -> Histogram | None:
        """Per scraped server (servers with another max-model-len have other token buckets), then
        added up on the bounds they share, as the /metrics source does."""
        rows = self._api("/api/v1/query", query=f"sum by (instance, le) (increase({self._m(name + '_bucket')}[{w}]))",
                         time=f"{at:.3f}")
        sums = self._api("/api/v1/query", query=f"sum by (instance) (increase({self._m(name + '_sum')}[{w}]))",
                         time=f"{at:.3f}")
        per: dict[str, dict[float, float]] = {}
        for r in rows:
            le = r["metric"]["le"]
            value = float(r["value"][1])
            per.setdefault(r["metric"].get("instance", ""), {})[math.inf if le in ("+Inf", "Inf") else float(le)] = (
                0.0 if math.isnan(value) else value)
        totals = {r["metric"].get("instance", ""): float(r["value"][1]) for r in sums}
        out = None
        for instance, buckets in per.items():
            bounds = tuple(sorted(buckets))
            counts = [buckets[b] for b in bounds]
            for i in range(1, len(counts)):  # extrapolation can leave a cumulative count a hair below the last
                counts[i] = max(counts[i], counts[i - 1])
            total = totals.get(instance, 0.0)
            h = Histogram(bounds, tuple(counts), 0.0 if math.isnan(total) else total)
            out = h if out is None else out.plus(h)
        return out

    def check(self) -> None:
        """At start: Prometheus answers and the selector matches vLLM series; ConfigError otherwise."""
        try:
            found = self._api("/api/v1/query", query=f"count({self._m(COUNTERS['requests'] + '_total')})")
        except SourceError as exc:
            raise ConfigError(f"daemon.watch: {exc}") from exc
        if not found:
            raise ConfigError(f"daemon.watch: selector {self.selector or '(none)'} matches no "
                              f"{COUNTERS['requests']}_total series on {self.url}; check the job and model_name "
                              "labels (Prometheus' /targets page lists what it scrapes)")

    def poll(self) -> list[str]:
        """Ask for the window ending now; returns the failure (one line) or nothing."""
        try:
            self._last = self._read(time.time())
        except SourceError as exc:
            return [str(exc)]
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:  # a row of another shape
            return [f"{self.url} answered a query with rows of another shape ({type(exc).__name__}: {exc}); "
                    "check that it is Prometheus 2.x or later"]
        return []

    def spanned(self) -> float:
        return self.window_s  # Prometheus keeps the history: a window is there at once

    def window(self) -> Window | None:
        return self._last

    def _read(self, now: float) -> Window | None:
        w = f"{int(round(self.window_s))}s"
        step_s = max(1, int(round(self.step_s)))
        steps = max(1, int(round(self.window_s / step_s)))
        step = f"{step_s}s"
        hist = {key: h for key, names in HISTOGRAMS.items() if (h := self._histogram(names[0], w, now)) is not None}
        if "prompt" not in hist:
            return None
        counters = {key: self._scalar(f"sum(increase({self._m(name + '_total')}[{w}]))", now)
                    for key, name in COUNTERS.items()}
        flight = (f"avg_over_time((sum({self._m(GAUGES['running'])}) + sum({self._m(GAUGES['waiting'])}))"
                  f"[{w}:{step}])")
        concurrency = self._api("/api/v1/query", query=flight, time=f"{now:.3f}")
        now_in = f"sum({self._m(GAUGES['running'])}) + sum({self._m(GAUGES['waiting'])})"
        growth = self._scalar(now_in, now) - self._scalar(now_in, now - self.window_s)
        rows = self._api("/api/v1/query_range", query=f"sum(increase({self._m(COUNTERS['requests'] + '_total')}[{step}]))",
                         start=f"{now - (steps - 1) * step_s:.3f}", end=f"{now:.3f}", step=step)
        counts = tuple(float(v) for _, v in rows[0]["values"]) if rows else ()
        waiting = self._api("/api/v1/query", time=f"{now:.3f}",
                            query=f"avg_over_time((sum({self._m(GAUGES['waiting'])}) > bool 0)[{w}:{step}])")
        rejected = {key: self._scalar(f"sum(increase({self._http(status)}[{w}]))", now)
                    for key, status in REJECTED.items()}
        info = self._api("/api/v1/query", query="vllm:cache_config_info" + self.selector, time=f"{now:.3f}")
        cache = {k: v for k, v in info[0]["metric"].items() if k != "__name__"} if info else {}
        output = hist.get("output") or Histogram.empty(hist["prompt"].bounds)
        return Window(self.source, now - self.window_s, now, counters["requests"], hist["prompt"], output,
                      counters["prefix_queries"], counters["prefix_hits"], float(step_s), counts,
                      float(concurrency[0]["value"][1]) if concurrency else None,
                      {k: hist[k] for k in LATENCIES if k in hist}, cache, growth, counters["prompt_tokens"],
                      _share(waiting), rejected["rejected_4xx"],
                      rejected["rejected_5xx"])


def _share(rows: list) -> float | None:
    value = float(rows[0]["value"][1]) if rows else math.nan
    return None if math.isnan(value) else value


def _rejected(status: str) -> str:
    """The label matchers of an inference request answered `status` (exposition.rejected's rule)."""
    return f'method="POST", handler=~"/v1/.*", status="{status}"'
