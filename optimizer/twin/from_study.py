"""A twin calibrated on a study's own runs: the trials' stored request records, nothing booted.

A study keeps, per trial, `artifacts/<study>/trial-<n>/requests.jsonl` (every measured request's
send, first-chunk and end times), `result.json` (its parameters) and `server.log` (whose "KV cache
size: N tokens" line sizes the twin's pool exactly), and the baseline's `step_probe.json` (its
step probe, twin/probe.py: decode batches its workload run may not have varied, one calibration
run per group). The calibration takes the baseline (trial 0),
where the study measured another KV dtype the first complete trial of each, and, when none of
those ever ran two sequences at once, the trial that ran the most: at most 3 runs. A trial
measured by a rate search (goodput) replayed
several schedules and is not used; nor is a failed or early-stopped one.

The fitted step cost is kept beside the trials (`twin.json`) with the trial numbers and the
workload's hash it rests on, and fitted again when they change.

A study that ran on a GPU also corrects that GPU's what-if step cost (`correct_gpu`,
twin/gpu/correction.py): the same runs, replayed through the GPU twin of each.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from optimizer.config import kv_fit, topology
from optimizer.config.flags import from_cli_args
from optimizer.errors import ConfigError
from optimizer.twin import probe, step_cost
from optimizer.twin.fit import MeasuredRun, fit
from optimizer.twin.server import TwinServer
from optimizer.twin.step_cost import LinearStepCost, is_fp8

MAX_RUNS = 3
CACHE = "twin.json"
FIT_VERSION = 3  # bumped when the fit or the step-cost terms change: a stored fit is then redone


@dataclass(frozen=True)
class StoredRun:
    number: int
    params: dict
    records: list[dict]
    log_text: str
    running_peak: float | None = None  # the most sequences its server ran at once (/metrics), when read
    probe: tuple = ()  # the step probe's timings, per group (twin/probe.py), where the trial sent it

    @property
    def kv_dtype(self) -> str:
        return str(self.params.get("kv-cache-dtype") or "auto")


@dataclass
class Calibrated:
    cost: LinearStepCost
    runs: list[StoredRun]
    servers: list[TwinServer]
    error: float  # median |log(simulated / measured)| of the calibration runs' TTFTs and spans
    seconds: float
    kv_calibration: kv_fit.Calibration | None

    simulated_peaks: tuple = ()  # the most sequences the twin's run of each calibration run held, at its send times

    @property
    def largest_batch(self) -> float:
        """The most sequences a calibration run's steps held: the larger of its running peak read on
        /metrics (sampled, so it may miss the top) and the twin's own run of it (exact, as a
        prediction's is); its max-num-seqs where neither is known. The envelope's batch rule compares
        a prediction's running peak with it."""
        peaks = []
        for r, s, simulated in zip_longest(self.runs, self.servers, self.simulated_peaks):
            seen = [p for p in (r.running_peak, simulated) if p is not None]
            peaks.append(max(seen) if seen else s.shape.max_num_seqs)
        return max(peaks)


def stored_runs(artifacts: Path) -> list[StoredRun]:
    """The study's complete, fully replayed trials, by number."""
    runs = []
    for result in sorted(Path(artifacts).glob("trial-*/result.json"), key=lambda p: _number(p.parent.name)):
        try:
            body = json.loads(result.read_text())
            lines = (result.parent / "requests.jsonl").read_text().splitlines()
        except (OSError, ValueError):
            continue
        if body.get("failure") or body.get("rate_search") or body.get("early_stop"):
            continue
        log = result.parent / "server.log"
        runs.append(StoredRun(int(body["trial"]), dict(body["params"]), [json.loads(x) for x in lines if x.strip()],
                              log.read_text(errors="replace") if log.exists() else "",
                              (body.get("server") or {}).get("running_peak"), _probe(result.parent)))
    return runs


def _probe(trial_dir: Path) -> tuple:
    try:
        return tuple(json.loads((trial_dir / "step_probe.json").read_text()).get("groups") or ())
    except (OSError, ValueError, AttributeError):
        return ()


def _number(name: str) -> int:
    try:
        return int(name.removeprefix("trial-"))
    except ValueError:
        return 1 << 30


def choose(runs: list[StoredRun]) -> list[StoredRun]:
    """The baseline (the lowest number), then the first run of each KV dtype it did not have, then,
    when none of those held two sequences in a step, the run that held the most: runs at one
    sequence cannot split a step's fixed cost from its cost per sequence (docs/twin.md, "Fitting").
    Where the batch moved in the chosen runs, another batch was measured to add noise rather than
    accuracy (BENCHMARKS.md), so none is added. Only runs of one engine on one rank are chosen
    where there are any: the step cost is one engine's, and a run with tensor, pipeline or data
    parallel ranks (a fleet study's) would fit the cost of another server into it."""
    single = [r for r in runs if topology.ranks(r.params) == 1]
    runs = single or runs
    chosen, dtypes = [], set()
    for r in runs:
        family = "fp8" if is_fp8(r.kv_dtype) else "16-bit"
        if family not in dtypes and len(chosen) < MAX_RUNS:
            chosen.append(r)
            dtypes.add(family)
    if len(chosen) < MAX_RUNS and chosen and all(r.running_peak is not None and r.running_peak <= 1 for r in chosen):
        most = max((r for r in runs if r not in chosen), key=lambda r: r.running_peak or 0, default=None)
        if most is not None and (most.running_peak or 0) > 1:
            chosen.append(most)
    return chosen


def measured_run(plan, run: StoredRun) -> tuple[MeasuredRun, TwinServer]:
    server = TwinServer.from_flags(plan.model, plan.server_args(run.params), plan.device, run.log_text)
    return MeasuredRun(f"trial {run.number}", server, *_sent(plan, run)), server


def probe_runs(plan, run: StoredRun, server: TwinServer) -> list[MeasuredRun]:
    """The run's step probe as calibration runs of its server: one per group (twin/probe.py)."""
    if not run.probe:
        return []
    groups = probe.for_server(plan.workload, plan.server_args(run.params), plan.model.max_positions)
    return probe.measured_runs(f"trial {run.number}", server, groups, list(run.probe))


def _sent(plan, run: StoredRun) -> tuple[tuple, list]:
    """The run's requests (the workload's, in its records' order) and what each took."""
    by_id = {r.id: r for r in plan.workload.requests}
    recs = [r for r in run.records if r.get("id") in by_id]
    times = [(r["sent_s"], r.get("first_chunk_s"), r.get("end_s"), int(r.get("output_tokens", 0)), bool(r.get("ok")))
             for r in recs]
    return tuple(by_id[r["id"]] for r in recs), times


def calibrate(plan, stored: list[StoredRun] | None = None) -> Calibrated:
    """The study's twin: a step cost fitted on its stored runs (`stored`, when the caller has read them
    already), or read back from `twin.json`."""
    runs = choose(stored_runs(plan.artifacts) if stored is None else stored)
    if not runs:
        raise ConfigError(f"simulate: no complete trial with request records under {plan.artifacts}; run the "
                          "study first (its baseline alone calibrates the twin)")
    t = time.monotonic()
    measured = [measured_run(plan, r) for r in runs]
    probed = [p for r, (_, server) in zip(runs, measured) for p in probe_runs(plan, r, server)]
    key = {"version": FIT_VERSION, "terms": list(step_cost.TERMS), "trials": [r.number for r in runs],
           "probes": len(probed), "workload": plan.workload.content_hash()}
    cost, error = _cached(plan.artifacts / CACHE, key)
    if cost is None:
        result = fit([m for m, _ in measured] + probed)
        cost, error = result.cost, result.error
        _store(plan.artifacts / CACHE, key, cost, error)
    kv_cal = None
    for r in runs:
        # every knob the server started with: a memory fraction among the config's fixed flags counts
        ran = from_cli_args(plan.server_args(r.params))
        c = kv_fit.Calibration.from_log(plan.model, plan.device, ran, r.log_text) if r.log_text else None
        kv_cal = c if kv_cal is None else kv_cal.merge(c)
    peaks = tuple(m.server.run(m.requests, None, cost, send_times=[x[0] for x in m.times]).server["running_peak"]
                  for m, _ in measured)
    return Calibrated(cost, runs, [s for _, s in measured], error, time.monotonic() - t, kv_cal, peaks)


def correct_gpu(plan, device, arch, stored: list[StoredRun]):
    """The correction of `device`'s step cost by the study's chosen runs on it (fitted each time: a
    few seconds), as (Correction, the runs' labels)."""
    from optimizer.twin.gpu import correction as gpu_correction  # noqa: PLC0415
    from optimizer.twin.gpu.server import gpu_twin  # noqa: PLC0415

    runs = choose(stored)
    if not runs:
        raise ConfigError(f"simulate: no complete trial with request records under {plan.artifacts} to correct "
                          f"{device.name}'s step cost with; run the study first")
    measured = []
    for run in runs:
        mml = int(run.params.get("max-model-len") or plan.workload.longest_request())
        server, base, _ = gpu_twin(plan.model, arch, device, run.params, mml, log_text=run.log_text)
        measured.append(MeasuredRun(f"trial {run.number}", server, *_sent(plan, run), base))
    result = fit(measured, start=gpu_correction.START, terms=gpu_correction.TERMS)
    return result.cost, result.error


def _cached(path: Path, key: dict) -> tuple[LinearStepCost | None, float]:
    try:
        body = json.loads(path.read_text())
        if body.get("key") == key:
            return LinearStepCost.from_dict(body["cost"]), float(body["error"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None, 0.0


def _store(path: Path, key: dict, cost: LinearStepCost, error: float) -> None:
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "cost": cost.as_dict(), "error": error}, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only or full disk: the fit is redone next time, nothing else is lost
