"""Measurements outside the Optuna loop (confirmation's re-runs, the minimal change's, sensitivity's
moves): one full run of a configuration as a Ray task, no early stop, stopped cleanly on a signal.
These are the runs the noise is pooled over, so a run other processes disturbed
(measure/interference.py) is measured again rather than counted; disturbed on every try, it counts
as a run that failed, and the console says why.
"""

from __future__ import annotations

import socket
import time
from contextlib import contextmanager
from dataclasses import replace

import ray
from rich.markup import escape

from optimizer import shutdown
from optimizer.driver import poll
from optimizer.driver import tell as outcome
from optimizer.driver.launch import make_spec
from optimizer.driver.plan import Plan
from optimizer.driver.poll import note_server, phase_of, stop_task, stop_tasks
from optimizer.driver.progress import Progress
from optimizer.driver.ray_runtime import ray_runtime, run_trial
from optimizer.driver.resources import ray_resources
from optimizer.driver.store.driver_lock import RunState
from optimizer.driver.store.trial_files import store_trial
from optimizer.engine.failures import without_fp8_remedy
from optimizer.measure.interference import disturbance
from optimizer.measure.slo import holds as slo_holds
from optimizer.trial.channel import TrialBoard
from optimizer.trial.spec import TrialSpec, lost_trial_result

CONFIRM_KEY = 1_000_000  # re-measurements post on the board under keys no trial number reaches
DISTURBED_TRIES = 3  # a run disturbed by other processes (measure/interference.py) is measured again, this often at most


@contextmanager
def measuring(plan: Plan, progress: Progress):
    """For measurements outside a study's loop (cli/sensitivity.py): the storage's run-state held, Ray up
    and a board; yields `measure(params, key, log_dir) -> value or None` (measure_once)."""
    with RunState(plan.storage_url, plan.cfg.artifacts_dir, plan.cfg.study_name) as held:
        progress.recovery(held.acquire())
        plan = replace(plan, server_env=tuple(held.server_env().items()))
        with ray_runtime(plan.cfg.ray.address, on_start=held.record_ray):
            board = TrialBoard.remote()
            yield lambda params, key, log_dir: measure_once(plan, params, key, log_dir, board, progress, held)


def measure_once(plan: Plan, params: dict, key: int, log_dir: str, board, progress: Progress,
                 runstate: RunState, within_slos: bool = False) -> float | None:
    """One full measurement of `params` outside the Optuna loop (no early stop), its files stored in
    artifacts/<study>/<log_dir>/; the objective's value, or None if the run failed (or, with
    `within_slos`, missed a replay objective's SLOs)."""
    spec = make_spec(key, plan, params, log_dir, early_stop=False)
    for attempt in range(1, DISTURBED_TRIES + 1):
        result = run_task(spec, plan, board, progress, runstate)
        result = replace(result, failure=without_fp8_remedy(result.failure, plan.device.fp8_kv))
        store_trial(plan.artifacts / log_dir, params, result, socket.gethostname())
        why = disturbance(result.replay_cpu) if result.failure is None else ""
        if not why:
            break
        if attempt == DISTURBED_TRIES:
            progress.note(f"{log_dir}: disturbed on all {attempt} tries ({escape(why)}): not counted; stop what "
                          "else runs on the machine and run again")
            return None
        progress.note(f"{log_dir}: disturbed ({escape(why)}): measured again, not pooled")
    if result.failure is not None or result.early_stop or outcome.unscored_errors(result, plan.objective):
        return None
    if within_slos and plan.objective.mode == "replay" and not slo_holds(plan.objective.slos, result.metrics):
        return None
    try:
        return plan.objective.score(result.metrics)
    except ValueError:
        return None


def run_task(spec: TrialSpec, plan: Plan, board, progress: Progress, runstate: RunState):
    """Run one measurement outside the Optuna loop (re-measurements), stopping cleanly on a signal."""
    ref = run_trial.options(**ray_resources(plan, spec.params)).remote(spec, board)
    started = time.monotonic()
    key = f"{plan.cfg.study_name}/{spec.number}"
    try:
        with shutdown.polling():
            while True:
                ready, _ = ray.wait([ref], timeout=1.0)
                if ready:
                    return ray.get(ref)  # finished: a stop signal now must not throw it away
                shutdown.check()
                progress.phase(spec.number, phase_of(board, spec.number, "queued"), time.monotonic() - started)
                note_server(board, spec.number, key, runstate, plan)
    except ray.exceptions.RayError as exc:
        with shutdown.deferred():  # a signal now must not cut the reaping short
            progress.note(poll.lost_server_note(exc, stop_task(ref, plan, board, spec.number, runstate, key,
                                                               settle=poll.GUARD_SETTLE_S)))
        return lost_trial_result(spec.number, exc, phase_of(board, spec.number))
    except BaseException:
        with shutdown.deferred():
            stop_tasks([(ref, key, f"re-measurement {spec.number}")], runstate, progress)
        raise
    finally:
        runstate.remove_server(key)
