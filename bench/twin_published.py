"""The twin on published GPU measurements (bench/data/published_vllm.csv), beside the mean estimate
`plan --what-if` uses, on the same rows: what the twin's GPU path (vLLM's scheduler with the
device's defaults, the roofline's KV pool and step cost: optimizer/twin/gpu.py) adds over a mean.

Each row's load as its source describes it: `concurrency` requests in flight (or sent at once, a
burst) of its prompt and output lengths; its server: its TP, memory fraction and KV dtype. The
twin replays 4 x concurrency requests (at least 64, at most 1,024; a burst: its own requests) of
exactly those lengths: the
published rows give fixed lengths, not distributions. TTFT and TPOT are the twin's means, as the
rows state theirs. Rows the roofline's efficiencies were fitted on (aiconfigurator's own
measurements) are reported apart from those never fitted on.

    .venv/bin/python bench/twin_published.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whatif_rows import cases  # noqa: E402

from optimizer.config.model_info import load_model_info  # noqa: E402
from optimizer.errors import OptimizerError  # noqa: E402
from optimizer.measure.metrics import summarize  # noqa: E402
from optimizer.twin.gpu import gpu_twin  # noqa: E402
from optimizer.whatif import architecture  # noqa: E402
from optimizer.whatif.predict import predict  # noqa: E402
from optimizer.workload.base import Request  # noqa: E402

METRICS = ("ttft_s", "tpot_s", "throughput")


def _model_dir(source: str, root: Path) -> Path:
    """A directory holding the model's config.json (vLLM's config classes read a directory)."""
    local = Path(source)
    if (local / "config.json").is_file():
        return local
    bundled = architecture.bundled_config(source)
    if bundled is None:
        raise OptimizerError(f"no config.json for {source}")
    d = root / source.replace("/", "--")
    d.mkdir(parents=True, exist_ok=True)
    cfg = json.loads(bundled.read_text())
    cfg.pop("quantization_config", None)  # the twin schedules; the roofline reads the quantization itself
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _requests(isl: int, osl: int, n: int) -> tuple:
    rng = random.Random(0)
    return tuple(Request(f"req-{i}", tuple(rng.randrange(100, 30000) for _ in range(isl)), osl, 0.0) for i in range(n))


def twin_row(case, root: Path) -> dict:
    model = load_model_info(str(_model_dir(case.source, root)), "auto")
    load = case.load
    params = {"max-num-seqs": case.serving.max_num_seqs, "gpu-memory-utilization": case.serving.utilization,
              "kv-cache-dtype": case.serving.kv_dtype, "tensor-parallel-size": case.tp}
    server, cost = gpu_twin(model, case.arch(), case.spec(), params, load.isl + load.osl)
    n = load.concurrency if load.burst else min(1024, max(64, 4 * load.concurrency))  # a burst is its requests
    sim = server.run(_requests(load.isl, load.osl, n), None if load.burst else load.concurrency, cost)
    m = summarize(sim.result)
    return {"ttft_s": m["ttft_ms_mean"] / 1e3, "tpot_s": m["tpot_ms_mean"] / 1e3, "throughput": m["output_throughput"]}


def main() -> None:
    rows = {"fitted on": [], "never fitted on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases():
            if case.skip or case.load is None:
                continue
            try:
                twin = twin_row(case, Path(tmp))
                mean = predict(case.source, case.arch(), case.spec(), case.serving, case.load).estimate
            except Exception as exc:  # noqa: BLE001 - a row vLLM cannot read here is reported, not fatal
                print(f"{case.label}: not run ({str(exc).splitlines()[0][:120]})")
                continue
            ana = {"ttft_s": mean.ttft_s, "tpot_s": mean.tpot_s, "throughput": mean.throughput}
            errs = {}
            for k in METRICS:
                if case.measured.get(k):
                    errs[k] = (abs(twin[k] / case.measured[k] - 1), abs(ana[k] / case.measured[k] - 1))
            rows["fitted on" if case.library_rows else "never fitted on"].append(errs)
            print(f"{case.label}: " + ", ".join(f"{k} twin {twin[k]:.4g} mean {ana[k]:.4g} measured "
                                                 f"{case.measured[k]:.4g}" for k in errs))
    for group, found in rows.items():
        print(f"\nrows the roofline was {group} ({len(found)}): median |error| twin / mean estimate")
        for k in METRICS:
            pairs = [e[k] for e in found if k in e]
            if pairs:
                print(f"  {k:<10} {statistics.median(p[0] for p in pairs):>7.1%} / "
                      f"{statistics.median(p[1] for p in pairs):>7.1%}  ({len(pairs)} rows)")


if __name__ == "__main__":
    main()
