"""The study driver: the only writer to the study. It asks Optuna for parameters, runs
each trial as a Ray task, and tells Optuna the outcome.

`prepare()` checks everything that can be checked without side effects (model, device,
search space, workload, objective, storage URL) so bad input never writes to the study.
`run()` then opens (or resumes) the study, queues the baseline as the first trial, and
runs trials until the budget of finished (COMPLETE or PRUNED) trials is reached.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
import ray

from objectives import get_objective

from . import confirm, dashboard, earlystop, outcome, outputcheck, precheck, shutdown, slots as slots_mod, space as space_mod
from .artifacts import is_disk_failure, store_trial, writable
from .outcome import finished_count
from .config import StudyConfig
from .device import Device, detect
from .errors import ConfigError, OptimizerError
from .modelinfo import ModelInfo, load_model_info
from .progress import Progress
from .ratesearch import nominal_rate
from .slo import describe as describe_slos, parse_slos
from .board import TrialBoard
from .runstate import RunState
from .runtime import check_address, job_working_dir, ray_runtime, reap_server, run_trial
from .storage import check_storage, normalize_url, open_storage
from .tinymodel import write_tiny_model
from .trial import TrialSpec, lost_trial_result
from .workload import Vocabulary, Workload, build_workload
from .workload.materialize import write_workload

MAX_CONSECUTIVE_INFRA = 3
STOP_GRACE_S = 10  # on a stop signal: how long the trial may take to stop its server before the driver kills it
DISK_POLL_S = 5
CONFIRM_KEY = 1_000_000  # re-measurements post on the board under keys no trial number reaches


@dataclass(frozen=True)
class Plan:
    cfg: StudyConfig
    model: ModelInfo
    device: Device
    space: space_mod.SearchSpace
    workload: Workload
    objective: object
    storage_url: str
    artifacts: Path
    new_study: bool = False  # a stamp mismatch opens a separate study instead of refusing
    server_env: tuple = ()  # the run-state's tags every trial server carries (runstate.py)

    def fixed_args(self) -> list[str]:
        """vLLM flags every trial gets: load format, dtype, the user's extra flags."""
        args = []
        if self.cfg.model.load_format:
            args += ["--load-format", self.cfg.model.load_format]
        if self.cfg.model.dtype != "auto":
            args += ["--dtype", self.cfg.model.dtype]
        return args + list(self.cfg.engine.extra_args)


def prepare(cfg: StudyConfig, new_study: bool = False) -> Plan:
    """Validate the config against the model, device and workload; raises ConfigError. Writes nothing
    except the tiny model directory when the config asks for it."""
    try:
        objective = get_objective(cfg.objective.name, cfg.objective.metric, parse_slos(cfg.objective.slos))
    except ValueError as exc:
        raise ConfigError(f"objective: {exc}") from exc
    device = detect(cfg.engine.device)
    if cfg.engine.device == "gpu" and device.kind != "gpu":
        raise ConfigError("engine.device: 'gpu' asked for but nvidia-smi sees no GPU; use 'auto' or 'cpu'")
    url = normalize_url(cfg.storage, in_job=job_working_dir())
    check_storage(url)  # refused before anything runs
    check_address(cfg.ray.address or os.environ.get("RAY_ADDRESS"))
    model, workload = load_workload(cfg)
    if workload.longest_request() > model.max_positions:
        raise ConfigError(f"workload: longest request ({workload.longest_request()} tokens) exceeds the model's "
                          f"max_position_embeddings ({model.max_positions}); shorten the workload's longest prompt or output")
    if objective.mode == "goodput" and nominal_rate(workload.requests) is None:
        raise ConfigError(f"objective goodput: the workload '{workload.name}' has no open-loop schedule to scale "
                          "(a closed loop fixes the concurrency, not the rate); give it an arrival process such as "
                          "{process: poisson, rate: 8}, or use --goal agent")
    space = space_mod.resolve(cfg, device, model, workload.longest_request())
    outputcheck.trial_spec_part(cfg)  # a missing or empty prompts file is refused here
    artifacts = Path(cfg.artifacts_dir).expanduser().resolve() / cfg.study_name
    plan = Plan(cfg, model, device, space, workload, objective, url, artifacts, new_study)
    if not (cfg.ray.address or os.environ.get("RAY_ADDRESS")):  # the embedded Ray: its one node is this machine
        slots_mod.check_fits([_this_machine(device)], _largest_request(plan), "the embedded local Ray")
    return plan


def _this_machine(device: Device) -> dict:
    """The one node of the embedded Ray (runtime.ray_runtime: all cores, the GPUs Ray detects)."""
    return {"Alive": True, "Resources": {"CPU": float(os.cpu_count() or 1), "GPU": float(device.count)}}


def load_workload(cfg: StudyConfig) -> tuple[ModelInfo, Workload]:
    """The model (the tiny one written first if the config asks) and the workload built for it."""
    if cfg.model.tiny:
        write_tiny_model(cfg.model.path)
    model = load_model_info(cfg.model.path, cfg.model.dtype)
    return model, build_workload(cfg.workload, Vocabulary(model.vocab_size, model.source, model.max_positions))


def _open_study(plan: Plan) -> tuple[optuna.Study, Plan]:
    """Open (or create) the study; with `new_study`, a study stamped with another workload,
    objective or model is left as it is and a separate one, named after the new stamp, is opened."""
    storage = open_storage(plan.storage_url)
    # Optuna 5 keeps a stored study's direction silently; the stamp check catches an objective change.
    study = optuna.create_study(study_name=plan.cfg.study_name, storage=storage,
                                directions=list(plan.objective.directions), load_if_exists=True)
    mismatch = stamp_mismatch(study, plan)
    if mismatch and plan.new_study:
        name = f"{plan.cfg.study_name}-{_stamp_digest(plan)[:8]}"
        cfg = plan.cfg.model_copy(update={"study_name": name})
        plan = replace(plan, cfg=cfg, artifacts=plan.artifacts.parent / name, new_study=False)
        return _open_study(plan)
    if mismatch:
        key, old = mismatch
        raise ConfigError(f"study '{study.study_name}' was run with another {key.replace('_', ' ')} ({old}); "
                          "pass --new-study to start a separate study (the old one is kept), or --study-name NEW")
    # Seeded, but not the same seed on every resume: that would replay the same first draws.
    study.sampler = optuna.samplers.TPESampler(seed=plan.cfg.seed + len(study.trials), constant_liar=True,
                                               n_startup_trials=4)
    if not study.user_attrs.get("workload_hash"):
        _stamp(study, plan)
    return study, plan


def objective_stamp(objective) -> str:
    """How a study records what it optimizes, e.g. 'latency:ttft_p95 slos p95 TPOT <= 50 ms'."""
    text = f"{objective.name}:{objective.metric}"
    return text + (f" slos {describe_slos(objective.slos)}" if objective.slos else "")


def _stamp_of(plan: Plan) -> dict:
    return {"objective": objective_stamp(plan.objective),
            "workload_hash": plan.workload.content_hash(), "model": plan.model.source}


def _stamp_digest(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(_stamp_of(plan), sort_keys=True).encode()).hexdigest()


def stamp_mismatch(study: optuna.Study, plan: Plan) -> tuple[str, str] | None:
    """A resumed study must measure the same thing: the first stamp key that differs, with its old value."""
    old = study.user_attrs
    if not old.get("workload_hash"):
        return None
    for key, value in _stamp_of(plan).items():
        if old.get(key) != value:
            return key, old.get(key)
    return None


def _stamp(study: optuna.Study, plan: Plan) -> None:
    """A new study records what it measures, and the file its workload was materialized to.
    `workload_hash` goes last: a study is stamped only once all of it is there."""
    try:
        study.set_user_attr("workload_file", str(write_workload(plan.workload, plan.artifacts)))
    except OptimizerError as exc:  # a full disk: the study still runs (trials get the workload through Ray)
        study.set_user_attr("workload_file_error", str(exc))
    study.set_user_attr("workload", plan.workload.description)
    if plan.workload.notes:
        study.set_user_attr("workload_notes", list(plan.workload.notes))
    study.set_user_attr("device", plan.device.kind)
    for key, value in sorted(_stamp_of(plan).items(), key=lambda kv: kv[0] == "workload_hash"):
        study.set_user_attr(key, value)


def _baseline_params(plan: Plan) -> dict:
    return dict(plan.cfg.baseline or {})


def queue_again(study: optuna.Study, trial, always: bool = False, reason: str = "") -> bool:
    """Queue a FAIL trial's configuration once more: an infrastructure fault says nothing
    about the configuration. Once per configuration, unless `always` (interrupted runs, a full disk)."""
    if not always and trial.user_attrs.get("retry_of") is not None:
        return False
    roles = {k: trial.user_attrs[k] for k in ("baseline", "enqueued", "warm_start") if k in trial.user_attrs}
    extra = {"retry_reason": reason} if reason else {}
    study.enqueue_trial(dict(trial.params), user_attrs={**roles, "retry_of": trial.number, **extra})
    return True


def _recover(study: optuna.Study, previous: dict | None = None) -> int:
    """Trials a dead driver left RUNNING: FAIL them (infra) and queue their parameters again, once:
    a configuration lost with the driver twice in a row (it may be what kills the machine) is not."""
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    who = f"pid {previous.get('pid')} on {previous.get('host')}" if previous else "a previous driver"
    for t in stale:
        attrs = {"failure_kind": "infra", "evidence": f"the driver ({who}) died while this trial ran",
                 "remedy": "nothing to fix in the configuration: it is queued again"}
        for key, value in attrs.items():
            study._storage.set_trial_user_attr(t._trial_id, key, value)
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        queue_again(study, t, always=t.user_attrs.get("retry_reason") != "driver_lost", reason="driver_lost")
    return len(stale)


def _ensure_baseline(study: optuna.Study, plan: Plan) -> None:
    """Queue the baseline first, then the configured warm starts (once per study)."""
    if any(t.user_attrs.get("baseline") for t in study.get_trials(deepcopy=False)):
        return
    study.enqueue_trial(_baseline_params(plan), user_attrs={"baseline": True})
    for params in plan.cfg.enqueue:
        study.enqueue_trial(dict(params), user_attrs={"enqueued": True}, skip_if_exists=True)


def _trial_params(trial: optuna.Trial, plan: Plan) -> dict:
    if trial.user_attrs.get("baseline"):
        fixed = _baseline_params(plan)
        params = space_mod.suggest(trial, plan.space, only=set(fixed))
        return {**fixed, **params}  # baseline knobs outside the space still reach vLLM
    return space_mod.suggest(trial, plan.space)


def _spec(trial: optuna.Trial, plan: Plan, params: dict, best: float | None = None) -> TrialSpec:
    # The baseline always runs in full: the gain is measured against it.
    spec = make_spec(trial.number, plan, params, f"trial-{trial.number}",
                     early_stop=not trial.user_attrs.get("baseline"), best=best, outputs=True)
    trial.set_user_attr("vllm_args", list(spec.vllm_args))
    return spec


def make_spec(number: int, plan: Plan, params: dict, log_dir: str, early_stop: bool = True,
              best: float | None = None, outputs: bool = False) -> TrialSpec:
    """What a trial task needs to measure `params` (its log goes to artifacts/<study>/<log_dir>/).
    With early stop on, the trial judges its stages itself against `best` (the best feasible value
    when it starts) as well as hearing the driver's verdicts. With `outputs`, it also answers the
    output-regression prompts when the config asks (outputcheck.py)."""
    args = space_mod.to_cli_args(params) + space_mod.engine_args_for(params, plan.device.kind) + plan.fixed_args()
    # Dev endpoints for POST /reset_prefix_cache between warm-up and the measured window (127.0.0.1 only).
    env = {"VLLM_SERVER_DEV_MODE": "1", **dict(plan.server_env), **plan.cfg.engine.env}
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
    )


def _cluster(plan: Plan) -> str | None:
    """The cluster the trials run on (config or RAY_ADDRESS, which `ray job submit` sets), or None
    for the embedded local Ray on this machine."""
    return plan.cfg.ray.address or os.environ.get("RAY_ADDRESS") or None


def _request(plan: Plan, params: dict | None = None) -> dict:
    """What one trial asks Ray for (slots.py): on GPU one GPU per tensor-parallel rank (untested on a
    GPU), plus the GPU model's custom resource when named; on CPU the cores, shared among the
    `parallel` trials."""
    rc = plan.cfg.ray
    if plan.device.kind == "gpu":
        return slots_mod.request("gpu", rc.trial_cpus or 1, int((params or {}).get("tensor-parallel-size", 1)),
                                 rc.gpu_model)
    if rc.trial_cpus or _cluster(plan):
        return slots_mod.request("cpu", rc.trial_cpus or 1)  # a cluster's nodes are not this machine
    return slots_mod.request("cpu", max(1, (os.cpu_count() or 1) // (rc.parallel or 1)))


def _resources(plan: Plan, params: dict | None = None) -> dict:
    return slots_mod.ray_options(_request(plan, params))


def _largest_request(plan: Plan) -> dict:
    """The biggest trial the space can ask for (the largest tensor-parallel-size it may pick)."""
    tps = [1]
    for d in plan.space.dims:
        if d.knob.name == "tensor-parallel-size":
            tps += [int(c) for c in d.choices or ()] + [int(x) for x in (d.low, d.high) if x is not None]
    tps.append(int(_baseline_params(plan).get("tensor-parallel-size", 1)))
    return _request(plan, {"tensor-parallel-size": max(tps)})


def _plan_slots(plan: Plan, progress: Progress) -> slots_mod.Slots:
    """How many trials run at once, from the cluster Ray reports; refuses a trial no node can run."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    where = f"the cluster at {_cluster(plan)}" if _cluster(plan) else "the embedded local Ray"
    largest = _largest_request(plan)  # counted for the biggest trial: never more at once than fit
    slots_mod.check_fits(nodes, largest, where)
    planned = slots_mod.plan_slots(plan.cfg.ray.parallel, plan.device.kind, nodes, largest)
    progress.slots(planned)
    return planned


def run(plan: Plan, progress: Progress, runstate: RunState | None = None,
        on_open=None) -> tuple[optuna.Study, Plan]:
    """Run the study to its budget; returns the study and the plan it ran (for the report;
    `--new-study` may have renamed it). Holds the storage's run-state (runstate.py) throughout:
    one driver per storage, and what a dead driver left running is cleaned up first.
    `on_open(study)` is called once the study is open, before any trial (the daemon stamps it)."""
    if runstate is None:
        with RunState(plan.storage_url, plan.cfg.artifacts_dir) as held:
            progress.recovery(held.acquire())
            return run(plan, progress, held, on_open)
    plan = replace(plan, server_env=tuple(runstate.server_env().items()))
    study, plan = _open_study(plan)
    if on_open is not None:
        on_open(study)
    recovered = _recover(study, runstate.previous)
    _ensure_baseline(study, plan)
    progress.opened(plan, study, recovered)
    if finished_count(study) >= plan.cfg.n_trials and not _confirmation_pending(study, plan):
        return study, plan
    with ray_runtime(plan.cfg.ray.address, on_start=runstate.record_ray):
        board = TrialBoard.remote()
        _run_trials(study, plan, board, progress, runstate, _plan_slots(plan, progress).count)
        if _confirmation_pending(study, plan):
            _confirm(study, plan, board, progress, runstate)
    return study, plan


def _run_trials(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState, slots: int) -> None:
    """Keep up to `slots` trials running until the budget of finished trials is reached. TPE's
    constant liar keeps trials started side by side apart. A stop signal stops every running
    trial's server and tells them FAIL `interrupted` (queued again); a trial whose measurement
    already came back is told its result, never thrown away."""
    running: list[_Running] = []
    tally = _InfraTally()
    best = earlystop.best_feasible(study, plan.objective)  # refreshed after every trial told
    progress.tagged = slots > 1  # several trials' lines interleave: each says whose it is
    try:
        with shutdown.polling():
            while True:
                shutdown.check()
                while (len(running) < slots and finished_count(study) + len(running) < plan.cfg.n_trials
                       and not shutdown.requested.is_set()
                       and not outputcheck.hold_launches(study, plan.cfg, [r.trial for r in running])):
                    slot = min(set(range(slots)) - {r.slot for r in running})
                    launched = _launch(study, plan, board, progress, runstate, len(running), _cpu_bind(plan, slot, slots))
                    if isinstance(launched, _Running):
                        running.append(launched)
                    else:
                        tally.count(launched, time.monotonic(), plan, progress)
                if not running:
                    return
                done = _poll(running, plan, board, progress, runstate, best)
                told = []
                for r, result in done:  # every finished one is told before any rule may raise
                    running.remove(r)
                    told.append((_finish(study, plan, r, result, progress), r.started))
                if told:
                    best = earlystop.best_feasible(study, plan.objective)
                for outcome_of, started in told:
                    tally.count(outcome_of, started, plan, progress)
    except BaseException as exc:  # a stop signal (KeyboardInterrupt), a broken pipe, too many infra failures
        for r in [r for r in running if ray.wait([r.ref], timeout=0)[0]]:
            try:  # finished while the driver was stopping: keep the measurement
                result = ray.get(r.ref)
            except ray.exceptions.RayError as lost:
                result = lost_trial_result(r.trial.number, lost, _phase(board, r.trial.number))
            running.remove(r)
            runstate.remove_server(r.key)
            try:
                _finish(study, plan, r, result, progress)
            except Exception:  # e.g. the database went away: the next start recovers it (left RUNNING)
                pass
        _stop_all(running, plan, board, runstate)
        for r in running:
            outcome.tell_infra(study, r.trial, "interrupted: re-run to resume", f"{type(exc).__name__}")
            queue_again(study, r.trial, always=True, reason="interrupted")
        raise


class _InfraTally:
    """Three trials in a row failing for reasons outside their configuration stop the study; a full
    artifacts disk that frees up again is waited out instead, and the other trials that ran into
    the same full disk (started before it came back) are not counted against the machine."""

    def __init__(self):
        self.in_a_row = 0
        self.disk_back_at = -math.inf

    def count(self, told: tuple, started: float, plan: Plan, progress: Progress) -> None:
        state, failure = told
        if is_disk_failure(failure):
            if started < self.disk_back_at:
                return  # the same full disk another trial already waited out
            if _wait_for_disk(plan, progress):
                self.disk_back_at = time.monotonic()
                return  # the disk was full and is freed: not the machine failing trials
        self.in_a_row = self.in_a_row + 1 if state == optuna.trial.TrialState.FAIL else 0
        if self.in_a_row >= MAX_CONSECUTIVE_INFRA:
            raise OptimizerError(f"{self.in_a_row} trials in a row failed for reasons outside the configuration "
                                 "(failure_kind infra or replay_invalid); fix the machine and re-run to resume")


def _wait_for_disk(plan: Plan, progress: Progress) -> bool:
    """After a trial failed on a full disk: wait (showing why) until the artifacts directory takes
    writes; True if it had to. False when it takes writes here already: the trial's node (its log
    is written where the task runs) is the one refusing, and that counts as an infra failure."""
    why = writable(plan.artifacts)
    if why is None:
        return False
    progress.waiting_disk(plan.artifacts, why)
    while (why := writable(plan.artifacts)) is not None:
        shutdown.sleep(DISK_POLL_S)
        progress.heartbeat()
    progress.disk_back(plan.artifacts)
    return True


def _confirmation_pending(study: optuna.Study, plan: Plan) -> bool:
    c = plan.cfg.confirm
    if not (c.top and c.repeats) or not confirm.candidates(study, c.top):
        return False
    return not confirm.settled(study, c.top, c.repeats)


def _confirm(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState) -> None:
    """Re-measure the top configurations (confirm.py): full runs, no early stop."""
    c = plan.cfg.confirm
    progress.confirming(c.top, c.repeats)

    def measure(t: optuna.trial.FrozenTrial, k: int) -> float | None:
        params = {**(_baseline_params(plan) if t.user_attrs.get("baseline") else {}), **t.params}
        # Its own board key: the trial's verdicts and server are not its.
        return measure_once(plan, params, CONFIRM_KEY + t.number * 100 + k, f"trial-{t.number}/confirm-{k}",
                            board, progress, runstate)

    record = confirm.remeasure(study, c.top, c.repeats, measure, progress.confirm_value)
    progress.confirmed(record, plan.objective)


@contextmanager
def measuring(plan: Plan, progress: Progress):
    """For measurements outside a study's loop (sensitivity.py): the storage's run-state held, Ray up
    and a board; yields `measure(params, key, log_dir) -> value or None` (measure_once)."""
    with RunState(plan.storage_url, plan.cfg.artifacts_dir) as held:
        progress.recovery(held.acquire())
        plan = replace(plan, server_env=tuple(held.server_env().items()))
        with ray_runtime(plan.cfg.ray.address, on_start=held.record_ray):
            board = TrialBoard.remote()
            yield lambda params, key, log_dir: measure_once(plan, params, key, log_dir, board, progress, held)


def measure_once(plan: Plan, params: dict, key: int, log_dir: str, board, progress: Progress,
                 runstate: RunState) -> float | None:
    """One full measurement of `params` outside the Optuna loop (no early stop), its files stored in
    artifacts/<study>/<log_dir>/; the objective's value, or None if the run failed."""
    spec = make_spec(key, plan, params, log_dir, early_stop=False)
    result = _run_task(spec, plan, board, progress, runstate)
    store_trial(plan.artifacts / log_dir, params, result, socket.gethostname())
    if result.failure is not None or result.early_stop or outcome.unscored_errors(result, plan.objective):
        return None
    try:
        return plan.objective.score(result.metrics)
    except ValueError:
        return None


def _run_task(spec: TrialSpec, plan: Plan, board, progress: Progress, runstate: RunState):
    """Run one measurement outside the Optuna loop (re-measurements), stopping cleanly on a signal."""
    ref = run_trial.options(**_resources(plan, spec.params)).remote(spec, board)
    started = time.monotonic()
    key = f"{plan.cfg.study_name}/{spec.number}"
    try:
        with shutdown.polling():
            while True:
                ready, _ = ray.wait([ref], timeout=1.0)
                if ready:
                    return ray.get(ref)  # finished: a stop signal now must not throw it away
                shutdown.check()
                progress.phase(spec.number, _phase(board, spec.number, "queued"), time.monotonic() - started)
                _note_server(board, spec.number, key, runstate, plan)
    except ray.exceptions.RayError as exc:
        _stop_task(ref, plan, board, spec.number, runstate, key)
        return lost_trial_result(spec.number, exc, _phase(board, spec.number))
    except BaseException:
        _stop_task(ref, plan, board, spec.number, runstate, key, grace=STOP_GRACE_S)
        raise
    finally:
        runstate.remove_server(key)


@dataclass
class _Running:
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


def _cpu_bind(plan: Plan, slot: int, slots: int) -> tuple[int, str]:
    """(slot, cores) for a CPU trial running beside others on the embedded Ray: its own share of
    this machine's cores for vLLM's worker (VLLM_CPU_OMP_THREADS_BIND). vLLM's own "auto" binds
    every server's worker to the same first core (measured: affinity 0 with 2 cores), so two
    side by side would share one core and leave the other idle. '' when vLLM should choose."""
    if (slots < 2 or plan.device.kind != "cpu" or _cluster(plan)
            or "VLLM_CPU_OMP_THREADS_BIND" in plan.cfg.engine.env):
        return slot, ""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // slots)
    mine = cores[slot * share:(slot + 1) * share] or cores[-share:]
    return slot, ",".join(str(c) for c in mine)


def _launch(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState,
            running: int, bind: tuple[int, str] = (0, "")) -> "_Running | tuple":
    """Ask Optuna for a trial and start its task; a trial the KV precheck rules out is told PRUNED
    at once (returns its state and failure instead)."""
    trial = study.ask()
    params = _trial_params(trial, plan)
    best = earlystop.best_feasible(study, plan.objective)
    spec = _spec(trial, plan, params, best)
    slot, cores = bind
    if cores:
        spec = replace(spec, env=spec.env + (("VLLM_CPU_OMP_THREADS_BIND", cores),))
        trial.set_user_attr("cpu_bind", cores)
    position = finished_count(study) + running + 1
    progress.trial_started(trial.number, position, plan.cfg.n_trials, params, bool(trial.user_attrs.get("baseline")))
    device = precheck.device_now(plan.cfg.engine.device)  # read once: the prediction and the learning
    estimate = precheck.predict(study, plan, spec.vllm_args, device)
    trial.set_user_attr("kv_estimate", estimate.to_dict())
    if plan.cfg.precheck and not estimate.fits:
        trial.set_user_attr("precheck", "pruned")
        state, result = outcome.tell(study, trial, precheck.predicted_result(trial.number, estimate), plan.objective)
        progress.trial_done(study, trial.number, result, state, plan.objective)
        progress.note(dashboard.save_trial_note(study, trial.number, plan.objective.metric, plan.objective.unit))
        return state, result.failure
    ref = run_trial.options(**_resources(plan, params)).remote(spec, board)
    return _Running(trial, ref, f"{plan.cfg.study_name}/{trial.number}", spec, params, device, best,
                    time.monotonic(), slot)


def _poll(running: list[_Running], plan: Plan, board, progress: Progress, runstate: RunState,
          best: float | None) -> list[tuple[_Running, object]]:
    """One look at every running trial: its phase, its new stage checkpoints (reported to Optuna
    and judged against `best`, the best so far: another trial may have improved it since it
    started), its server's process group. Returns the finished ones with their results (the
    caller acts on a stop signal only after telling them)."""
    refs = [r.ref for r in running]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)  # also how soon a stage's verdict goes back
    judge = plan.objective if plan.cfg.early_stop.enabled else None
    phases = _phases(board)
    done = []
    for r in running:
        n = r.trial.number
        progress.phase(n, phases.get(n, "queued"), time.monotonic() - r.started)
        if judge is not None:
            _judge_checkpoints(board, r.trial, judge, best if best is not None else r.best, progress,
                               plan.cfg.early_stop.margin)
        where = _note_server(board, n, r.key, runstate, plan)
        if where:
            r.trial.set_user_attr("server_process", where)
        if r.ref in ready:
            try:
                result = ray.get(r.ref)
            except ray.exceptions.RayError as exc:  # its worker died, or Ray lost it
                _stop_task(r.ref, plan, board, n, runstate, r.key)
                result = lost_trial_result(n, exc, phases.get(n, "starting"))
            runstate.remove_server(r.key)
            done.append((r, result))
    return done


def _finish(study: optuna.Study, plan: Plan, r: _Running, result, progress: Progress) -> tuple:
    """Learn from the trial's start-up, store its result, tell Optuna; returns (state, failure)."""
    trial = r.trial
    precheck.learn(study, plan, r.spec.vllm_args, result, r.device)
    result = outputcheck.gate(study, trial, result, plan.cfg)  # before result.json: an output_changed is in it
    if not is_disk_failure(result.failure):
        written = store_trial(plan.artifacts / f"trial-{trial.number}", r.params, result, socket.gethostname())
        if written is not None:
            result = replace(result, failure=written)  # a full disk fails the trial, not the study
        else:  # before the tell: Optuna refuses attributes on a finished trial
            progress.note(dashboard.upload_trial_files(trial, plan.artifacts / f"trial-{trial.number}",
                                                       plan.cfg.artifacts_dir))
    state, result = outcome.tell(study, trial, result, plan.objective)
    progress.trial_done(study, trial.number, result, state, plan.objective)
    progress.note(dashboard.save_trial_note(study, trial.number, plan.objective.metric, plan.objective.unit))
    if state == optuna.trial.TrialState.FAIL:
        disk = is_disk_failure(result.failure)
        queue_again(study, trial, always=disk, reason="disk_full" if disk else "")
    return state, result.failure


def _stop_all(running: list[_Running], plan: Plan, board, runstate: RunState) -> None:
    """Stop every running trial's task and server within STOP_GRACE_S overall (cancelled together,
    then each reaped if still there)."""
    for r in running:
        if not ray.wait([r.ref], timeout=0)[0]:
            ray.cancel(r.ref)
    deadline = time.monotonic() + STOP_GRACE_S
    for r in running:
        try:
            ray.get(r.ref, timeout=max(0.1, deadline - time.monotonic()))
        except BaseException:
            pass
        try:  # one trial's clean-up failing must not leave the others' servers running
            if not reap_server(board, r.trial.number, timeout=5):
                runstate.reap(r.key)
            runstate.remove_server(r.key)
        except Exception:
            pass


def _cancel(ref, plan: Plan, grace: float | None = None) -> None:
    """Stop a trial task that may still run (its finally stops the server), waiting at most `grace` s."""
    ready, _ = ray.wait([ref], timeout=0)
    if ready:
        return
    ray.cancel(ref)
    try:
        ray.get(ref, timeout=plan.cfg.engine.shutdown_timeout_s + 15 if grace is None else grace)
    except BaseException:
        pass


def _stop_task(ref, plan: Plan, board, number: int, runstate: RunState, key: str, grace: float | None = None) -> None:
    """Cancel the task, then kill its server's process group if it is still there (a worker that
    died, or a server slower to stop than `grace`): through the board, else the run-state's record."""
    _cancel(ref, plan, grace)
    if not reap_server(board, number, timeout=5):
        runstate.reap(key)


def _note_server(board, number: int, key: str, runstate: RunState, plan: Plan) -> dict | None:
    """The trial's server host and process group once known, recorded in the run-state (once)."""
    if key in runstate.servers():
        return None
    try:
        where = ray.get(board.server_of.remote(number), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return None  # the board is slow or gone: try again next poll
    if not where:
        return None
    runstate.add_server(key, where[0], where[1], plan.cfg.study_name, number)
    return {"host": where[0], "pgid": where[1]}


def _judge_checkpoints(board, trial: optuna.Trial, objective, best: float | None, progress: Progress,
                       margin: float = 0.0) -> None:
    """Report each new stage's value to Optuna and answer the trial: go on, or stop (it cannot win)."""
    try:
        checkpoints = ray.get(board.take_checkpoints.remote(trial.number), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return
    for step, payload in checkpoints:
        value = earlystop.intermediate(objective, payload)
        if value is not None and math.isfinite(value):
            trial.report(value, step)
        reason = earlystop.verdict(objective, payload, best, margin)
        board.decide.remote(trial.number, step, reason)
        progress.checkpoint(trial.number, step, value, objective, reason)


def _phases(board) -> dict:
    """Every trial's phase, in one read of the board ({} if the board is slow or gone)."""
    try:
        return ray.get(board.get.remote(), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return {}


def _phase(board, number: int, default: str = "starting") -> str:
    try:
        return ray.get(board.get.remote(), timeout=10).get(number, default)
    except (ray.exceptions.RayError, TimeoutError):
        return default
