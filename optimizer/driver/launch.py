"""Launching a trial: ask Optuna (the knobs from search/), build what the task needs (TrialSpec),
start it as a Ray task. Two trials are told without a boot: one the KV precheck rules out
(PRUNED), and an exact repeat of a finished trial (search/repeats.py), which is told the finished
trial's outcome and noted `repeat_of`. Repeated measurements are made only where the confirmation
or the minimal-change step asks for them.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, replace

import optuna

from optimizer.config import topology
from optimizer.driver import kv_precheck as precheck
from optimizer.driver import tell as outcome
from optimizer.driver.plan import Plan, baseline_params
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import run_trial
from optimizer.driver import resources
from optimizer.driver.resources import ray_resources
from optimizer.driver.store.driver_lock import RunState
from optimizer.engine import cpu_cores
from optimizer.engine.compile_cache import device_env
from optimizer.engine.device import Device
from optimizer.outputs import gate as outputcheck
from optimizer.record import of_trial
from optimizer.search import prior
from optimizer.search.ask import trial_params
from optimizer.search.repeats import repeated_trial, tell_repeat
from optimizer.search.screening import RELEASE_AFTER, measured_baseline, newly_screened, queue_screening, released
from optimizer.verdict.screening import held
from optimizer.verdict.trials import best_feasible, finished_count
from optimizer.engine.failures import Failure
from optimizer.errors import first_line
from optimizer.trial.spec import TrialResult, TrialSpec
from optimizer.twin import probe as step_probe


def _baseline_value(study: optuna.Study) -> float | None:
    """What a screening trial is stopped early against: the baseline it moved from, not the best so
    far (a knob that changed nothing would be cut for trailing another knob's gain)."""
    base = measured_baseline(study)
    return base.value if base is not None else None


def _screened(study: optuna.Study, plan: Plan, progress: Progress) -> set[str]:
    """The knobs screening held at the baseline's value; said once when screening is done, and
    once when the sampler has nothing new to try among the others (all released)."""
    found = newly_screened(study)
    if found is not None:
        progress.screened(found, baseline_params(plan))
    let_go = released(study, plan.cfg.n_trials)
    if let_go:
        progress.note(f"the sampler proposed {RELEASE_AFTER} measured configurations in a row among the knobs it "
                      f"moves: from now on it moves the held ones too ({', '.join(sorted(let_go))})")
        return set()
    return held(study)


def _twin_order(plan: Plan):
    """Screening's moves in the twin's predicted order, with `search.prior: twin` (else the space's order)."""
    if plan.cfg.search.prior != "twin":
        return None
    return lambda moves: prior.order(plan, moves, baseline_params(plan))


def _proposed(trial) -> bool:
    """A configuration the sampler or screening proposed (not the baseline, a warm start the operator
    queued, or a retry): what the twin may judge before it boots."""
    return not of_trial.is_baseline(trial) and of_trial.retry_of(trial) is None and (
        of_trial.is_screen(trial) or not of_trial.queued(trial))


def _judged_by_twin(study: optuna.Study, plan: Plan, trial, params: dict, progress: Progress):
    """The twin's prediction, anchored on the baseline's run, stored and said; told PRUNED without a
    boot as `predicted_same` when the twin schedules it exactly as the baseline, or `predicted_to_lose`
    when it cannot win even at its band's favourable end (search/prior.py). None: boot it."""
    from optimizer.twin.from_study import stored_runs  # noqa: PLC0415 - the twin loads vLLM's config classes

    try:
        runs = stored_runs(plan.artifacts)  # read once: a trial finishing beside must not change the fit midway
        predicted, twin_base = prior.predict(plan, params, runs), None
        base = measured_baseline(study)
        if predicted is not None and base is not None:
            twin_base = prior.predict(plan, baseline_params(plan), runs)
            predicted = prior.anchored(predicted, twin_base, base.value)
    except Exception as exc:  # noqa: BLE001 - the prior advises; a twin that fails must not stop the study
        progress.note(f"the twin could not predict trial {trial.number} ({type(exc).__name__}: {first_line(exc)}): "
                      "booted")
        return None
    if predicted is None:
        return None
    of_trial.write_prior(trial, predicted.as_dict())
    e = prior.band(study, plan, predicted)
    best = best_feasible(study, plan.objective)
    kind, why = "predicted_to_lose", prior.loses(predicted, best, plan.objective.direction == "maximize", e)
    twin_of = (prior.same_schedule(study, plan, predicted, params, twin_base, of_trial.is_screen(trial))
               if e is not None else None)
    if twin_of is not None:
        kind, why = "predicted_same", (f"predicted, not booted: the twin schedules it step for step as trial "
                                       f"{twin_of.number}{' (the baseline)' if of_trial.is_baseline(twin_of) else ''}, "
                                       f"measured at {twin_of.value:.4g}; what it changes does not reach vLLM's "
                                       "scheduler on this workload")
    progress.predicted(trial.number, predicted, e, plan.objective.unit, booted=why is None)
    if why is None:
        return None
    state, result = outcome.tell(study, trial, TrialResult(trial.number, Failure(
        kind, why, "boot it with search.prior: none, or queue it (enqueue) to measure it")), plan.objective)
    progress.trial_done(study, trial.number, result, state, plan.objective)
    progress.noted(study, trial.number, plan.objective)
    return state, result.failure


def spec_for(trial: optuna.Trial, plan: Plan, params: dict, best: float | None = None) -> TrialSpec:
    # The baseline always runs in full: the gain is measured against it.
    # The baseline also sends the step probe: the twin calibrates on its run (twin/from_study.py).
    baseline = of_trial.is_baseline(trial)
    spec = make_spec(trial.number, plan, params, f"trial-{trial.number}",
                     early_stop=not baseline, best=best, outputs=True, probe=baseline)
    of_trial.write_vllm_args(trial, spec.vllm_args)
    return spec


def dev_mode(args: list[str]) -> dict:
    """vLLM's dev endpoints, only where the prefix cache is on: the trial empties it between warm-up
    and the measured window (POST /reset_prefix_cache needs them). They also open /sleep and
    /collective_rpc, so a server without a prefix cache does without (it listens on 127.0.0.1 either way)."""
    return {} if "--no-enable-prefix-caching" in args else {"VLLM_SERVER_DEV_MODE": "1"}


def make_spec(number: int, plan: Plan, params: dict, log_dir: str, early_stop: bool = True,
              best: float | None = None, outputs: bool = False, probe: bool = False) -> TrialSpec:
    """What a trial task needs to measure `params` (its log goes to artifacts/<study>/<log_dir>/).
    With early stop on, the trial judges its stages itself against `best` (the best feasible value
    when it starts) as well as hearing the driver's verdicts. With `outputs`, it also answers the
    output-regression prompts when the config asks (outputs/gate.py). With `probe`, it sends the
    step probe after its measured run (twin/probe.py)."""
    args = plan.server_args(params)
    env = {**dev_mode(args), **dict(plan.server_env), **plan.cfg.engine.env}
    if plan.cfg.engine.compile_cache:
        env = device_env(plan.device.kind, env)
    rp, es, search = plan.cfg.replay, plan.cfg.early_stop, plan.cfg.objective.search
    stopping = early_stop and es.enabled
    return TrialSpec(
        number=number, model=plan.model.source, params=params, vllm_args=tuple(args),
        workload=plan.workload, log_path=str(plan.artifacts / log_dir / "server.log"),
        env=tuple(env.items()), startup_timeout=plan.cfg.engine.startup_timeout_s,
        shutdown_timeout=plan.cfg.engine.shutdown_timeout_s, request_timeout=rp.request_timeout_s,
        max_lag_p50_ms=rp.max_lag_p50_ms, min_rate_ratio=rp.min_rate_ratio, metrics_poll_s=rp.metrics_poll_s,
        mode=plan.objective.mode, slos=plan.objective.slos,
        stages=es.stages if stopping and not plan.objective.multi else 0,
        stop_on_slo=stopping and not plan.objective.multi,  # a Pareto trial always runs to its end
        max_probes=search.max_probes, rel_tol=search.rel_tol, low_share=search.low_share,
        judge=plan.objective if stopping and not plan.objective.multi and best is not None else None,
        best=best, margin=es.margin, driver_host=socket.gethostname(),
        regression=outputcheck.trial_spec_part(plan.cfg) if outputs else None,
        compile_cache=str(plan.compile_cache) if plan.cfg.engine.compile_cache else "",
        step_probe=(step_probe.for_server(plan.workload, args, plan.model.max_positions)
                    if probe and plan.objective.mode == "replay" else ()),
    )


@dataclass
class Running:
    """A trial whose task runs: what the driver needs to watch it and tell its outcome."""

    trial: optuna.Trial
    ref: object  # the Ray task's ObjectRef
    key: str  # its board / run-state key
    spec: TrialSpec
    params: dict
    device: Device
    best: float | None  # the best feasible value when it started (what it is judged against)
    started: float
    slot: int = 0  # which of the parallel slots it holds (its CPU cores on CPU)


def launch(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState,
            running: int, bind: tuple[int, str] = (0, "")) -> "Running | tuple":
    """Ask Optuna for a trial and start its task; a repeat of a finished trial, or a trial the KV
    precheck rules out, is told at once (returns its state and failure instead)."""
    queue_screening(study, plan.cfg.search.screen, plan.cfg.n_trials, baseline_params(plan), plan.space,
                    ordered=_twin_order(plan))
    trial = study.ask()
    params = trial_params(trial, plan.space, baseline_params(plan), _screened(study, plan, progress))
    best = _baseline_value(study) if of_trial.is_screen(trial) else best_feasible(study, plan.objective)
    spec = spec_for(trial, plan, params, best)
    slot, cores = bind
    if cores and topology.ranks(params) > 1:  # the slot's cores, one list per rank ('' when too few)
        cores = cpu_cores.rank_cores(cpu_cores.parse_cpu_list(cores), topology.ranks(params)) or cores
    if cores:
        spec = replace(spec, env=spec.env + (("VLLM_CPU_OMP_THREADS_BIND", cores),))
        of_trial.write_cpu_bind(trial, cores)
    source = None if of_trial.is_baseline(trial) else repeated_trial(study, spec.vllm_args, trial.number)
    if source is not None:
        state = tell_repeat(study, trial, source, plan.cfg.n_trials)
        progress.repeated(study, trial.number, params, source.number, state)
        return state, None
    position = finished_count(study) + running + 1
    progress.trial_started(trial.number, position, plan.cfg.n_trials, params, of_trial.is_baseline(trial),
                           of_trial.screen(trial))
    device = precheck.device_now(plan.cfg.engine.device)  # read once: the prediction and the learning
    estimate = precheck.predict(study, plan, spec.vllm_args, device)
    of_trial.write_kv_estimate(trial, estimate.to_dict())
    too_big = resources.too_big(plan, params)
    if too_big or (plan.cfg.precheck and not estimate.fits):
        of_trial.mark_precheck(trial, bool(too_big))
        predicted = (precheck.predicted_result(trial.number, estimate, plan.device.fp8_kv) if not too_big else
                     TrialResult(trial.number, Failure("invalid_config", f"predicted, not booted: {too_big}",
                                                       "lower the parallel sizes, or add a node that has the devices")))
        state, result = outcome.tell(study, trial, predicted, plan.objective)
        progress.trial_done(study, trial.number, result, state, plan.objective)
        progress.noted(study, trial.number, plan.objective)
        return state, result.failure
    if plan.cfg.search.prior == "twin" and _proposed(trial):
        told = _judged_by_twin(study, plan, trial, params, progress)
        if told is not None:
            return told
    ref = run_trial.options(**ray_resources(plan, params)).remote(spec, board)
    return Running(trial, ref, f"{plan.cfg.study_name}/{trial.number}", spec, params, device, best,
                    time.monotonic(), slot)
