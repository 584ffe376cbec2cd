"""What a warm compile cache saves a vLLM start-up on CPU, with vLLM's AOT artifacts (its default)
and without them (what the optimizer sets on CPU: engine/compile_cache.py).

For each mode, the tiny model is booted twice with a compile cache of its own that starts empty:
the first boot compiles (cold), the second finds the cache (warm). Printed: each boot's start-up
and its torch.compile step, read from the server's log, and the cache's state.

    .venv/bin/python bench/compile_cache.py     # ~4 min on 2 cores
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARGS = ["--load-format", "dummy", "--dtype", "bfloat16", "--max-num-seqs", "16", "--gpu-memory-utilization", "0.3",
        "--max-model-len", "4096"]
MODES = {"AOT artifacts on (vLLM's default)": {"VLLM_USE_AOT_COMPILE": "1"},
         "AOT artifacts off (the optimizer on CPU)": {"VLLM_USE_AOT_COMPILE": "0"}}


def boot(model: str, env: dict, log: Path) -> tuple[float, dict]:
    from optimizer.engine.startup_log import startup_breakdown
    from optimizer.engine.vllm import VllmServer

    server = VllmServer(model, ARGS, log, env={"VLLM_SERVER_DEV_MODE": "1", **env}, startup_timeout=300)
    t = time.monotonic()
    ok = server.start()
    took = time.monotonic() - t
    server.stop()
    if not ok:
        sys.exit(f"the server did not start: {server.failure}")
    return took, startup_breakdown(server.log_text(), took).as_dict()


def main() -> None:
    from optimizer.engine.compile_cache import cache_entries, cache_state, with_cache
    from optimizer.engine.tiny_model import write_tiny_model

    work = Path(tempfile.mkdtemp(prefix="compile-cache-bench-"))
    model = str(write_tiny_model(work / "tiny"))
    for name, mode in MODES.items():
        cache = work / name.split(" (")[0].replace(" ", "-")
        env = with_cache(dict(mode), cache, inherited={})
        for which in ("cold", "warm"):
            before = cache_entries(env)
            took, startup = boot(model, env, cache.parent / f"{cache.name}-{which}.log")
            state = cache_state(startup["compile_cache"], "compile" in startup["steps"], before, cache_entries(env))
            print(f"{name}, {which}: start-up {took:.1f} s, torch.compile {startup['steps'].get('compile', 0):.0f} s, "
                  f"cache {state}", flush=True)


if __name__ == "__main__":
    main()
