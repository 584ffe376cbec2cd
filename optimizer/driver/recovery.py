"""What goes wrong between trials: a dead driver's trials (queued again through search/enqueue.py),
the baseline queued first, infrastructure failures in a row, and a full disk waited out.
"""

from __future__ import annotations

import math
import time

import optuna

from optimizer import shutdown
from optimizer.driver.plan import Plan, baseline_params
from optimizer.driver.progress import Progress
from optimizer.driver.store.trial_files import is_disk_failure, writable
from optimizer.errors import OptimizerError
from optimizer.record import of_trial
from optimizer.search.enqueue import queue_again, queue_first

MAX_CONSECUTIVE_INFRA = 3


DISK_POLL_S = 5


def recover(study: optuna.Study, previous: dict | None = None) -> int:
    """Trials a dead driver left RUNNING: FAIL them (infra) and queue their parameters again, once:
    a configuration lost with the driver twice in a row (it may be what kills the machine) is not."""
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    who = f"pid {previous.get('pid')} on {previous.get('host')}" if previous else "a previous driver"
    lost = (previous or {}).get("storage_lost")
    for t in stale:
        of_trial.write_failure_stored(study, t, "infra", f"the storage was lost while this trial ran ({lost})" if lost
                                      else f"the driver ({who}) died while this trial ran",
                                      "nothing to fix in the configuration: it is queued again")
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        queue_again(study, t, always=of_trial.retry_reason(t) != "driver_lost", reason="driver_lost")
    return len(stale)


def ensure_baseline(study: optuna.Study, plan: Plan) -> None:
    """Queue the baseline first, then the configured warm starts (once per study: search/enqueue.py)."""
    queue_first(study, baseline_params(plan), plan.cfg.enqueue)


class InfraTally:
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
            if wait_for_disk(plan, progress):
                self.disk_back_at = time.monotonic()
                return  # the disk was full and is freed: not the machine failing trials
        self.in_a_row = self.in_a_row + 1 if state == optuna.trial.TrialState.FAIL else 0
        if self.in_a_row >= MAX_CONSECUTIVE_INFRA:
            raise OptimizerError(f"{self.in_a_row} trials in a row failed for reasons outside the configuration "
                                 "(failure_kind infra or replay_invalid); fix the machine and re-run to resume")


def wait_for_disk(plan: Plan, progress: Progress) -> bool:
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
