"""The `observed` scenario: traffic the daemon read from live vLLM servers (a traffic window file,
traffic/window.py), replayed as a seeded synthetic workload of the same shape.

    lengths     prompt and output lengths drawn from the window's histograms, as fitted by
                traffic/lengths.py (a bucket, then a tilted place inside it matching the mean).
                A request longer than the servers admit (the spec's max_model_len: the shorter of
                production's --max-model-len, which answers a longer one 400, and one the trial
                servers are pinned to, which would cut its output short) or than the model takes is cut
                to fit, and the notes say how many were and to which.
    arrivals    gamma gaps at the window's rate with its burstiness (1 when unknown), vLLM's
                benchmark schedule (workload/arrivals.py).
    prefixes    every prompt starts with the first s * length tokens of one shared block (a
                system prompt); the share s is fitted so that the prefix cache, simulated on the
                drawn requests in whole KV blocks (the watched servers' block size, 16 when
                unknown), hits the window's prefix-cache hit rate.

The workload's description and notes record the source, the window and what was fitted.
"""

from __future__ import annotations

import random
import time

from optimizer.config.workload_spec import ObservedSpec
from optimizer.errors import ConfigError
from optimizer.traffic import window as window_mod
from optimizer.traffic.lengths import draw_lengths
from optimizer.workload.arrivals import rate_schedule
from optimizer.workload.base import Request, Workload
from optimizer.workload.tokens import Vocabulary

DEFAULT_BLOCK = 16


def simulated_hit_rate(prompts: list[int], share: float, block: int) -> float:
    """Prefix-cache hits / prompt tokens when each prompt starts with the first share * length
    tokens of one shared block: a request hits the whole blocks of its prefix that an earlier
    request already put in the cache (never its last token: vLLM computes at least one)."""
    cached, hits = 0, 0
    for length in prompts:
        prefix_blocks = min(int(share * length), length - 1) // block
        hits += min(prefix_blocks, cached) * block
        cached = max(cached, prefix_blocks)
    total = sum(prompts)
    return hits / total if total else 0.0


def fit_prefix_share(prompts: list[int], hit_rate: float | None, block: int) -> float:
    """The share s in [0, 1] whose simulated hit rate is closest to `hit_rate` (0 when unknown)."""
    if not hit_rate or hit_rate <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    if simulated_hit_rate(prompts, hi, block) <= hit_rate:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulated_hit_rate(prompts, mid, block) < hit_rate else (lo, mid)
    return hi


def _block(window: window_mod.Window) -> int:
    try:
        return max(int(window.cache_config.get("block_size", DEFAULT_BLOCK)), 1)
    except ValueError:
        return DEFAULT_BLOCK


def _fit(prompts: list[int], outputs: list[int], limit: int | None) -> tuple[list[int], int]:
    if not limit:
        return prompts, 0
    cut = 0
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        if p + o > limit:
            prompts[i], cut = max(1, limit - o), cut + 1
    return prompts, cut


def _limit(spec: ObservedSpec, vocab: Vocabulary) -> tuple[int | None, str]:
    """The longest request drawn (prompt + output), and what sets it."""
    model = vocab.max_positions
    if spec.max_model_len and (not model or spec.max_model_len <= model):
        return spec.max_model_len, (f"max-model-len {spec.max_model_len} (the longest request the watched "
                                    "servers and the trial servers admit)")
    return model, f"the model's {model} positions"


def _where(source: dict) -> str:
    if source.get("kind") == "prometheus":
        return f"Prometheus {source.get('url')} {source.get('selector') or ''}".strip()
    return ", ".join(source.get("urls") or []) or "?"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def observed_workload(spec: ObservedSpec, vocab: Vocabulary) -> Workload:
    if not spec.path:
        raise ConfigError("workload.path: an observed workload replays a traffic window file; run the daemon with "
                          "daemon.watch on live servers (it fills the path in), or point workload.path at an "
                          "<artifacts_dir>/traffic/window-*.json it wrote")
    w = window_mod.read(spec.path)
    rng = random.Random(spec.seed)
    n = spec.requests
    limit, limit_is = _limit(spec, vocab)
    outputs = draw_lengths(w.output, n + spec.warmup_requests, rng)
    outputs = [min(o, limit - 1) if limit else o for o in outputs]
    prompt_hist, prompt_from = w.prompt_lengths()
    prompts, cut = _fit(draw_lengths(prompt_hist, n + spec.warmup_requests, rng), outputs, limit)
    block = _block(w)
    share = fit_prefix_share(prompts[:n], w.prefix_hit_rate, block)
    shared = vocab.block(f"observed-{spec.seed}-prefix", max(prompts, default=1))
    offs = rate_schedule(n, w.rate, w.burstiness or 1.0, rng) if w.rate > 0 else [0.0] * n

    def prompt(length: int) -> tuple[int, ...]:
        k = min(int(share * length), length - 1)
        return shared[:k] + vocab.random_ids(rng, length - k)

    reqs = tuple(Request(f"req-{i}", prompt(prompts[i]), outputs[i], offs[i]) for i in range(n))
    warm = tuple(Request(f"warmup-{i}", vocab.random_ids(rng, prompts[n + i]), outputs[n + i], 0.0)
                 for i in range(spec.warmup_requests))
    simulated = simulated_hit_rate(prompts[:n], share, block)
    hit = w.prefix_hit_rate
    notes = [f"observed on {_where(w.source)} from {_when(w.start)} to {_when(w.end)} UTC: {w.describe()}",
             f"prefix share {share:.2f} of each prompt (simulated hit rate {simulated:.0%} in {block}-token blocks"
             + (f", observed {hit:.0%})" if hit is not None else ", none observed)")]
    for name, h, source in (("prompt", prompt_hist, prompt_from),
                            ("output", w.output, f"the {w.output.count:.0f} finished requests")):
        q = window_mod.length_quantiles(h)
        notes.append(f"{name} lengths p10/p50/p90 {q['p10']}/{q['p50']}/{q['p90']} tokens, fitted to {source}")
    if w.saturated:
        notes.append(f"saturated: {w.arrivals:.0f} requests arrived, {w.requests:.0f} finished; "
                     f"{'; '.join(w.saturation())}; the rate counts the backlog, the output lengths rest on the "
                     "requests that did finish")
    if w.rejected:
        notes.append(f"{w.rejected:.0f} requests were rejected by the servers (4xx {w.rejected_4xx:.0f}, 5xx "
                     f"{w.rejected_5xx:.0f}): not replayed, their lengths unknown")
    if cut:
        notes.append(f"{cut} drawn prompts cut to fit {limit_is}")
    burst = w.burstiness
    return Workload(name="observed", requests=reqs, warmup=warm, concurrency=None,
                    description=f"observed traffic ({_where(w.source)}): {n} requests at {w.rate:.2f} req/s"
                                + (f", burstiness {burst:.2f}" if burst is not None else ""),
                    notes=tuple(notes))
