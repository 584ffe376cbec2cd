"""A trial polls the driver's verdict only when the driver may give one (early stop on): an idle
poll is Ray traffic from the replaying process for nothing."""

import threading

from optimizer.trial.channel import BoardDriver
from optimizer.trial.spec import TrialSpec
from optimizer.workload import Workload


def spec(**kw) -> TrialSpec:
    return TrialSpec(number=1, model="m", params={}, vllm_args=(), workload=Workload("w", (), (), None),
                     log_path="x", **kw)


def test_a_trial_hears_the_driver_only_when_it_may_answer():
    assert spec(stages=4).hears_driver  # stage checkpoints, judged by the driver
    assert spec(mode="goodput", stop_on_slo=True).hears_driver  # the capacity probe's verdict
    assert not spec(stages=0, stop_on_slo=False).hears_driver  # early stop off
    assert not spec(mode="goodput", stop_on_slo=False).hears_driver
    assert not spec(stages=0, stop_on_slo=True).hears_driver  # replay mode: SLO cuts are the trial's own


def test_a_driver_that_does_not_listen_starts_no_thread_and_answers_go_on():
    before = threading.active_count()
    driver = BoardDriver(board=None, number=1, listen=False)
    assert threading.active_count() == before
    assert driver.stop_reason() == "" and driver.verdict(0, wait_s=0.01) == ""
    driver.close()
