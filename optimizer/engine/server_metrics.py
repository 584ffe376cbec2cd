"""The server's own view of a replay, from vLLM's Prometheus `/metrics`.

Counters are cumulative, so a snapshot is taken just before and just after the measured
window and the difference is kept (docs/vllm-facts.md#metrics-counters); gauges (KV-cache usage, queue length) are
sampled during the window for their peak. The deltas let the replay cross-check its own
token counts against the server's and show what the client cannot see: preemptions,
prefix-cache hits, time spent queued, and, with speculative decoding on, how many drafted
tokens were accepted (acceptance = accepted / drafted tokens; mean accepted length = 1 +
accepted / drafts, the tokens each verification step yields; per position, the share of drafts
whose k-th token was accepted). With speculation off vLLM exports no such counter and the view
has no `spec_` key.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field

import aiohttp
from optimizer.http_open import urlopen

COUNTERS = {  # our name -> vLLM's sample name (v1 engine)
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "queue_time_sum_s": "vllm:request_queue_time_seconds_sum",
    "queue_time_count": "vllm:request_queue_time_seconds_count",
}
SPEC_COUNTERS = {  # with --speculative-config only
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # one series per draft position
GAUGES = {"kv_cache_usage": "vllm:kv_cache_usage_perc", "waiting": "vllm:num_requests_waiting",
          "running": "vllm:num_requests_running"}


def parse(text: str) -> dict[str, float]:
    """Prometheus text format -> {sample name: value}, summed over label sets (several engines
    add up; a gauge's peak is taken per scrape, so the sum is right there too)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "}" in line:  # name{labels} value [timestamp]; the last brace ends the labels
            head, _, rest = line.rpartition("}")
            name, _, labels = head.partition("{")
            name, fields = name.strip(), rest.split()
            if name == PER_POSITION:  # kept apart per position: PER_POSITION[0], [1], ...
                position = re.search(r'position="(\d+)"', labels)
                name = f"{name}[{position.group(1)}]" if position else name
        else:  # name value [timestamp]
            name, *fields = line.split()
        try:
            value = float(fields[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def scrape(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """One synchronous scrape; an empty dict when the server does not answer."""
    try:
        with urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as resp:
            return parse(resp.read().decode("utf-8", "replace"))
    except OSError:
        return {}


@dataclass
class Peaks:
    """Gauge peaks seen while sampling during the window."""

    values: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def add(self, snapshot: dict[str, float]) -> None:
        self.samples += 1
        for ours, theirs in GAUGES.items():
            if theirs in snapshot:
                self.values[ours] = max(self.values.get(ours, 0.0), snapshot[theirs])


def sampler(base_url: str, every_s: float, peaks: Peaks):
    """A coroutine factory for the replayer's `during`: scrape every `every_s` until cancelled."""
    url = base_url.rstrip("/") + "/metrics"

    async def run(_t0: float) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while True:
                try:
                    async with session.get(url) as resp:
                        peaks.add(parse(await resp.text()))
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(every_s)

    return run


def settled_after(base_url: str, expect_generation: float, before: dict[str, float], wait_s: float = 3.0) -> dict:
    """The after-snapshot, re-scraped for up to `wait_s` until the generation counter has caught
    up with what the client received (the engine publishes its stats a moment after the reply)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = scrape(base_url)
        got = after.get(COUNTERS["generation_tokens"], 0.0) - before.get(COUNTERS["generation_tokens"], 0.0)
        if got >= expect_generation or time.monotonic() > deadline or not after:
            return after
        time.sleep(0.2)


def wait_idle(base_url: str, timeout_s: float = 60.0) -> bool:
    """Wait until the server has no running or waiting request (after a cut-short replay, whose
    cancelled requests vLLM aborts, or between rate probes); False on timeout or no answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = scrape(base_url)
        if not snap:
            return False
        if snap.get(GAUGES["running"], 0.0) + snap.get(GAUGES["waiting"], 0.0) == 0:
            return True
        time.sleep(0.2)
    return False


def deltas(before: dict[str, float], after: dict[str, float], peaks: Peaks | None = None) -> dict[str, float]:
    """What the server did during the window: counter differences and gauge peaks."""
    if not before or not after:
        return {}
    out = {ours: after.get(theirs, 0.0) - before.get(theirs, 0.0) for ours, theirs in COUNTERS.items()}
    queries, count = out["prefix_cache_queries"], out.pop("queue_time_count")
    out["prefix_cache_hit_rate"] = out["prefix_cache_hits"] / queries if queries else 0.0
    out["queue_time_mean_ms"] = out.pop("queue_time_sum_s") * 1000 / count if count else math.nan
    for ours, value in (peaks.values if peaks else {}).items():
        out[f"{ours}_peak"] = value
    out.update(speculation(before, after))
    return out


def speculation(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Speculative decoding during the window: drafts, drafted and accepted tokens, acceptance,
    mean accepted length, and acceptance per draft position (`spec_accepted_pos_<k>`); {} when
    the server drafted nothing (speculation off, or no request decoded)."""
    out = {ours: after.get(theirs, 0.0) - before.get(theirs, 0.0) for ours, theirs in SPEC_COUNTERS.items()}
    drafts, drafted = out["spec_drafts"], out["spec_draft_tokens"]
    if drafts <= 0 or drafted <= 0:
        return {}
    out["spec_acceptance"] = out["spec_accepted_tokens"] / drafted
    out["spec_mean_accepted_length"] = 1.0 + out["spec_accepted_tokens"] / drafts
    positions = sorted(int(k[len(PER_POSITION) + 1:-1]) for k in after if k.startswith(PER_POSITION + "["))
    for k in positions:
        key = f"{PER_POSITION}[{k}]"
        out[f"spec_accepted_pos_{k}"] = (after[key] - before.get(key, 0.0)) / drafts
    return out
