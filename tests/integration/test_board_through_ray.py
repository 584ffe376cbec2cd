"""The early-stop channel on a real local Ray: a task (another process, as on another machine)
posts stage checkpoints to the TrialBoard actor; the driver reads them and answers; the task
sees the verdict without blocking its own loop. No shared file is involved."""

from __future__ import annotations

import time

import pytest
import ray

from optimizer.driver.ray_runtime import ray_runtime
from optimizer.trial.channel import BoardDriver, TrialBoard

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0)
def staged_task(board, number: int, stages: int) -> dict:
    driver = BoardDriver(board, number, poll_s=0.1)
    try:
        for step in range(1, stages + 1):
            driver.checkpoint(step, {"finished": step * 10, "planned": stages * 10})
            reason = driver.verdict(step, wait_s=10)
            if reason:
                return {"stopped_at": step, "reason": reason}
        return {"stopped_at": None, "reason": ""}
    finally:
        driver.close()


def test_checkpoints_reach_the_driver_and_its_verdict_reaches_the_task():
    with ray_runtime(None):
        board = TrialBoard.remote()
        ref = staged_task.remote(board, 7, 4)
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for step, payload in ray.get(board.take_checkpoints.remote(7)):
                seen.append((step, payload["finished"]))
                # go on after stage 1; stop after stage 2
                board.decide.remote(7, step, "cannot win" if step == 2 else "")
            ready, _ = ray.wait([ref], timeout=0.1)
            if ready:
                break
        result = ray.get(ref)
    assert seen == [(1, 10), (2, 20)]  # each checkpoint read once, in order; none after the stop
    assert result == {"stopped_at": 2, "reason": "cannot win"}
