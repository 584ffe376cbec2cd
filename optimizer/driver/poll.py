"""Watching running trials through Ray: their phases, stage checkpoints judged for early
stop, their servers' process groups recorded, results collected; and stopping them.

Every read of the board gives up at once when a stop is asked for (ray_runtime.board_get), and a
stop signal's stop (`stop_all`) asks Ray for no answer at all, within a bound nothing slow can
stretch. The tasks are cancelled together (each then stops its own server: SIGTERM, and SIGKILL
after 3 s for a server not ready yet, engine/vllm.py), and the driver waits up to STOP_GRACE_S for
the servers themselves to be gone, not for the tasks' answers; then it kills whatever is left. It
finds the servers without Ray: the run-state's records, and the processes on this host that carry
this run's tag (a server the board had not told of yet). The board and the trials' workers run at
Ray's worker priority (nice 15) and can take seconds per answer on a machine busy with a vLLM
start-up: a stop that asked them (10 s per read) took 33 s to exit. A server on another node is
stopped by its own guard when its worker ends with the driver's Ray (engine/lifeline.py).
"""

from __future__ import annotations

import math
import socket
import time

import optuna
import ray

from optimizer.driver.launch import Running
from optimizer.driver.plan import Plan
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import GONE, GUARD_SETTLE_S, REAPED, board_get, reap_server
from optimizer.driver.store.driver_lock import RunState
from optimizer.engine import lifeline
from optimizer.engine.vllm import NOT_READY_STOP_S, group_pids
from optimizer.errors import first_line
from optimizer.record import of_trial
from optimizer.trial import early_stop as earlystop
from optimizer.trial.spec import lost_trial_result

LOST_SERVER = {  # what the driver found of the server of a trial whose worker died
    GONE: "the trial's worker died; its server had already stopped with it (nothing left to reap)",
    REAPED: "the trial's worker died; its server was still running, and the driver stopped it"}


def lost_server_note(exc: BaseException, found: str) -> str | None:
    """What to say of the server of a trial lost with `exc` (nothing for an error the task raised:
    its worker lives, and the task stopped its server itself)."""
    return None if isinstance(exc, ray.exceptions.RayTaskError) else LOST_SERVER.get(found)


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
    heard = phases is not None  # the board answered (not one too slow, nor a stop that cannot wait)
    phases = phases or {}
    done = []
    for r in running:
        n = r.trial.number
        if heard:
            progress.phase(n, phases.get(n, "queued"), time.monotonic() - r.started)
        else:
            progress.heartbeat()  # the loop runs; the phase shown stays the last one heard
        if judge is not None:
            judge_checkpoints(board, r.trial, judge, best if best is not None else r.best, progress,
                               plan.cfg.early_stop.margin)
        where = note_server(board, n, r.key, runstate, plan)
        if where:
            of_trial.write_server_process(r.trial, where)
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


STOP_GRACE_S = NOT_READY_STOP_S + 0.5  # for the trials to stop their own servers (one not ready: SIGKILL at 3 s)
KILL_GRACE_S = 0.5  # then the driver's SIGTERM to what is left, and SIGKILL this much later (engine/lifeline.py)
SCAN_S = 0.2  # how often the servers' groups are looked at meanwhile


def stop_all(running: list, plan, board, runstate: RunState, progress: Progress) -> None:
    """Stop every running trial's task and server (study.py's `Running`s: their refs, trials and
    run-state keys); `plan` and `board` are not needed (kept for the caller's one signature)."""
    stop_tasks([(r.ref, r.key, f"trial {r.trial.number}") for r in running], runstate, progress)


def stop_tasks(tasks: list[tuple], runstate: RunState, progress: Progress) -> None:
    """Stop the tasks `(ref, run-state key, name)` and their servers within about STOP_GRACE_S +
    KILL_GRACE_S. A server that cannot be stopped is named, and stays in the run-state file so
    that the next start on this storage stops it."""
    for ref, _, _ in tasks:
        if not ray.wait([ref], timeout=0)[0]:
            ray.cancel(ref)
    recorded = runstate.servers()
    deadline = time.monotonic() + STOP_GRACE_S
    groups = _groups(recorded, runstate)
    while any(group_pids(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(SCAN_S)
        groups |= _groups(recorded, runstate)  # a server started just before its task was cancelled
    for pgid in sorted(groups):
        if group_pids(pgid):  # SIGTERM, then SIGKILL again each round: a process forked meanwhile is not missed
            lifeline.stop_group(pgid, KILL_GRACE_S)
    for _, key, name in tasks:
        _settle(key, name, recorded, runstate, progress)


def _groups(recorded: dict, runstate: RunState) -> set[int]:
    here = socket.gethostname()
    return {int(s["pgid"]) for s in recorded.values() if s.get("host") == here} | runstate.run_groups()


def _settle(key: str, name: str, recorded: dict, runstate: RunState, progress: Progress) -> None:
    """Drop the record of a server that is gone; name one that is not (it stays on record)."""
    where = recorded.get(key)
    try:
        left = group_pids(int(where["pgid"])) if where and where.get("host") == socket.gethostname() else []
        if not left:
            runstate.remove_server(key)
            return
        why = f"processes {left} still there after SIGKILL"
    except Exception as exc:  # noqa: BLE001 - said, and left on record for the next start
        why = f"{type(exc).__name__}: {first_line(exc)}"
    progress.note(f"{name}: its server could not be stopped ({why}); it stays recorded in {runstate.path.name}, "
                  "and the next start on this storage stops it")


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
        where = board_get(board.server_of.remote(number))
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
        checkpoints = board_get(board.take_checkpoints.remote(trial.number))
    except (ray.exceptions.RayError, TimeoutError):
        return
    for step, payload in checkpoints:
        value = earlystop.intermediate(objective, payload)
        if value is not None and math.isfinite(value):
            trial.report(value, step)
        reason = earlystop.verdict(objective, payload, best, margin)
        board.decide.remote(trial.number, step, reason)
        progress.checkpoint(trial.number, step, value, objective, reason)


def read_phases(board) -> dict | None:
    """Every trial's phase, in one read of the board (None if the board is slow or gone)."""
    try:
        return board_get(board.get.remote())
    except (ray.exceptions.RayError, TimeoutError):
        return None


def phase_of(board, number: int, default: str = "starting") -> str:
    try:
        return board_get(board.get.remote()).get(number, default)
    except (ray.exceptions.RayError, TimeoutError):
        return default
