"""The study driver: the only writer to the study. It asks Optuna for parameters, runs
each trial as a Ray task, and tells Optuna the outcome.

`prepare()` checks everything that can be checked without side effects (model, device,
search space, workload, objective, storage URL) so bad input never writes to the study.
`run()` then opens (or resumes) the study, queues the baseline as the first trial, and
runs trials until the budget of finished (COMPLETE or PRUNED) trials is reached.
"""

from __future__ import annotations

import time
from dataclasses import replace

import optuna
import ray


from optimizer.driver import tell as outcome
from optimizer.outputs import gate as outputcheck
from optimizer import shutdown
from optimizer.report.summary import finished_count
from optimizer.driver.progress import Progress
from optimizer.trial.channel import TrialBoard
from optimizer.driver.store.driver_lock import RunState
from optimizer.driver.ray_runtime import ray_runtime
from optimizer.trial.spec import lost_trial_result
from optimizer.driver.plan import Plan, open_study
from optimizer.driver.confirm import confirm_top, confirmation_pending
from optimizer.driver.launch import Running, launch
from optimizer.driver.poll import phase_of, poll, stop_all
from optimizer.driver.recovery import InfraTally, ensure_baseline, queue_again, recover
from optimizer.driver.resources import count_slots, cpu_bind
from optimizer.driver.tell import finish
from optimizer.report.summary import best_feasible


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
    study, plan = open_study(plan)
    if on_open is not None:
        on_open(study)
    recovered = recover(study, runstate.previous)
    ensure_baseline(study, plan)
    progress.opened(plan, study, recovered)
    if finished_count(study) >= plan.cfg.n_trials and not confirmation_pending(study, plan):
        return study, plan
    with ray_runtime(plan.cfg.ray.address, on_start=runstate.record_ray):
        board = TrialBoard.remote()
        _run_trials(study, plan, board, progress, runstate, count_slots(plan, progress).count)
        if confirmation_pending(study, plan):
            confirm_top(study, plan, board, progress, runstate)
    return study, plan


def _run_trials(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState, slots: int) -> None:
    """Keep up to `slots` trials running until the budget of finished trials is reached. TPE's
    constant liar keeps trials started side by side apart. A stop signal stops every running
    trial's server and tells them FAIL `interrupted` (queued again); a trial whose measurement
    already came back is told its result, never thrown away."""
    running: list[Running] = []
    tally = InfraTally()
    best = best_feasible(study, plan.objective)  # refreshed after every trial told
    progress.tagged = slots > 1  # several trials' lines interleave: each says whose it is
    try:
        with shutdown.polling():
            while True:
                shutdown.check()
                while (len(running) < slots and finished_count(study) + len(running) < plan.cfg.n_trials
                       and not shutdown.requested.is_set()
                       and not outputcheck.hold_launches(study, plan.cfg, [r.trial for r in running])):
                    slot = min(set(range(slots)) - {r.slot for r in running})
                    launched = launch(study, plan, board, progress, runstate, len(running), cpu_bind(plan, slot, slots))
                    if isinstance(launched, Running):
                        running.append(launched)
                    else:
                        tally.count(launched, time.monotonic(), plan, progress)
                if not running:
                    return
                done = poll(running, plan, board, progress, runstate, best)
                told = []
                for r, result in done:  # every finished one is told before any rule may raise
                    running.remove(r)
                    told.append((finish(study, plan, r, result, progress), r.started))
                if told:
                    best = best_feasible(study, plan.objective)
                for outcome_of, started in told:
                    tally.count(outcome_of, started, plan, progress)
    except BaseException as exc:  # a stop signal (KeyboardInterrupt), a broken pipe, too many infra failures
        for r in [r for r in running if ray.wait([r.ref], timeout=0)[0]]:
            try:  # finished while the driver was stopping: keep the measurement
                result = ray.get(r.ref)
            except ray.exceptions.RayError as lost:
                result = lost_trial_result(r.trial.number, lost, phase_of(board, r.trial.number))
            running.remove(r)
            runstate.remove_server(r.key)
            try:
                finish(study, plan, r, result, progress)
            except Exception:  # e.g. the database went away: the next start recovers it (left RUNNING)
                pass
        stop_all(running, plan, board, runstate)
        for r in running:
            outcome.tell_infra(study, r.trial, "interrupted: re-run to resume", f"{type(exc).__name__}")
            queue_again(study, r.trial, always=True, reason="interrupted")
        raise



