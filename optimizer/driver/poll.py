"""Watching running trials through Ray: their phases, stage checkpoints judged for early
stop, their servers' process groups recorded, results collected; and stopping them.
"""

from __future__ import annotations

import math
import time

import optuna
import ray

from optimizer.driver.launch import Running
from optimizer.driver.plan import Plan
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import GONE, GUARD_SETTLE_S, REAPED, reap_server
from optimizer.driver.store.driver_lock import RunState
from optimizer.errors import first_line
from optimizer.trial import early_stop as earlystop
from optimizer.trial.spec import lost_trial_result

LOST_SERVER = {  # what the driver found of the server of a trial whose worker died
    GONE: "the trial's worker died; its server had already stopped with it (nothing left to reap)",
    REAPED: "the trial's worker died; its server was still running, and the driver stopped it"}


def lost_server_note(exc: BaseException, found: str) -> str | None:
    """What to say of the server of a trial lost with `exc` (nothing for an error the task raised:
    its worker lives, and the task stopped its server itself)."""
    return None if isinstance(exc, ray.exceptions.RayTaskError) else LOST_SERVER.get(found)
STOP_GRACE_S = 10  # on a stop signal: how long the trial may take to stop its server before the driver kills it


def poll(running: list[Running], plan: Plan, board, progress: Progress, runstate: RunState,
          best: float | None) -> list[tuple[Running, object]]:
    """One look at every running trial: its phase, its new stage checkpoints (reported to Optuna
    and judged against `best`, the best so far: another trial may have improved it since it
    started), its server's process group. Returns the finished ones with their results (the
    caller acts on a stop signal only after telling them)."""
    refs = [r.ref for r in running]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.5)  # also how soon a stage's verdict goes back
    judge = plan.objective if plan.cfg.early_stop.enabled else None
    phases = read_phases(board)
    done = []
    for r in running:
        n = r.trial.number
        progress.phase(n, phases.get(n, "queued"), time.monotonic() - r.started)
        if judge is not None:
            judge_checkpoints(board, r.trial, judge, best if best is not None else r.best, progress,
                               plan.cfg.early_stop.margin)
        where = note_server(board, n, r.key, runstate, plan)
        if where:
            r.trial.set_user_attr("server_process", where)
        if r.ref in ready:
            try:
                result = ray.get(r.ref)
            except ray.exceptions.RayError as exc:  # its worker died, or Ray lost it
                reaped = stop_task(r.ref, plan, board, n, runstate, r.key, settle=GUARD_SETTLE_S)
                result = lost_trial_result(n, exc, phases.get(n, "starting"))
                progress.note(lost_server_note(exc, reaped))
            runstate.remove_server(r.key)
            done.append((r, result))
    return done


def stop_all(running: list[Running], plan: Plan, board, runstate: RunState, progress: Progress) -> None:
    """Stop every running trial's task and server within STOP_GRACE_S overall (cancelled together,
    then each reaped if still there). A server that cannot be reaped is named, and stays in the
    run-state file so that the next start on this storage stops it."""
    for r in running:
        if not ray.wait([r.ref], timeout=0)[0]:
            ray.cancel(r.ref)
    deadline = time.monotonic() + STOP_GRACE_S
    for r in running:
        try:
            ray.get(r.ref, timeout=max(0.1, deadline - time.monotonic()))
        except (ray.exceptions.RayError, TimeoutError):
            pass  # cancelled, timed out or lost with its worker: its server is reaped next
        try:  # one trial's clean-up failing must not leave the others' servers running
            if reap_server(board, r.trial.number, timeout=5) not in (GONE, REAPED):
                runstate.reap(r.key)
            runstate.remove_server(r.key)
        except Exception as exc:  # noqa: BLE001 - said, and left on record for the next start
            progress.note(f"trial {r.trial.number}: its server could not be stopped ({type(exc).__name__}: "
                          f"{first_line(exc)}); it stays recorded in {runstate.path.name}, and the next start "
                          "on this storage stops it")


def cancel(ref, plan: Plan, grace: float | None = None) -> None:
    """Stop a trial task that may still run (its finally stops the server), waiting at most `grace` s."""
    ready, _ = ray.wait([ref], timeout=0)
    if ready:
        return
    ray.cancel(ref)
    try:
        ray.get(ref, timeout=plan.cfg.engine.shutdown_timeout_s + 15 if grace is None else grace)
    except (ray.exceptions.RayError, TimeoutError):
        pass  # cancelled, or slower than `grace`: the caller reaps its server


def stop_task(ref, plan: Plan, board, number: int, runstate: RunState, key: str, grace: float | None = None,
              settle: float = 0.0) -> str:
    """Cancel the task, then kill its server's process group if it is still there (a worker that
    died, or a server slower to stop than `grace`): through the board, else the run-state's record.
    `settle`: for a worker that died, the time its server's guard gets first. Returns what
    reap_server found."""
    cancel(ref, plan, grace)
    found = reap_server(board, number, timeout=5, settle=settle)
    if found not in (GONE, REAPED):
        runstate.reap(key)
    return found


def note_server(board, number: int, key: str, runstate: RunState, plan: Plan) -> dict | None:
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


def judge_checkpoints(board, trial: optuna.Trial, objective, best: float | None, progress: Progress,
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


def read_phases(board) -> dict:
    """Every trial's phase, in one read of the board ({} if the board is slow or gone)."""
    try:
        return ray.get(board.get.remote(), timeout=10)
    except (ray.exceptions.RayError, TimeoutError):
        return {}


def phase_of(board, number: int, default: str = "starting") -> str:
    try:
        return ray.get(board.get.remote(), timeout=10).get(number, default)
    except (ray.exceptions.RayError, TimeoutError):
        return default
