"""Replay a workload against an OpenAI-compatible server over streaming HTTP, the way
vLLM's own benchmark measures (docs/vllm-facts.md#measuring-like-vllm-bench):

- every request streams (`stream: true`, `include_usage`), with `ignore_eos` so output
  lengths are the workload's, not the random model's;
- the clock starts just before the POST; the intended send time is kept too, so a
  lagging client is visible (open loop: precomputed absolute schedule; an agent's next
  turn: the previous reply's end plus its think time);
- TTFT is the first chunk with choices, E2E the last; output tokens come from the
  server's usage chunk, never from re-tokenizing;
- a failed request is a record with `ok=False`, not an exception.

aiohttp's connector limit (100 by default) would silently cap concurrency: limit=0.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from optimizer.workload import Request


@dataclass(frozen=True)
class RequestRecord:
    id: str
    intended_s: float  # intended send time, seconds after the phase start
    sent_s: float  # actual send time (just before the POST)
    first_chunk_s: float | None
    end_s: float | None  # last chunk with choices
    chunk_s: tuple[float, ...]  # arrival time of every chunk with choices
    prompt_tokens: int
    output_tokens: int  # from the server's usage chunk
    expected_output_tokens: int
    ok: bool
    status: int
    error: str = ""


@dataclass(frozen=True)
class ReplayResult:
    records: tuple[RequestRecord, ...]  # finished requests (all of them unless stopped early)
    window_s: float  # first send -> last completion
    stopped: str = ""  # why `stop_when` cut the replay short ('' = it ran to the end)
    stopped_at_s: float = 0.0  # when, after the start


def _body(model: str, req: Request) -> dict:
    return {"model": model, "prompt": list(req.prompt_token_ids), "max_tokens": req.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "temperature": 0.0}


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: Request, intended: float,
               t0: float) -> RequestRecord:
    sent = time.perf_counter() - t0
    chunks: list[float] = []
    usage: dict = {}
    status = 0
    try:
        async with session.post(url, json=_body(model, req)) as resp:
            status = resp.status
            if status != 200:
                text = (await resp.text())[:300]
                return RequestRecord(req.id, intended, sent, None, None, (), len(req.prompt_token_ids), 0,
                                     req.max_tokens, False, status, text)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                data = json.loads(payload)
                if data.get("choices"):
                    chunks.append(time.perf_counter() - t0)
                if data.get("usage"):
                    usage = data["usage"]
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        return RequestRecord(req.id, intended, sent, chunks[0] if chunks else None, chunks[-1] if chunks else None,
                             tuple(chunks), len(req.prompt_token_ids), 0, req.max_tokens, False, status,
                             f"{type(exc).__name__}: {exc}"[:300])
    out = int(usage.get("completion_tokens", 0))
    ok = bool(chunks) and out > 0
    return RequestRecord(req.id, intended, sent, chunks[0] if chunks else None, chunks[-1] if chunks else None,
                         tuple(chunks), int(usage.get("prompt_tokens", len(req.prompt_token_ids))), out,
                         req.max_tokens, ok, status, "" if ok else "no tokens streamed")


async def replay(base_url: str, model: str, requests: tuple[Request, ...], concurrency: int | None,
                 request_timeout: float = 600.0, during=None, stop_when=None) -> ReplayResult:
    """Send `requests` (closed loop with `concurrency` in flight, else on their offsets; a request
    with `after` is sent its offset after that request ends). `during(t0)`, if given, is a
    coroutine run alongside (the /metrics sampler) and cancelled when the last request ends.
    `stop_when(finished_records)`, if given, is asked after every request ends; a non-empty
    answer (the reason) cancels the requests still pending or in flight (early stop: their
    connections close, and vLLM aborts a request whose client went away)."""
    url = base_url.rstrip("/") + "/v1/completions"
    # A fresh connection per request (as vLLM's own benchmark client, a session per request): a
    # pooled keep-alive connection races uvicorn's 5 s keep-alive timeout when the server's loop
    # stalls that long, and the request then fails with "Server disconnected" / "Can not write
    # request body" without reaching vLLM (measured: 8 of 48 requests of one CI trial on 2 cores).
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as session:
        loop = asyncio.get_running_loop()
        ended = {r.id: loop.create_future() for r in requests}
        t0 = time.perf_counter()

        async def on_time(req: Request) -> float:
            intended = req.offset_s
            if req.after is not None:
                intended = await ended[req.after] + req.offset_s
            delay = intended - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            return intended

        # Closed loop: a slot is held by a whole chain (an agent session: its root and every turn
        # after it), so a session's next turn never queues behind sessions that have not started.
        root: dict[str, str] = {}
        for r in requests:
            root[r.id] = root[r.after] if r.after in root else r.id
        last_of = {root[r.id]: r.id for r in requests}
        holding: set[str] = set()  # chains that hold a slot

        async def run(req: Request) -> RequestRecord:
            try:
                if gate is None or req.after is not None:
                    record = await _one(session, url, model, req, await on_time(req), t0)
                else:
                    await on_time(req)
                    await gate.acquire()
                    holding.add(req.id)
                    # Closed loop: the request is intended the moment its slot frees.
                    record = await _one(session, url, model, req, time.perf_counter() - t0, t0)
            finally:
                if not ended[req.id].done():
                    ended[req.id].set_result(time.perf_counter() - t0)
                if root[req.id] in holding and last_of[root[req.id]] == req.id:
                    holding.discard(root[req.id])
                    gate.release()
            return record

        side = asyncio.ensure_future(during(t0)) if during else None
        finished: list[RequestRecord] = []
        stopped, stopped_at = "", 0.0
        tasks = [asyncio.ensure_future(run(r)) for r in requests]
        try:
            for next_done in asyncio.as_completed(tasks):
                finished.append(await next_done)
                if stop_when is not None and len(finished) < len(tasks):
                    stopped = stop_when(finished) or ""
                    if stopped:
                        stopped_at = time.perf_counter() - t0
                        break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if side is not None:
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)
    order = {r.id: i for i, r in enumerate(requests)}
    records = sorted(finished, key=lambda rec: order[rec.id])  # the workload's order, as before
    first = min((r.sent_s for r in records), default=0.0)
    last = max((r.end_s or r.sent_s for r in records), default=0.0)
    return ReplayResult(tuple(records), max(last - first, 1e-9), stopped, stopped_at)


def run_replay(base_url: str, model: str, requests: tuple[Request, ...], concurrency: int | None,
               request_timeout: float = 600.0, during=None, stop_when=None) -> ReplayResult:
    """Synchronous entry point (Ray tasks cannot be `async def`)."""
    return asyncio.run(replay(base_url, model, requests, concurrency, request_timeout, during, stop_when))
