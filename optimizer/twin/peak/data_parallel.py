"""A twin of a data-parallel server: `size` engines of one configuration behind vLLM's own balancer.

vLLM 0.32 (`DPLBAsyncMPClient.get_core_engine_for_request`) sends each request to the engine with
the fewest unfinished requests (the larger of its client's own count in flight, times the number of
clients, and the coordinator's waiting + running), scanning from an index that moves on by one each
request, so that ties go to each engine in turn. `vllm serve` starts one API server per engine by
default, each such a client; the twin balances as one client would, seeing every request in flight.
For a dense model the engines run independently (vLLM keeps mixture-of-experts engines in lockstep
instead: not this). The twin replays each engine's share through its own copy of vLLM's scheduler
with the same step cost, on one clock (every request keeps its send time), and merges the records
as one server's.

Where a request goes depends on when the requests before it finish, which depends on where they
went: the assignment is found in passes. The first sends requests to each engine in turn; each
later pass sends each to the fewest in flight at its send time, counted from the previous pass's
send and finish times; it stops when a pass moves nothing, or after PASSES. An agent's later turns
stay on their first turn's engine (the twin replays a turn after the one it follows on the same
scheduler; vLLM's balancer would place each turn afresh). A closed loop's clients are split
between the engines as evenly as they go (an engine with no client gets no request).

Not modelled: the host-side work of the engines and their API servers (on a CPU they share the
engines' cores, and a DP server carries less than this says: docs/twin.md), the coordinator's
100 ms lag, and the balancer's preference, when a KV cache is over half full, for engines with no
queue. The merged server view holds each engine's peaks (a DP server's /metrics sums its engines').
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from optimizer.measure.replay import ReplayResult
from optimizer.twin.simulation import Simulated

PASSES = 3  # on the workloads tried, a third pass moved a request or two and no capacity


def engines(build, params: dict):
    """`build(params)` -> the twin of one server; with data-parallel-size N > 1 for a dense model, N
    engines of the same flags but that one behind vLLM's balancer. Returns (the twin, whether it is
    DP engines): a mixture-of-experts model's lockstep engines are not modelled, and keep the one twin."""
    n = int(params.get("data-parallel-size") or 1)
    if n <= 1:
        return build(params), False
    one = build({k: v for k, v in params.items() if k != "data-parallel-size"})
    if one.config.model_config.is_moe:
        return build(params), False
    return DataParallel(one, n), True


@dataclass
class DataParallel:
    engine: object  # the TwinServer of one engine
    size: int

    @property
    def shape(self):
        return self.engine.shape

    @property
    def pool(self):
        return self.engine.pool

    def describe(self) -> str:
        return f"{self.size} data-parallel engines, each {self.engine.describe()}"

    def run(self, requests, concurrency: int | None, cost, *, send_times=None, keep_steps: bool = False,
            stretches: bool = True) -> Simulated:
        reqs = list(requests)
        chains = _chains(reqs)
        roots = sorted(chains, key=lambda i: (_send(reqs, send_times, i), i))
        engines = self.size if concurrency is None else max(1, min(self.size, concurrency))
        where = {root: k % engines for k, root in enumerate(roots)}
        sims = self._replay(reqs, chains, where, concurrency, cost, send_times, keep_steps, stretches)
        for _ in range(PASSES - 1):
            times = _times(reqs, sims)
            moved = least_in_flight(roots, chains, times, engines)
            if moved == where:
                break
            where = moved
            sims = self._replay(reqs, chains, where, concurrency, cost, send_times, keep_steps, stretches)
        return _merged(reqs, sims)

    def _replay(self, reqs, chains, where, concurrency, cost, send_times, keep_steps, stretches) -> list:
        sims = []
        for e in range(self.size):
            mine = sorted(i for root, chain in chains.items() if where[root] == e for i in chain)
            clients = None if concurrency is None else concurrency // self.size + (e < concurrency % self.size)
            if not mine or clients == 0:
                continue
            sends = None if send_times is None else [send_times[i] for i in mine]
            sims.append(self.engine.run([reqs[i] for i in mine], clients, cost, send_times=sends,
                                        keep_steps=keep_steps, stretches=stretches))
        return sims


def _send(reqs, send_times, i: int) -> float:
    return float(send_times[i]) if send_times is not None else reqs[i].offset_s


def _chains(reqs) -> dict[int, list[int]]:
    """Each first turn's index -> the indices of it and the turns that follow it, in order."""
    index = {r.id: i for i, r in enumerate(reqs)}
    root: dict[int, int] = {}
    chains: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        root[i] = root[index[r.after]] if r.after is not None and r.after in index else i
        chains.setdefault(root[i], []).append(i)
    return chains


def _times(reqs, sims: list[Simulated]) -> dict[int, tuple[float, float]]:
    """Each request's (send, finish) in the pass just run: a request sent but never finished is in flight
    to the end; one never sent (a turn after one that never finished) never is."""
    index = {r.id: i for i, r in enumerate(reqs)}
    out = {}
    for sim in sims:
        for rec in sim.result.records:
            sent = rec.first_chunk_s is not None or rec.sent_s > 0 or reqs[index[rec.id]].after is None
            out[index[rec.id]] = ((rec.sent_s, rec.end_s if rec.ok and rec.end_s is not None else math.inf) if sent
                                  else (math.inf, math.inf))
    return out


def least_in_flight(roots: list[int], chains: dict, times: dict, size: int) -> dict[int, int]:
    """vLLM's balancer over the first turns in their send order (per `times`: (send, finish) by request):
    each to the engine with the fewest requests in flight at its send time, the scan starting one
    engine further each time."""
    pending: list[list[tuple[float, float]]] = [[] for _ in range(size)]  # heaps of (send, finish) not yet sent
    active: list[list[float]] = [[] for _ in range(size)]  # heaps of the finish times of those sent
    where, start = {}, 0
    for root in sorted(roots, key=lambda i: (times[i][0], i)):
        t = times[root][0]
        for e in range(size):
            while pending[e] and pending[e][0][0] <= t:
                heapq.heappush(active[e], heapq.heappop(pending[e])[1])
            while active[e] and active[e][0] <= t:
                heapq.heappop(active[e])
        best = min(range(size), key=lambda k: (len(active[(start + k) % size]), k))
        best = (start + best) % size
        where[root] = best
        for i in chains[root]:
            heapq.heappush(pending[best], times[i])
        start = (start + 1) % size
    return where


def _merged(reqs, sims: list[Simulated]) -> Simulated:
    """The engines' runs as one server's: the records in the requests' order, the window from the first
    send to the last finish; the server's view per engine at its peak, its counts summed."""
    order = {r.id: i for i, r in enumerate(reqs)}
    records = sorted((rec for s in sims for rec in s.result.records), key=lambda rec: order[rec.id])
    ok = [r for r in records if r.ok]
    window = max(r.end_s for r in ok) - min(r.sent_s for r in ok) if ok else 1e-9
    server: dict = {}
    for s in sims:
        for key, v in s.server.items():
            server[key] = max(server.get(key, v), v) if key.endswith("_peak") else server.get(key, 0.0) + v
    queries = server.get("prefix_cache_queries", 0.0)
    server["prefix_cache_hit_rate"] = server.get("prefix_cache_hits", 0.0) / queries if queries else 0.0
    weights = [sum(1 for r in s.result.records if r.first_chunk_s is not None) for s in sims]
    server["queue_time_mean_ms"] = (sum(s.server.get("queue_time_mean_ms", 0.0) * w for s, w in zip(sims, weights))
                                    / max(1, sum(weights)))
    return Simulated(ReplayResult(tuple(records), max(window, 1e-9)), server, sum(s.steps for s in sims))
