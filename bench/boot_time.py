"""What one boot of the tiny model costs on this machine: seconds from launching vLLM's API server to
its answering, and where the start-up spends them (its own log's steps, engine/startup_log.py).

Each try boots the tiny model (random weights, eager, `--max-num-seqs 8`) as the integration tests
do, then stops it:

    one-process   VLLM_ENABLE_V1_MULTIPROCESSING=0 (optimizer/testing/one_process.py), 0.5 GiB of KV
    no-compile    the same with TORCH_COMPILE_DISABLE=1 (optimizer/testing/sampler_eager.py)
    as-vllm       vLLM as it starts itself, 0.5 GiB of KV
    default-kv    vLLM as it starts itself at its default memory fraction (its KV cache sized to the
                  node: allocating it is most of the start-up)

    .venv/bin/python bench/boot_time.py [--tries 2] [--modes one-process no-compile as-vllm default-kv]

Each mode boots once first, untimed. About 5 min with the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.engine.startup_log import startup_breakdown  # noqa: E402
from optimizer.engine.tiny_model import write_tiny_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402
from optimizer.testing.memory import memory_fraction  # noqa: E402
from optimizer.testing.one_process import ONE_PROCESS_ENV  # noqa: E402
from optimizer.testing.sampler_eager import SAMPLER_EAGER_ENV  # noqa: E402

MODES = ("one-process", "no-compile", "as-vllm", "default-kv")
ENV = {"one-process": ONE_PROCESS_ENV, "no-compile": {**ONE_PROCESS_ENV, **SAMPLER_EAGER_ENV}}


def boot(model: str, mode: str, log: Path) -> tuple[float, dict]:
    args = ["--load-format", "dummy", "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", "8", "--max-model-len", "4096"]
    if mode != "default-kv":
        args += ["--gpu-memory-utilization", str(memory_fraction(0.5))]
    t = time.monotonic()
    with VllmServer(model, args, log, env=ENV.get(mode)) as server:
        assert server.state == "ready", server.log_text()[-2000:]
        ready = time.monotonic() - t
        text = server.log_text()
    return ready, startup_breakdown(text, ready).steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=2)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ns = p.parse_args()
    if ns.tries < 1:
        p.error("--tries: at least 1")
    with tempfile.TemporaryDirectory(prefix="boot-time-") as tmp:
        root = Path(tmp)
        model = str(write_tiny_model(root / "tiny"))
        for mode in ns.modes:
            boot(model, mode, root / f"{mode}-warm.log")  # a mode's first boot fills its caches: not counted
            times, steps = [], []
            for i in range(ns.tries):
                ready, s = boot(model, mode, root / f"{mode}-{i}.log")
                times.append(ready)
                steps.append(s)
            print(f"{mode:<12} ready in {statistics.median(times):5.1f} s (median of {ns.tries}: "
                  f"{', '.join(f'{x:.1f}' for x in times)}); steps of the last: "
                  + ", ".join(f"{k} {v:.0f} s" for k, v in steps[-1].items()), flush=True)


if __name__ == "__main__":
    main()
