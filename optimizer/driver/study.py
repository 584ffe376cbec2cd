"""The study loop: the only writer to the study. `run()` takes a plan that `driver/plan.py`'s
`prepare()` already checked, opens (or resumes) the study, queues the baseline first, and keeps
trials running (launch.py) and polled (poll.py), telling Optuna each outcome (tell.py), until the
budget of finished (COMPLETE or PRUNED) trials is reached; then the top ones and the baseline are
re-measured (confirm.py), and the winner's changes that had no effect are put back (minimal.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import optuna
import ray

from optimizer import shutdown
from optimizer.driver import tell as outcome
from optimizer.driver.confirm import confirm_top, confirmation_pending
from optimizer.driver.launch import Running, launch
from optimizer.driver.minimal import minimal_pending, minimize
from optimizer.driver.plan import Plan, open_study
from optimizer.driver.poll import phase_of, poll, stop_all
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import ray_runtime
from optimizer.driver.recovery import InfraTally, ensure_baseline, recover
from optimizer.driver.resources import count_slots, cpu_bind
from optimizer.driver.store.driver_lock import RunState
from optimizer.driver.tell import finish
from optimizer.errors import first_line
from optimizer.outputs import gate as outputcheck
from optimizer.search.convergence import CONVERGED_AFTER, converged, search_over
from optimizer.search.enqueue import queue_again
from optimizer.verdict.trials import best_feasible, finished_count
from optimizer.trial.channel import TrialBoard
from optimizer.trial.spec import lost_trial_result


def run(plan: Plan, progress: Progress, runstate: RunState | None = None,
        on_open=None) -> tuple[optuna.Study, Plan]:
    """Run the study to its budget; returns the study and the plan it ran (for the report;
    `--new-study` may have renamed it). Holds the storage's run-state (driver/store/driver_lock.py) throughout:
    one driver per storage, and what a dead driver left running is cleaned up first.
    `on_open(study)` is called once the study is open, before any trial (the daemon stamps it)."""
    if runstate is None:
        with RunState(plan.storage_url, plan.cfg.artifacts_dir, plan.cfg.study_name) as held:
            progress.recovery(held.acquire())
            return run(plan, progress, held, on_open)
    plan = replace(plan, server_env=tuple(runstate.server_env().items()))
    study, plan = open_study(plan)
    if on_open is not None:
        on_open(study)
    recovered = recover(study, runstate.previous)
    ensure_baseline(study, plan)
    progress.opened(plan, study, recovered)
    if (search_over(study, plan.cfg.n_trials) and not confirmation_pending(study, plan)
            and not minimal_pending(study, plan)):
        return study, plan
    with ray_runtime(plan.cfg.ray.address, on_start=runstate.record_ray):
        board = TrialBoard.remote()
        _run_trials(study, plan, board, progress, runstate, count_slots(plan, progress).count)
        if confirmation_pending(study, plan):
            confirm_top(study, plan, board, progress, runstate)
        if minimal_pending(study, plan):
            minimize(study, plan, board, progress, runstate)
    return study, plan


def _run_trials(study: optuna.Study, plan: Plan, board, progress: Progress, runstate: RunState, slots: int) -> None:
    """Keep up to `slots` trials running until the budget of finished trials is reached. TPE's
    constant liar keeps trials started side by side apart. A stop signal stops every running
    trial's server and tells them FAIL `interrupted` (queued again); a trial whose measurement
    already came back is told its result, never thrown away."""
    trials = _Trials(study, plan, board, progress, runstate, slots)
    best = best_feasible(study, plan.objective)  # refreshed after every trial told
    progress.tagged = slots > 1  # several trials' lines interleave: each says whose it is
    try:
        with shutdown.polling():
            while True:
                shutdown.check()
                trials.launch_while_room()
                if not trials.running:
                    if converged(study, plan.cfg.n_trials):
                        progress.note(f"the sampler proposed {CONVERGED_AFTER} measured configurations in a row: "
                                      f"the search has converged, after {finished_count(study)} of "
                                      f"{plan.cfg.n_trials} trials")
                    return
                if trials.tell(poll(trials.running, plan, board, progress, runstate, best)):
                    best = best_feasible(study, plan.objective)
    except BaseException as exc:  # a stop signal (KeyboardInterrupt), a broken pipe, too many infra failures
        with shutdown.deferred():  # a (further) signal while stopping must not leave servers unreaped
            trials.stop(exc)
        raise


@dataclass
class _Trials:
    """The trials of one study loop that run now, and the three things done to them."""

    study: optuna.Study
    plan: Plan
    board: object  # the TrialBoard actor
    progress: Progress
    runstate: RunState
    slots: int
    running: list[Running] = field(default_factory=list)
    tally: InfraTally = field(default_factory=InfraTally)

    def launch_while_room(self) -> None:
        """Start trials while a slot is free, the budget allows and the output gate does not hold."""
        study, plan = self.study, self.plan
        while (len(self.running) < self.slots and finished_count(study) + len(self.running) < plan.cfg.n_trials
               and not converged(study, plan.cfg.n_trials)
               and not shutdown.requested.is_set()
               and not outputcheck.hold_launches(study, plan.cfg, [r.trial for r in self.running])):
            slot = min(set(range(self.slots)) - {r.slot for r in self.running})
            launched = launch(study, plan, self.board, self.progress, self.runstate, len(self.running),
                              cpu_bind(plan, slot, self.slots))
            if isinstance(launched, Running):
                self.running.append(launched)
            else:  # pruned by the KV precheck without a boot
                self.tally.count(launched, time.monotonic(), plan, self.progress)

    def tell(self, done: list) -> bool:
        """Tell Optuna every finished trial before any rule may raise; True if there were any."""
        told = []
        for r, result in done:
            self.running.remove(r)
            told.append((finish(self.study, self.plan, r, result, self.progress), r.started))
        for outcome_of, started in told:
            self.tally.count(outcome_of, started, self.plan, self.progress)
        return bool(told)

    def stop(self, exc: BaseException) -> None:
        """On a stop: keep what already came back, stop the rest, tell them interrupted (queued again)."""
        for r in [r for r in self.running if ray.wait([r.ref], timeout=0)[0]]:
            try:  # finished while the driver was stopping: keep the measurement
                result = ray.get(r.ref)
            except ray.exceptions.RayError as lost:
                result = lost_trial_result(r.trial.number, lost, phase_of(self.board, r.trial.number))
            self.running.remove(r)
            self.runstate.remove_server(r.key)
            try:
                finish(self.study, self.plan, r, result, self.progress)
            except Exception as failed:  # noqa: BLE001 - e.g. the database went away: said, and recovered later
                self.progress.note(f"trial {r.trial.number}: its measurement came back, but recording it failed "
                                   f"({type(failed).__name__}: {first_line(failed)}); if the study did not get it, "
                                   "the trial stays RUNNING and the next start fails it as lost and queues it again")
        stop_all(self.running, self.plan, self.board, self.runstate, self.progress)
        for r in self.running:
            outcome.tell_infra(self.study, r.trial, "interrupted: re-run to resume", f"{type(exc).__name__}")
            queue_again(self.study, r.trial, always=True, reason="interrupted")
