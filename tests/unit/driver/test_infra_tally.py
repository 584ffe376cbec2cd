"""driver/recovery.InfraTally: three trials in a row failing outside their configuration stop the study;
a full disk that frees up is waited out once, and the trials that ran into the same full disk
beside it (parallel trials) are not counted against the machine."""

import pytest
from optuna.trial import TrialState

from optimizer.driver import recovery as study_mod
from optimizer.engine.failures import Failure
from optimizer.errors import OptimizerError

DISK = Failure("infra", "disk: cannot write x: No space left on device", "free space")
INFRA = Failure("infra", "WorkerCrashedError", "retry")


def test_three_infra_failures_in_a_row_stop_the_study_and_a_measured_trial_resets_the_count():
    tally = study_mod.InfraTally()
    tally.count((TrialState.FAIL, INFRA), 0.0, None, None)
    tally.count((TrialState.FAIL, INFRA), 0.0, None, None)
    tally.count((TrialState.COMPLETE, None), 0.0, None, None)
    tally.count((TrialState.PRUNED, None), 0.0, None, None)
    tally.count((TrialState.FAIL, INFRA), 0.0, None, None)
    tally.count((TrialState.FAIL, INFRA), 0.0, None, None)
    with pytest.raises(OptimizerError, match="3 trials in a row failed"):
        tally.count((TrialState.FAIL, INFRA), 0.0, None, None)


def test_one_full_disk_is_waited_out_once_for_every_trial_that_hit_it(monkeypatch):
    waits = []

    def wait_for_disk(plan, progress):
        waits.append(1)
        return len(waits) == 1  # full the first time; the disk takes writes afterwards

    monkeypatch.setattr(study_mod, "wait_for_disk", wait_for_disk)
    tally = study_mod.InfraTally()
    for started in (1.0, 2.0, 3.0, 4.0):  # four trials side by side, all started before the disk came back
        tally.count((TrialState.FAIL, DISK), started, None, None)
    assert len(waits) == 1 and tally.in_a_row == 0
    # A disk failure from a trial started after the disk came back, on a disk that now takes writes,
    # is the trial's node refusing: it counts.
    import time

    tally.count((TrialState.FAIL, DISK), time.monotonic() + 1, None, None)
    assert tally.in_a_row == 1
