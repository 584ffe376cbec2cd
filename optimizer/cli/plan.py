"""`plan`: the replicas and GPUs a peak load needs, from the study's measured best, and with
`--what-if`, predicted rows for devices the study never ran on (optimizer/whatif/).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import NamedTuple

from optimizer.cli.common import STUDY_FLAGS, add_flags, load
from optimizer.cli.whatif_args import WhatIfArgs, parse_whatif
from optimizer.errors import ConfigError, OptimizerError
from optimizer.fleet.scaling import for_trial
from optimizer.measure.slo import describe as describe_slos
from optimizer.measure.slo import parse_slos
from optimizer.record import of_trial
from optimizer.fleet.capacity import check_inputs, measurement_from_study, plan, topology_plans
from optimizer.report.capacity import describe, describe_topologies

NAME = "plan"


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="replicas and GPUs the best configuration needs for a peak load")
    p.add_argument("--config", help="study YAML (its storage and study_name; see examples/quickstart.yaml)")
    p.add_argument("--storage", help="SQLAlchemy URL (default sqlite:///trials.db)")
    p.add_argument("--study-name")
    p.add_argument("--peak-qps", type=float, required=True, help="peak requests/s to serve")
    p.add_argument("--tokens-per-request", type=float, required=True,
                   help="mean tokens per request at peak, prompt + output")
    p.add_argument("--headroom", type=float, default=0.3,
                   help="share of each replica's measured rate kept free (default 0.3)")
    p.add_argument("--trial", type=int, help="plan on this trial (e.g. a Pareto front member), not the best")
    p.add_argument("--slo", help="SLOs the plan must keep, as for run ('ttft:500 tpot:50'); checked against "
                   "the measured run")
    p.add_argument("--what-if", help="devices to predict for, comma-separated (h100,l4,h200; see docs/what-if.md "
                   "for the table, or describe one in config whatif.devices)")
    p.add_argument("--tp", help="tensor-parallel sizes to predict, comma-separated (default: those of 1,2,4,8 "
                   "that divide the model's attention heads)")
    p.add_argument("--dp", help="data-parallel sizes to predict for the configuration planned on, where the study "
                   "did not measure them, comma-separated, or none (default 2,4 for a study on a GPU, none on a CPU, "
                   "where the twin's DP is optimistic: docs/twin.md)")
    p.add_argument("--price", help="cost per device-hour, e.g. h100=2.5,l4=0.8: rows then sort by cost")
    p.add_argument("--output-tokens", type=int, help="mean output tokens a request (default: the measured run's "
                   "share of --tokens-per-request)")
    p.add_argument("--manifests", help="write Kubernetes manifests (a Deployment of the planned replicas and its "
                   "Service) to this file")
    p.add_argument("--measured-on", help="the device table's name for the GPU the study ran on, when the study "
                   "does not record it (for the calibration)")
    add_flags(p, *STUDY_FLAGS)
    return p


def main(ns: argparse.Namespace, console) -> int:
    """`python -m optimizer plan`: print the plan; raises OptimizerError for bad input or storage."""
    from optimizer.driver.store.finished_study import open_finished  # noqa: PLC0415

    check_inputs(ns.peak_qps, ns.tokens_per_request, ns.headroom)  # before the study is opened
    alone = [f for f, v in (("--tp", ns.tp), ("--price", ns.price), ("--output-tokens", ns.output_tokens),
                            ("--measured-on", ns.measured_on)) if v is not None and not ns.what_if]
    if alone:
        raise ConfigError(f"{alone[0]} goes with --what-if (the predicted rows); add --what-if DEVICES, or drop it")
    if ns.dp is not None and ns.what_if:
        raise ConfigError("--dp goes without --what-if (it predicts data parallelism on the study's own device); "
                          "drop one of them")
    dp_sizes = parse_dp(ns.dp)
    slos = parse_slos(ns.slo)
    cfg = load(ns)
    whatif = parse_whatif(ns, cfg) if ns.what_if else None  # every bad flag refused before the study is read
    if whatif is None:
        finished = open_finished(cfg, check_objective=False)  # --slo here asks, it does not relabel
        m = measurement_from_study(finished.study, ns.trial, slos)
        p = plan(m, ns.peak_qps, ns.tokens_per_request, ns.headroom, for_trial(finished.study, m.trial))
        _print(console, describe(p))
        tail_lines, twin = _tails(cfg, finished.study, p, slos or parse_slos(cfg.objective.slos), ns.trial)
        _print(console, tail_lines)
        measured = _topologies(ns, console, finished.study, slos, parse_slos(cfg.objective.slos))
        _print(console, _predicted_topologies(twin, finished.study, p, slos or parse_slos(cfg.objective.slos),
                                              measured, dp_sizes))
        _manifests(ns, console, finished, p)
        return 0
    study, measured = None, None
    try:
        finished = open_finished(cfg, check_objective=False)
        study = finished.study
        m = measurement_from_study(study, ns.trial, slos)
        measured = plan(m, ns.peak_qps, ns.tokens_per_request, ns.headroom, for_trial(study, m.trial))
        _print(console, describe(measured))
    except ConfigError as exc:
        console.print(f"Measured: none ({exc})", markup=False)
    if measured is not None:
        _manifests(ns, console, finished, measured)
    elif ns.manifests:
        console.print("Manifests: not written (no measured plan to size them on)", markup=False)
    slos = slos or parse_slos(cfg.objective.slos)  # the study's own, as its config gives them
    _print(console, _whatif_lines(whatif, ns, study, measured, slos))
    return 0


def _whatif_lines(w: WhatIfArgs, ns, study, measured, slos) -> list[str]:
    from optimizer.report.capacity import describe_row_tails  # noqa: PLC0415
    from optimizer.whatif.table import describe as describe_whatif  # noqa: PLC0415
    from optimizer.whatif import calibration, fleet_rows  # noqa: PLC0415
    from optimizer.whatif.study_calibration import from_study  # noqa: PLC0415

    isl, osl = w.lengths(ns.tokens_per_request, ns.output_tokens, study, measured)
    cal = (from_study(study, w.source, w.arch, ns.measured_on) if study is not None else
           calibration.none("no study to calibrate on"))
    serving = w.serving(study, measured)
    rows = fleet_rows.rows(w.source, w.arch, w.devices, w.tps, serving, isl, osl, cal, slos, ns.peak_qps,
                           ns.headroom, w.prices)
    rows, twin_note = _through_twin(ns, w, rows, serving, slos)
    header = (f"What-if: {w.arch.name}, {isl:,} prompt + {osl:,} output tokens a request, max-num-seqs "
              f"{serving.max_num_seqs}, gpu-memory-utilization {serving.utilization:g}, kv-cache-dtype "
              f"{serving.kv_dtype}; peak {ns.peak_qps:g} req/s, headroom {ns.headroom:.0%}")
    lines = describe_whatif(rows, cal, header, describe_slos(slos) if slos else "")
    lines[-1:-1] = [twin_note, *describe_row_tails(rows)]  # before the closing "every row above is predicted"
    return lines


def _through_twin(ns, w: WhatIfArgs, rows, serving, slos):
    """Each row the twin can answer on the study's own workload, and a line saying what answered.
    The mean estimate's row stays where the twin cannot (its note says why)."""
    from optimizer.driver.plan import load_workload  # noqa: PLC0415
    from optimizer.twin.gpu.whatif_rows import twin_row  # noqa: PLC0415

    try:
        model, workload = load_workload(load(ns))
    except OptimizerError as exc:
        return rows, f"  the twin did not answer ({exc}); every row is the mean estimate"
    params = {"max-num-seqs": serving.max_num_seqs, "gpu-memory-utilization": serving.utilization,
              "kv-cache-dtype": serving.kv_dtype}
    try:
        answers = [twin_row(model, w.arch, r, params, workload.requests, workload.concurrency, slos, ns.peak_qps,
                            ns.headroom, w.prices.get(r.device.name), workload.longest_request()) for r in rows]
    except OptimizerError as exc:  # vLLM's config classes cannot read the model here (a Hub id offline, say)
        return rows, f"  the twin did not answer ({exc}); every row is the mean estimate"
    out = [row for row, _ in answers]
    why = sorted({reason for _, reason in answers if reason})
    out.sort(key=lambda r: (not r.usable, r.cost_per_h if r.cost_per_h is not None else math.inf, r.devices, r.ttft_s))
    reqs = len(workload.requests)
    return out, (f"  rows by the twin: the study's {workload.name} workload ({reqs} requests) through vLLM's "
                 "scheduler at rising rates, its TTFT and TPOT p95s; other rows: the mean estimate"
                 + (f" (the twin did not answer: {'; '.join(why)})" if why else ""))


class PlannedTwin(NamedTuple):
    """The twin that answered for the configuration planned on, for the predicted topologies."""

    server: object  # its TwinServer
    cost: object  # the step cost fitted on the study's runs
    requests: tuple  # the study's workload
    table: dict  # its band (metric -> share)
    kind: str  # the device it was calibrated on ("cpu" or "gpu")


def _tails(cfg, study, p, slos, trial: int | None) -> tuple[list[str], PlannedTwin | None]:
    """Tails at peak and the knee of the configuration planned on, from the twin calibrated on the
    study's own runs (twin/peak/tails.py); one line saying why not when the twin cannot answer. With the
    lines, the twin that answered, or None."""
    from optimizer.driver.plan import prepare  # noqa: PLC0415
    from optimizer.report.capacity import describe_tails  # noqa: PLC0415
    from optimizer.trial.rate_search import nominal_rate  # noqa: PLC0415
    from optimizer.twin import envelope  # noqa: PLC0415
    from optimizer.twin.from_study import calibrate, stored_runs  # noqa: PLC0415
    from optimizer.twin.prediction import BAND, BAND_ONE_RUN  # noqa: PLC0415
    from optimizer.twin.server import TwinServer  # noqa: PLC0415
    from optimizer.twin.peak.tails import TAILS, tails  # noqa: PLC0415

    rate = p.peak_qps / p.replicas
    try:
        plan_ = prepare(cfg)
        runs = stored_runs(plan_.artifacts)
        cal = calibrate(plan_, runs)
        params = _planned_knobs(study, p.measurement.trial, trial)
        same = next((r for r in runs if r.params == params), None)
        server = TwinServer.from_flags(plan_.model, plan_.server_args(params), plan_.device,
                                       same.log_text if same else "", cal.kv_calibration)
        table = BAND_ONE_RUN if len(cal.runs) == 1 else BAND
        got = tails(server, cal.cost, plan_.workload.requests, rate, slos)
        # the rate against the study's own schedule, as simulate's (a closed loop has none to compare)
        why = tuple(envelope.outside(server.shape, [s.shape for s in cal.servers], params, rate,
                                     nominal_rate(plan_.workload.requests), batch=got.server.get("running_peak"),
                                     calibrated_batch=cal.largest_batch))
        k = 2 if why else 1  # doubled outside the validated envelope, as simulate's
        got = replace(got, outside=why, bands={m: (v / (1 + k * table[m]), v * (1 + k * table[m]))
                                               for m, v in got.metrics.items() if m in TAILS})
    except OptimizerError as exc:
        return [f"Tails at peak: not predicted ({str(exc).removeprefix('simulate: ')})"], None
    except (ValueError, KeyError, RuntimeError) as exc:  # vLLM's config classes on flags the twin does not model
        return [f"Tails at peak: not predicted (the twin could not run this configuration: "
                f"{type(exc).__name__}: {str(exc)[:200]})"], None
    return (describe_tails(got, p.measurement.trial, [r.number for r in cal.runs]),
            PlannedTwin(server, cal.cost, plan_.workload.requests, table, plan_.device.kind))


def parse_dp(text: str | None) -> tuple[int, ...] | None:
    """`--dp`: sizes of 2 or more, comma-separated, or none; None when not given (the device decides);
    ConfigError naming the fix."""
    if text is None:
        return None
    if text.strip().lower() in ("none", "0", ""):
        return ()
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ConfigError(f"--dp {text!r}: give data-parallel sizes as whole numbers, comma-separated, e.g. 2,4 "
                          "(or none)") from None
    if any(n < 2 for n in sizes):
        raise ConfigError(f"--dp {text!r}: give data-parallel sizes of 2 or more (one engine is the plan itself), "
                          "e.g. 2,4, or none")
    return tuple(sizes)


def _predicted_topologies(twin, study, p, slos, measured: set[str], dp_sizes: tuple[int, ...] | None) -> list[str]:
    """Data-parallel sizes the study did not measure, for the single engine planned on (twin/peak/topologies.py),
    and where tensor-parallel sizes are predicted. `dp_sizes` None: 2 and 4 on a GPU, none on a CPU."""
    from optimizer.report.capacity import describe_predicted_topologies  # noqa: PLC0415
    from optimizer.twin.peak.topologies import CPU_CHECKED, DEFAULT_SIZES, predicted_dp  # noqa: PLC0415

    m = p.measurement
    if twin is None or dp_sizes == ():
        return []
    server, cost, requests, table, kind = twin
    tp_line = _tp_line(study, m.device or kind)
    on_cpu = (m.device or kind) == "cpu"
    if dp_sizes is None and on_cpu:
        return ["Predicted topologies: data parallelism not predicted on a CPU unless asked (--dp 2,4): "
                + CPU_CHECKED, f"  {tp_line}"]
    if m.gpus_per_replica > 1:
        return [f"Predicted topologies: none (the plan rests on {m.gpus_per_replica} devices a replica; the twin "
                "predicts data parallelism from a single engine)"]
    if server.config.model_config.is_moe:
        return ["Predicted topologies: data parallelism not predicted for a mixture-of-experts model (vLLM runs its "
                "DP engines in lockstep there, which the twin does not model)", f"  {tp_line}"]
    sizes = [n for n in (dp_sizes or DEFAULT_SIZES) if f"DP {n}" not in measured]
    if not sizes:
        return [f"Predicted topologies: every data-parallel size asked was measured; {tp_line}"]

    def dp_plan(ratio: float, n: int):  # N engines a replica, each carrying what the measured one did x ratio / N
        if ratio <= 0:
            return None
        return plan(replace(m, value=m.value * ratio, gpus_per_replica=n, tensor_parallel_size=1), p.peak_qps,
                    p.tokens_per_request, p.headroom, p.scaling)

    def peak_for(ratio: float, n: int) -> float:  # each replica's share of the peak
        planned = dp_plan(ratio, n)
        return p.peak_qps / planned.replicas if planned is not None else p.peak_qps

    try:
        rows = predicted_dp(server, cost, requests, slos, sizes, peak_for, table)
    except (OptimizerError, ValueError, KeyError, RuntimeError) as exc:  # as _tails: flags the twin cannot run
        return [f"Predicted topologies: not predicted (the twin could not run them: {type(exc).__name__}: "
                f"{str(exc)[:200]})", f"  {tp_line}"]
    return describe_predicted_topologies([(r, dp_plan(r.ratio, r.size)) for r in rows], p.measurement.trial,
                                         tp_line, CPU_CHECKED if on_cpu else "")


def _tp_line(study, kind: str) -> str:
    """Where tensor-parallel sizes the study did not measure are predicted, or why they are not (`kind`:
    the device the study ran on, as it recorded it, else the one `plan` runs on)."""
    from optimizer.whatif.study_calibration import measured_device  # noqa: PLC0415

    if kind == "cpu":
        return ("TP: not predicted on CPU (the twin's step cost was fitted on this server's own cores; tensor "
                "parallelism splits them, at a cost no run here measured): measure it (docs/fleet.md)")
    try:
        ran_on = measured_device(study, None)
    except (ConfigError, ValueError):
        ran_on = "the device is not recorded"
    if isinstance(ran_on, str):
        return (f"TP: `plan --what-if DEVICE --tp 2,4` predicts tensor-parallel sizes ({ran_on}; "
                "--measured-on names it)")
    return (f"TP: `plan --what-if {ran_on.name} --tp 2,4` predicts tensor-parallel sizes on the study's own "
            "device, its step cost corrected by the study's runs")


def _planned_knobs(study, planned: int, asked: int | None) -> dict:
    """The knobs of the configuration the plan rests on: the recommendation's (a minimal change may
    have put knobs back), or the asked trial's."""
    from optimizer.config.flags import from_cli_args  # noqa: PLC0415
    from optimizer.verdict.recommendation import recommend  # noqa: PLC0415
    from optimizer.verdict.trials import knobs_of  # noqa: PLC0415

    rec = recommend(study) if asked is None else None
    return from_cli_args(list(rec.args)) if rec is not None else knobs_of(study.trials[planned])


def _topologies(ns, console, study, slos, study_slos) -> set[str]:
    """With no --trial and more than one topology measured: a plan for each, fewest devices first.
    Returns the labels of the topologies measured."""
    rows = topology_plans(study, slos, ns.peak_qps, ns.tokens_per_request, ns.headroom, study_slos)
    if ns.trial is None and len(rows) > 1:
        _print(console, describe_topologies(rows))
    return {label for label, _, _ in rows}


def _manifests(ns, console, finished, p) -> None:
    """`--manifests FILE`: the planned replicas of the configuration the plan rests on, as a Deployment
    and a Service (fleet/manifests.py)."""
    if not ns.manifests:
        return
    from pathlib import Path  # noqa: PLC0415

    from optimizer.deploy.k8s import write_manifests  # noqa: PLC0415
    from optimizer.verdict.recommendation import recommend  # noqa: PLC0415

    trial = finished.study.trials[p.measurement.trial]
    rec = recommend(finished.study) if ns.trial is None else None
    args = list(rec.args) if rec is not None else of_trial.vllm_args(trial)
    path = write_manifests(Path(ns.manifests), finished.study, finished.model, args, trial, p.replicas)
    if path is None:
        raise ConfigError(f"--manifests {ns.manifests}: cannot write it; give a writable file path")
    console.print(f"Manifests: {path} (Deployment of {p.replicas} replica(s), Service; kubectl apply -f {path})",
                  markup=False)


def _print(console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, markup=False)
