"""One replay of a workload through vLLM's own scheduler on a simulated clock.

The requests are the workload's own (the replayer's materialized requests: token ids with their
shared prefixes, output lengths, offsets, agent chains), sent as the replayer sends them: open loop
on their offsets, or closed loop with `concurrency` in flight (an agent chain holds its slot), or at
given send times (a stored run's, for calibration). A sent request reaches the scheduler
`intake_s` later. Between steps the engine takes every request that has arrived; each step is
`schedule()`, a cost from the step-cost model, and `update_from_output()` with one sampled token
for every request whose prompt is complete after the step, exactly as the engine core loop. A
stretch of pure decode steps that vLLM would schedule identically is priced and applied in one go
(twin/decode_stretch.py); `stretches=False` calls vLLM every step.

The result speaks the replayer's language: one `RequestRecord` per request (every token a chunk
at its step's end), so `measure/metrics.summarize` and the SLO code score it unchanged, and the
server's view (`/metrics`'s peaks, preemptions, prefix-cache hits) beside it. With `keep_steps`,
each step's counts and times and each request's step indices are kept for the calibration fit.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from optimizer.measure.replay import ReplayResult, RequestRecord
from optimizer.twin import decode_stretch
from optimizer.twin.kv_pool import shared_tokens
from optimizer.twin.step_cost import StepCost, StepShape
from optimizer.twin.vllm_scheduler import block_hasher, new_request

MAX_STEPS = 5_000_000  # a safety stop: a clock that never advances would otherwise spin


@dataclass
class StepLog:
    """Per step and per request indices, for the fit (twin/fit.py)."""

    starts: list[float] = field(default_factory=list)
    shapes: list[StepShape] = field(default_factory=list)
    visible: dict[int, float] = field(default_factory=dict)  # request index -> when the scheduler could see it
    first_step: dict[int, int] = field(default_factory=dict)  # request -> the step in progress when it became visible
    token_steps: dict[int, list[int]] = field(default_factory=dict)  # request -> the step of each token


@dataclass
class Simulated:
    result: ReplayResult
    server: dict
    steps: int
    log: StepLog | None = None


@dataclass
class _State:
    n: int
    sent: list[float]
    token_s: list[list[float]]
    first_scheduled: list[float]
    preemptions: int = 0


def simulate(requests, concurrency: int | None, scheduler, cost: StepCost, *, send_times=None,
             keep_steps: bool = False, stretches: bool = True) -> Simulated:
    """Replay `requests` (workload Requests) through `scheduler` (a fresh vLLM Scheduler) with `cost`.
    `send_times` (seconds, one per request) replaces the schedule: every request is sent then."""
    run = _Replay(list(requests), concurrency, scheduler, cost, send_times, keep_steps, stretches)
    while run.step < MAX_STEPS and run.advance():
        pass
    st = run.st
    prompt_tokens = sum(len(r.prompt_token_ids) for r in run.reqs)
    return Simulated(_result(run.reqs, st), _server(st, run.peaks, run.queries, run.hits, prompt_tokens), run.step,
                     run.log)


class _Replay:
    """The engine loop's state: the clock, the requests sent and visible, vLLM's scheduler, the counters."""

    def __init__(self, reqs, concurrency, scheduler, cost, send_times, keep_steps: bool, stretches: bool):
        n = len(reqs)
        self.reqs, self.scheduler, self.cost = reqs, scheduler, cost
        self.index = {r.id: i for i, r in enumerate(reqs)}
        caching = scheduler.cache_config.enable_prefix_caching
        self.hasher = block_hasher(scheduler.cache_config.block_size) if caching else None
        self.st = _State(n, [math.nan] * n, [[] for _ in range(n)], [math.nan] * n)
        self.log = StepLog() if keep_steps else None
        self.sends = _Sends(reqs, self.index, concurrency if send_times is None else None, send_times)
        self.arrivals: list[tuple[float, int]] = []  # (visible at, request index)
        self.vreq: dict[str, object] = {}
        self.clock, self.step, self.last_start, self.last_end = 0.0, 0, -math.inf, -math.inf
        self.peaks = {"running_peak": 0, "waiting_peak": 0, "kv_cache_usage_peak": 0.0}
        self.queries = self.hits = 0
        self.stretches = stretches
        self.fp8 = scheduler.cache_config.cache_dtype.startswith("fp8")

    def advance(self) -> bool:
        """Take what has arrived, then run one step (or wait for the next arrival); False when done."""
        self._admit()
        if not self.scheduler.has_requests():
            return self._wait()
        if self.stretches and self._stretch():
            return True
        out = self.scheduler.schedule()
        if out.total_num_scheduled_tokens == 0:  # nothing fits now: wait for the next arrival, or give up
            self.scheduler.update_from_output(out, _runner_output(out, {}))
            return self._wait()
        self._run_step(out)
        return True

    def _admit(self) -> None:
        for t, i in self.sends.due(self.clock):
            self.st.sent[i] = t
            heapq.heappush(self.arrivals, (t + self.cost.intake_s, i))
        while self.arrivals and self.arrivals[0][0] <= self.clock:
            visible, i = heapq.heappop(self.arrivals)
            r = self.reqs[i]
            vr = new_request(r.id, list(r.prompt_token_ids), r.max_tokens, visible, self.hasher)
            self.vreq[r.id] = vr
            self.scheduler.add_request(vr)
            if self.log is not None:
                self.log.visible[i] = visible
                self.log.first_step[i] = self.step - 1 if self.last_start <= visible < self.last_end else self.step

    def _wait(self) -> bool:
        nxt = min(self.sends.next_time(), self.arrivals[0][0] if self.arrivals else math.inf)
        if nxt == math.inf:
            return False
        self.clock = max(self.clock, nxt)
        return True

    def _stretch(self) -> bool:
        """Pure decode steps up to the next send or arrival, priced here and applied to vLLM's state."""
        sched = self.scheduler
        most = decode_stretch.length(sched)
        if most < 1:
            return False
        nxt = min(self.sends.next_time(), self.arrivals[0][0] if self.arrivals else math.inf)
        ids = [self.index[r.request_id] for r in sched.running]
        self._peaks()
        taken = 0
        for shape in decode_stretch.shapes(sched, most, self.fp8):
            if self.clock >= nxt:  # a step starting now would take the arrival first: vLLM's to schedule
                break
            self.last_start = self.clock
            self.clock += max(self.cost.seconds(shape), 1e-6)
            self.last_end = self.clock
            for i in ids:
                self.st.token_s[i].append(self.clock)
            if self.log is not None:
                self.log.starts.append(self.last_start)
                self.log.shapes.append(shape)
                for i in ids:
                    self.log.token_steps.setdefault(i, []).append(self.step)
            self.step += 1
            taken += 1
        if taken:
            decode_stretch.apply(sched, taken)
        return taken > 0

    def _peaks(self) -> None:
        sched = self.scheduler
        self.peaks["running_peak"] = max(self.peaks["running_peak"], len(sched.running))
        self.peaks["waiting_peak"] = max(self.peaks["waiting_peak"], len(sched.waiting))
        self.peaks["kv_cache_usage_peak"] = max(self.peaks["kv_cache_usage_peak"], sched.get_kv_cache_usage())

    def _run_step(self, out) -> None:
        sched = self.scheduler
        shape, sampled = _shape(out, sched, self.st, self.index, self.clock)
        self._peaks()
        self.last_start = self.clock
        self.clock += max(self.cost.seconds(shape), 1e-6)
        self.last_end = self.clock
        if self.log is not None:
            self.log.starts.append(self.last_start)
            self.log.shapes.append(shape)
        for core in sched.update_from_output(out, _runner_output(out, sampled)).values():
            self._take(core)
        self.step += 1

    def _take(self, core) -> None:
        """One engine step's outputs: its tokens at the step's end, finished requests, prefix-cache counts."""
        stats = core.scheduler_stats
        if stats is not None and stats.prefix_cache_stats is not None:
            self.queries += stats.prefix_cache_stats.queries
            self.hits += stats.prefix_cache_stats.hits
        for o in core.outputs:
            i = self.index[o.request_id]
            self.st.token_s[i].extend([self.clock] * len(o.new_token_ids))
            if self.log is not None:
                self.log.token_steps.setdefault(i, []).extend([self.step] * len(o.new_token_ids))
            if o.finish_reason is not None:
                self.st.preemptions += self.vreq.pop(o.request_id).num_preemptions
                self.sends.finished(i, self.clock)


def _shape(out, scheduler, st: _State, index: dict, clock: float) -> tuple[StepShape, dict]:
    """The step's counts, and which scheduled requests sample a token (their prompt is complete)."""
    pt = dc = ds = ps = 0
    pa = 0.0
    sampled, chunks, decoding = {}, [], []
    for rid, k in out.num_scheduled_tokens.items():
        r = scheduler.requests[rid]
        after = r.num_computed_tokens  # schedule() has already advanced it
        before = after - k
        i = index[rid]
        if math.isnan(st.first_scheduled[i]):
            st.first_scheduled[i] = clock
        if k == 1 and before >= r.num_prompt_tokens:
            ds += 1
            dc += before
            decoding.append(rid)
        else:
            pt += k
            ps += 1
            pa += k * (before + k / 2)
            chunks.append((k, before))
        sampled[rid] = after >= r.num_tokens
    return StepShape(pt, pa / 1000, ps, ds, dc / 1000, scheduler.cache_config.cache_dtype.startswith("fp8"),
                     tuple(chunks), (dc - shared_tokens(scheduler, decoding)) / 1000), sampled


def _runner_output(out, sampled: dict):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[7] if sampled[r] else [] for r in ids], logprobs=None,
                             prompt_logprobs_dict={}, pooler_output=[])


def _result(reqs, st: _State) -> ReplayResult:
    records = []
    for i, r in enumerate(reqs):
        toks = st.token_s[i]
        sent = st.sent[i]
        ok = bool(toks) and not math.isnan(sent)
        records.append(RequestRecord(r.id, r.offset_s, 0.0 if math.isnan(sent) else sent, toks[0] if toks else None,
                                     toks[-1] if toks else None, tuple(toks), len(r.prompt_token_ids), len(toks),
                                     r.max_tokens, ok, 200 if ok else 0, "" if ok else "never scheduled"))
    sent = [r.sent_s for r in records if r.ok]
    ends = [r.end_s for r in records if r.ok]
    window = max(ends) - min(sent) if ends else 1e-9
    return ReplayResult(tuple(records), max(window, 1e-9))


def _server(st: _State, peaks: dict, queries: int, hits: int, prompt_tokens: int) -> dict:
    queue = [(f - s) * 1000 for f, s in zip(st.first_scheduled, st.sent) if not (math.isnan(f) or math.isnan(s))]
    return {**peaks, "preemptions": float(st.preemptions), "prompt_tokens": float(prompt_tokens),
            "generation_tokens": float(sum(len(t) for t in st.token_s)),
            "prefix_cache_queries": float(queries), "prefix_cache_hits": float(hits),
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            "queue_time_mean_ms": sum(queue) / len(queue) if queue else 0.0}


class _Sends:
    """When each request is sent: on its offset (open loop), when a slot frees (closed loop), after
    the request it follows (an agent's next turn), or at the given times."""

    def __init__(self, reqs, index: dict, concurrency: int | None, send_times):
        self.reqs, self.free, self.queue = reqs, concurrency, []
        self.holds_slot = {i for i, r in enumerate(reqs) if r.after is None}
        self.heap: list[tuple[float, int]] = []  # sends that take a slot of the closed loop's concurrency
        self.followers: list[tuple[float, int]] = []  # sends that do not (an agent's later turns)
        self.dependents: dict[int, list[int]] = {}
        root: dict[str, str] = {}
        for i, r in enumerate(reqs):
            if send_times is not None:
                self._push(float(send_times[i]), i)
            elif r.after is not None and r.after in index:
                self.dependents.setdefault(index[r.after], []).append(i)
            else:
                self._push(r.offset_s, i)
            root[r.id] = root[r.after] if r.after in root else r.id
        self.last_of = {index[root[r.id]]: i for i, r in enumerate(reqs)}
        self.root = {i: index[root[r.id]] for i, r in enumerate(reqs)}
        heapq.heapify(self.heap)
        heapq.heapify(self.followers)
        self.released: list[tuple[float, int]] = []

    def _push(self, t: float, i: int) -> None:
        (self.heap if i in self.holds_slot else self.followers).append((t, i))

    def next_time(self) -> float:
        """The next send, when the engine is idle (an entry waiting for a slot cannot be it)."""
        times = [t for t, _ in self.released[:1]] + [t for t, _ in self.followers[:1]]
        if self.free is None or self.free > 0:
            times += [t for t, _ in self.heap[:1]]
        return min(times, default=math.inf)

    def due(self, now: float) -> list[tuple[float, int]]:
        out = self.released
        self.released = []
        while self.followers and self.followers[0][0] <= now:
            out.append(heapq.heappop(self.followers))
        while self.heap and self.heap[0][0] <= now:
            t, i = heapq.heappop(self.heap)
            if self.free is None:
                out.append((t, i))
            elif self.free > 0:
                self.free -= 1
                out.append((t, i))
            else:
                self.queue.append(i)
        return out

    def finished(self, i: int, now: float) -> None:
        for d in self.dependents.get(i, ()):
            heapq.heappush(self.followers, (now + self.reqs[d].offset_s, d))
        if self.free is not None and self.last_of[self.root[i]] == i:
            if self.queue:  # the slot passes straight to the next request waiting for one
                self.released.append((now, self.queue.pop(0)))
            else:
                self.free += 1
