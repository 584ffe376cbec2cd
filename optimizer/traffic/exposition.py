"""One read of a vLLM server's `/metrics` page: the counters, histograms and gauges the traffic
is estimated from, summed over their label sets (engines, finish reasons).

    requests        vllm:request_success_total           counter (finished requests)
    prompt_tokens   vllm:prompt_tokens_total             counter (prompt tokens, counted at prefill:
                                                         before the request finishes)
    prefix_queries  vllm:prefix_cache_queries_total      counter (prompt tokens looked up)
    prefix_hits     vllm:prefix_cache_hits_total         counter (prompt tokens found cached)
    prompt          vllm:request_prompt_tokens           histogram (tokens per request)
    output          vllm:request_generation_tokens       histogram (tokens per request)
    ttft            vllm:time_to_first_token_seconds     histogram
    itl             vllm:inter_token_latency_seconds     histogram (older vLLM:
                                                         vllm:time_per_output_token_seconds)
    e2e             vllm:e2e_request_latency_seconds     histogram
    queue           vllm:request_queue_time_seconds      histogram (waiting before the first schedule)
    tpot            vllm:request_time_per_output_token_seconds  histogram (per request)
    running         vllm:num_requests_running            gauge
    waiting         vllm:num_requests_waiting            gauge
    cache_config    vllm:cache_config_info               the labels of the info gauge
    rejected_4xx    http_requests_total                  counter, POSTs to the API's /v1/ routes
    rejected_5xx                                         answered 4xx (a prompt past --max-model-len,
                                                         a bad request, 429) or 5xx: requests the
                                                         server never counted as its own

The page is parsed with prometheus-client's parser. A page without the request counter and the
prompt histogram is not a vLLM server's (`NotVllmMetrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from optimizer.traffic.histogram import Histogram

COUNTERS = {"requests": "vllm:request_success", "prompt_tokens": "vllm:prompt_tokens",
            "prefix_queries": "vllm:prefix_cache_queries",
            "prefix_hits": "vllm:prefix_cache_hits"}
HISTOGRAMS = {"prompt": ("vllm:request_prompt_tokens",), "output": ("vllm:request_generation_tokens",),
              "ttft": ("vllm:time_to_first_token_seconds",),
              "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
              "e2e": ("vllm:e2e_request_latency_seconds",), "queue": ("vllm:request_queue_time_seconds",),
              "tpot": ("vllm:request_time_per_output_token_seconds",)}
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
CACHE_INFO = "vllm:cache_config_info"
HTTP = "http_requests"  # the API server's own counter (prometheus-fastapi-instrumentator): handler, method, status
REJECTED = {"rejected_4xx": "4xx", "rejected_5xx": "5xx"}
REQUIRED = ("requests", "prompt")


class NotVllmMetrics(ValueError):
    """The page parsed (or did not) but is not a vLLM server's metrics."""


@dataclass(frozen=True)
class Reading:
    at: float  # wall-clock seconds of the read
    counters: dict[str, float]
    histograms: dict[str, Histogram]
    gauges: dict[str, float]
    cache_config: dict[str, str] = field(default_factory=dict)


def _histogram(samples) -> Histogram | None:
    buckets: dict[float, float] = {}
    total = 0.0
    for s in samples:
        if s.name.endswith("_bucket"):
            le = math.inf if s.labels.get("le") in ("+Inf", "Inf") else float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            total += s.value
    if not buckets:
        return None
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total)


def rejected(labels: dict, status: str) -> bool:
    """An inference request (a POST to a /v1/ route) answered with this status class."""
    return (labels.get("status") == status and labels.get("method") == "POST"
            and str(labels.get("handler", "")).startswith("/v1/"))


def parse(text: str, at: float) -> Reading:
    """The quantities above from one /metrics page read at `at`; raises NotVllmMetrics."""
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as exc:  # noqa: BLE001 - the parser raises bare ValueError/KeyError/IndexError
        raise NotVllmMetrics("the page is not Prometheus text") from exc
    counters = {key: sum(s.value for s in families[name].samples if s.name.endswith("_total"))
                for key, name in COUNTERS.items() if name in families}
    histograms = {}
    for key, names in HISTOGRAMS.items():
        found = next((families[n] for n in names if n in families), None)
        h = _histogram(found.samples) if found is not None else None
        if h is not None:
            histograms[key] = h
    if HTTP in families:
        for key, status in REJECTED.items():
            counters[key] = sum(s.value for s in families[HTTP].samples if s.name.endswith("_total")
                                and rejected(s.labels, status))
    gauges = {key: sum(s.value for s in families[name].samples) for key, name in GAUGES.items() if name in families}
    info = families.get(CACHE_INFO)
    cache_config = dict(info.samples[0].labels) if info is not None and info.samples else {}
    reading = Reading(at, counters, histograms, gauges, cache_config)
    missing = [k for k in REQUIRED if k not in counters and k not in histograms]
    if missing:
        names = ", ".join(COUNTERS.get(k, HISTOGRAMS.get(k, ("?",))[0]) for k in missing)
        raise NotVllmMetrics(f"no {names} on the page")
    return reading
