"""The twin on published GPU measurements (bench/data/published_vllm.csv), beside the mean estimate
`plan --what-if` uses, on the same rows: what the twin's GPU path (vLLM's scheduler with the
device's defaults and the roofline's KV pool: optimizer/twin/gpu/server.py) adds over a mean, with each of
its two step costs: aiconfigurator-core's per-operation timings (where the library has the device)
and the roofline's.

Each row's load as its source describes it: `concurrency` requests in flight (or sent at once, a
burst) of its prompt and output lengths; its server: its TP, memory fraction and KV dtype. TTFT and
TPOT are the twin's means, as the rows state theirs. Two choices the rows leave open, with flags to
see what they change:
- `--waves 10`: a closed loop replays 10 x concurrency requests (at least 64, at most 2,048): the
  rows report a steady state, and the first wave, all sent at once, would weigh on the mean TTFT
  of a short replay (a burst is its own requests);
- `--spread 0.2`: the rows give one prompt and one output length. Fed identical requests sent at
  one instant, the twin keeps a closed loop in lockstep for ever (every request finishes in the
  same step and the next wave's prompts all prefill together), where a real client and front end
  send them milliseconds apart and the waves drift apart. So the output lengths spread uniformly
  within +-20% of the row's, the mean kept; `--spread 0` is the lockstep.
A burst whose notes say its server had some of its prompts in the prefix cache before it (the A100
rows: `benchmark_serving.py` sends prompt 0 once as a test first, and a server that had run the same
seed before holds that run's prompts, which the engine log's hit rate shows) is replayed after
those prompts, as its server met it; `--cold` replays every burst on an empty cache.
Rows the roofline's efficiencies were fitted on (aiconfigurator's own measurements) are reported
apart from those never fitted on.

    .venv/bin/python bench/twin_published.py [--spread 0.2] [--waves 10] [--cold]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whatif_rows import cases  # noqa: E402

from optimizer.config.model_info import load_model_info  # noqa: E402
from optimizer.errors import OptimizerError  # noqa: E402
from optimizer.measure.metrics import summarize  # noqa: E402
from optimizer.twin.gpu.server import gpu_twin  # noqa: E402
from optimizer.whatif import architecture  # noqa: E402
from optimizer.whatif.predict import predict  # noqa: E402
from optimizer.workload.base import Request  # noqa: E402

METRICS = ("ttft_s", "tpot_s", "throughput")
ANSWERS = ("twin, library", "twin, roofline", "mean estimate")


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


def _requests(isl: int, osl: int, n: int, spread: float) -> tuple:
    """n requests of `isl` prompt tokens and `osl` output tokens, or, with a spread, output lengths
    uniform within +-spread of it (the mean kept)."""
    rng = random.Random(0)
    return tuple(Request(f"req-{i}", tuple(rng.randrange(100, 30000) for _ in range(isl)),
                         max(1, round(osl * rng.uniform(1 - spread, 1 + spread))), 0.0) for i in range(n))


WARM = "cached-before-"
AFTER_S = 3600.0  # the burst is sent this long after the warm-up, which has long finished by then


def _after_warm_cache(requests: tuple, cached: int) -> tuple:
    """The burst as its server met it: the first `cached` of its prompts sent first, one token each, so
    that they sit in the prefix cache (vLLM keeps a finished request's blocks cached until it needs them),
    then the burst itself, AFTER_S later."""
    warm = tuple(replace(r, id=f"{WARM}{r.id}", max_tokens=1) for r in requests[:cached])
    return warm + tuple(replace(r, offset_s=AFTER_S) for r in requests)


def _window(result) -> float:
    """The burst's own first send -> last completion, over the requests that finished (as the twin's own
    window is); the warm-up must have finished before the burst was sent."""
    warm = [r for r in result.records if r.id.startswith(WARM)]
    burst = [r for r in result.records if not r.id.startswith(WARM) and r.ok]
    if not burst or any(not r.ok or r.end_s > AFTER_S for r in warm):
        raise OptimizerError("the cached prompts' warm-up did not finish before the burst, or no request of it did")
    return max(r.end_s for r in burst) - min(r.sent_s for r in burst)


def twin_row(case, root: Path, use_library: bool, spread: float, waves: int, cold: bool = False) -> dict:
    model = load_model_info(str(_model_dir(case.source, root)), "auto")
    load = case.load
    params = {"max-num-seqs": case.serving.max_num_seqs, "gpu-memory-utilization": case.serving.utilization,
              "kv-cache-dtype": case.serving.kv_dtype, "tensor-parallel-size": case.tp}
    server, cost, why_not = gpu_twin(model, case.arch(), case.spec(), params, load.isl + load.osl, use_library)
    if use_library and why_not:
        return {}
    n = load.concurrency if load.burst else min(2048, max(64, waves * load.concurrency))  # a burst is its requests
    requests = _requests(load.isl, load.osl, n, spread)
    if case.cached and load.burst and not cold:
        sim = server.run(_after_warm_cache(requests, case.cached), None, cost)
        m = summarize(replace(sim.result, records=tuple(r for r in sim.result.records if not r.id.startswith(WARM)),
                              window_s=_window(sim.result)))
    else:
        m = summarize(server.run(requests, None if load.burst else load.concurrency, cost).result)
    return {"ttft_s": m["ttft_ms_mean"] / 1e3, "tpot_s": m["tpot_ms_mean"] / 1e3, "throughput": m["output_throughput"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spread", type=float, default=0.2,
                   help="output lengths uniform within +-this share of the row's (0: every request the row's length)")
    p.add_argument("--waves", type=int, default=10,
                   help="a closed loop's requests, in multiples of its concurrency (at least 64, at most 2,048)")
    p.add_argument("--cold", action="store_true", help="every burst on an empty prefix cache, whatever its notes say")
    ns = p.parse_args()
    spread, waves, cold = ns.spread, ns.waves, ns.cold
    rows = {"fitted on": [], "never fitted on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases():
            if case.skip or case.load is None:
                continue
            try:
                mean = predict(case.source, case.arch(), case.spec(), case.serving, case.load).estimate
                answers = dict(zip(ANSWERS, (twin_row(case, Path(tmp), True, spread, waves, cold),
                                             twin_row(case, Path(tmp), False, spread, waves, cold),
                                             {"ttft_s": mean.ttft_s, "tpot_s": mean.tpot_s,
                                              "throughput": mean.throughput})))
            except Exception as exc:  # noqa: BLE001 - a row vLLM cannot read here is reported, not fatal
                print(f"{case.label}: not run ({str(exc).splitlines()[0][:120]})")
                continue
            ratios = {(a, k): got[k] / case.measured[k] for a, got in answers.items() for k in got
                      if case.measured.get(k)}
            rows["fitted on" if case.library_rows else "never fitted on"].append(ratios)
            print(f"{case.label}: " + "; ".join(
                f"{k} measured {case.measured[k]:.4g}: " + ", ".join(f"{a} {got[k]:.4g}" for a, got in answers.items()
                                                                     if k in got)
                for k in METRICS if case.measured.get(k)))
    for group, found in rows.items():
        _table(f"rows the roofline was {group}", found)
        _table(f"rows the roofline was {group}, where the library answered",
               [r for r in found if any(a == ANSWERS[0] for a, _ in r)])


def _table(title: str, found: list[dict]) -> None:
    print(f"\n{title} ({len(found)}): median |error|, 90th percentile of |log(predicted / measured)| as a factor - 1 (rows)")
    print(f"  {'':<10}" + "".join(f"{a:>26}" for a in ANSWERS))
    for k in METRICS:
        cells = []
        for a in ANSWERS:
            got = [r[(a, k)] for r in found if (a, k) in r]
            cells.append(f"{statistics.median(abs(x - 1) for x in got):>11.1%} {_p90(got):>7.1%} ({len(got):>2})"
                         if got else f"{'-':>26}")
        print(f"  {k:<10}" + "".join(cells))


def _p90(ratios: list[float]) -> float:
    """The 90th percentile of |log(predicted / measured)|, as a factor - 1 (the band's own statistic)."""
    logs = sorted(abs(math.log(r)) for r in ratios)
    return math.expm1(logs[min(len(logs) - 1, math.ceil(0.9 * len(logs)) - 1)])


if __name__ == "__main__":
    main()
