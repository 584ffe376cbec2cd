"""Telling Optuna: a trial's outcome -> its Optuna state, in exactly one function (`tell`); and
`finish`, everything done when a trial's task returns (learn, gate, store its files, tell, note).

    measured, objective finite          -> COMPLETE with the objective's value(s); with SLOs on a
                                           replay objective, each SLO's excess is a constraint
                                           (<= 0 feasible), so a miss is COMPLETE and infeasible
    could not start / died under load   -> PRUNED (TPE learns from PRUNED, ignores FAIL)
    stopped early: cannot win           -> PRUNED, kind `early_stopped` (its stage values were reported)
    stopped early: an SLO constraint
    was lost beyond repair              -> COMPLETE and infeasible (value from the partial run)
    infrastructure fault (`infra`),
    untrustworthy replay (`replay_invalid`) -> FAIL (not the configuration's fault; retried)

Everything the trial measured or found goes into user attributes first (they cannot be
set after tell): metrics, phase times, failure kind, evidence and remedy.
"""

from __future__ import annotations

import math
import socket
from dataclasses import replace

import optuna

from optimizer.driver import kv_precheck as precheck
from optimizer.driver.plan import Plan
from optimizer.driver.progress import Progress
from optimizer.search.enqueue import queue_again
from optimizer.driver.store.trial_files import is_disk_failure, store_trial
from optimizer.engine.failures import RETRIED, Failure, without_fp8_remedy
from optimizer.measure import slo
from optimizer.outputs import gate as outputcheck
from optimizer.record import of_trial
from optimizer.trial.spec import TrialResult

METRIC_KEYS = (
    "output_throughput", "request_throughput", "total_token_throughput", "error_rate", "completed",
    "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p95", "itl_ms_p50", "itl_ms_p95",
    "e2el_ms_p50", "e2el_ms_p95", "e2el_ms_p99", "schedule_lag_p50_ms", "schedule_lag_p99_ms", "send_rate_ratio",
    "prefix_cache_reset", "server_metrics_read", "duration_s",
    "goodput_rate", "goodput_rps", "goodput_output_throughput", "capacity_rps", "probes", "search_s", "probe_saved_s",
    "devices",
)


def _clean(value):
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 4)
    return value


def record(trial: optuna.Trial, result: TrialResult) -> None:
    """Store what the trial measured as user attributes."""
    stop = result.stop
    of_trial.write_measured(
        trial, phases={k: round(v, 2) for k, v in result.phases.items()},
        # the CPU it got: also when it logged nothing
        startup=dict(result.startup) if result.startup.get("steps") or result.startup.get("cpu") else None,
        replay_cpu=dict(result.replay_cpu) if result.replay_cpu else None,
        metrics={k: _clean(result.metrics[k]) for k in METRIC_KEYS if k in result.metrics},
        server={k: _clean(v) for k, v in result.server.items()} if result.server else None,
        host=result.host, omp_threads=result.omp_threads,
        stop=None if stop is None else {"port": result.port, "killed": stop.killed,
                                        "leftover_pids": list(stop.leftover_pids), "port_free": stop.port_free},
        rate_search=list(result.probes) if result.probes else None,
        early_stop=dict(result.early_stop) if result.early_stop else None,
        channel=dict(result.channel) if result.channel else None)
    if result.failure:
        f = result.failure
        of_trial.write_failure(trial, f.kind, f.evidence[:1000], f.remedy, f.fits_max_model_len)


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult,
         objective) -> tuple[optuna.trial.TrialState, TrialResult]:
    """Record the result and tell Optuna; returns the state told and the result as judged
    (a run with failed requests, or without a finite objective value, gains a failure)."""
    failure = result.failure
    value = None
    if failure is None and result.early_stop and _lost_constraint(result, objective):
        return _tell_infeasible(study, trial, result, objective)
    if failure is None and result.early_stop:
        failure = early_stopped(result.early_stop)
    if failure is None:
        failure = unscored_errors(result, objective)
    if failure is None:
        try:
            value = objective.score(result.metrics)
        except ValueError as exc:
            failure = Failure("crash", str(exc), "no usable measurement: read the server log")
    if failure is not result.failure:
        result = replace(result, failure=failure)
    record(trial, result)
    if failure is None:
        if objective.slos and objective.mode == "replay":
            constrain(trial, objective.slos, result.metrics)
        fleet(trial, objective, result.metrics)
        study.tell(trial, value, skip_if_finished=True)
        return optuna.trial.TrialState.COMPLETE, result
    state = optuna.trial.TrialState.FAIL if failure.kind in RETRIED else optuna.trial.TrialState.PRUNED
    study.tell(trial, state=state, skip_if_finished=True)
    return state, result


def _lost_constraint(result: TrialResult, objective) -> bool:
    """A replay objective's SLO constraint was lost beyond repair and the run was cut."""
    return result.early_stop.get("by") == "slo" and bool(objective.slos) and objective.mode == "replay" \
        and not getattr(objective, "multi", False)


def _tell_infeasible(study: optuna.Study, trial: optuna.Trial, result: TrialResult, objective):
    """A run cut because its SLO constraint was already lost: COMPLETE and infeasible (the sampler
    learns the region is infeasible, as for a full run that missed), its value from the partial
    run (marked so), never a candidate for best."""
    record(trial, result)
    of_trial.mark_value_from_partial_run(trial)
    try:
        value = objective.score(result.metrics)
    except ValueError:
        value = 1e9  # nothing measurable yet (e.g. no multi-token output for a TPOT objective)
    constrain(trial, objective.slos, result.metrics, lost=result.early_stop.get("reason", ""))
    study.tell(trial, value, skip_if_finished=True)
    return optuna.trial.TrialState.COMPLETE, result


def constrain(trial: optuna.Trial, slos, metrics: dict, lost: str = "") -> None:
    """Each SLO's excess as an Optuna constraint (<= 0 holds): TPE learns where the feasible
    region is from these, and the best trial is the best feasible one. An SLO named in `lost`
    (the reason a run was cut) counts as violated even if the partial percentile is not over yet."""
    excess = slo.excess(slos, metrics)
    for s in slos:
        if str(s) in lost:
            excess[s.key] = max(excess[s.key], 1e-3)
    for key, value in excess.items():
        trial.set_constraint(key, value if math.isfinite(value) else 1e9)
    of_trial.write_slo_excess(trial, {k: _clean(v) for k, v in excess.items()}, all(v <= 0 for v in excess.values()))


def fleet(trial: optuna.Trial, objective, metrics: dict) -> None:
    """The fleet objective's devices for the peak (`fleet_devices`) and its budget as a constraint."""
    if objective.name != "fleet":
        return
    of_trial.write_fleet_devices(trial, objective.devices(metrics))
    for key, value in objective.constraints(metrics).items():
        trial.set_constraint(key, value)


def early_stopped(early: dict) -> Failure:
    """A trial cut short: not a failure of the configuration, but no value to tell either."""
    if early.get("by") == "slo":
        return Failure("early_stopped", f"SLO lost: {early.get('reason', '')}",
                       "this configuration cannot meet the SLOs on this workload (see slo_excess of similar trials)")
    return Failure("early_stopped", f"cannot win: {early.get('reason', '')}",
                   "nothing to fix: it could not beat the best trial so far")


def unscored_errors(result: TrialResult, objective) -> Failure | None:
    """Failed requests make a run unscored, unless the objective carries an `error` SLO: then
    the SLO judges them (as a constraint, or in the goodput search)."""
    if any(s.metric == "error" for s in getattr(objective, "slos", ())):
        return None
    return request_errors(result)


def request_errors(result: TrialResult) -> Failure | None:
    """A run where requests failed is not scored: dropping the slow requests would flatter it."""
    failed = [r for r in result.records if not r.ok]
    if not failed:
        return None
    first = failed[0]
    return Failure("request_errors", f"{len(failed)} of {len(result.records)} requests failed; first: "
                   f"HTTP {first.status} {first.error}"[:1000],
                   "read the server log; a 400 usually means a request longer than max-model-len")


def tell_infra(study: optuna.Study, trial: optuna.Trial, reason: str, evidence: str) -> None:
    """A fault outside the configuration (Ray lost the task, the driver was interrupted): FAIL."""
    record(trial, TrialResult(trial.number, Failure("infra", evidence, reason)))
    study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


def finish(study: optuna.Study, plan: Plan, r, result, progress: Progress) -> tuple:
    """Learn from the trial's start-up, store its result, tell Optuna; returns (state, failure)."""
    trial = r.trial
    precheck.learn(study, plan, r.spec.vllm_args, result, r.device)
    result = replace(result, failure=without_fp8_remedy(result.failure, plan.device.fp8_kv))
    result = outputcheck.gate(study, trial, result, plan.cfg)  # before result.json: an output_changed is in it
    if not is_disk_failure(result.failure):
        written = store_trial(plan.artifacts / f"trial-{trial.number}", r.params, result, socket.gethostname())
        if written is not None:
            result = replace(result, failure=written)  # a full disk fails the trial, not the study
        else:  # before the tell: Optuna refuses attributes on a finished trial
            progress.uploaded(trial, plan.artifacts / f"trial-{trial.number}", plan.cfg.artifacts_dir)
    state, result = tell(study, trial, result, plan.objective)
    progress.trial_done(study, trial.number, result, state, plan.objective)
    progress.noted(study, trial.number, plan.objective)
    if state == optuna.trial.TrialState.FAIL:
        disk = is_disk_failure(result.failure)
        queue_again(study, trial, always=disk, reason="disk_full" if disk else "")
    return state, result.failure


